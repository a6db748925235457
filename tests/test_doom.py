"""The ViZDoom co-op env: real engines in real lockstep games over loopback, at the smallest
resolution and with episodes of a few dozen tics."""
import glob
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test

from marlkit.config import ConfigError, RunnerConfig, resolve
from marlkit.envs.doom import DoomConfig, DoomCoopEnv, DoomPlayerError, RewardWeights
from marlkit.envs.doom import match as match_module
from marlkit.envs.doom.rewards import AMMO, player_stats, reward_parts
from marlkit.envs.doom.worker import VARIABLES
from marlkit.envs.factory import make_env_vector

SHORT = {"episode_timeout": 40, "frame_skip": 2}   # 20 steps an episode
ACTIONS = [[], ["ATTACK"], ["MOVE_FORWARD", "TURN_LEFT"]]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:   # gone, even while being read
        return False


def process_group(pgid: int) -> list[int]:
    """Live members of a process group: a player's worker and its engine."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:   # gone, even while being read
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(entry))
    return out


def match_pids(env: DoomCoopEnv) -> list[int]:
    """Every worker of the match with its engine (each player is a process group of its own)."""
    pids = [pid for worker in env.match.pids() for pid in process_group(worker)]
    assert len(pids) == 2 * env.cfg.players, f"expected a worker and an engine per player, found {pids}"
    return pids


def gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _ours(pid: int) -> bool:
    """Whether the process is this one or one of its descendants."""
    while pid > 1:
        if pid == os.getpid():
            return True
        pid = _ppid(pid)
    return False


def work_folders() -> dict[str, tuple[int, int]]:
    """The matches' work folders in the temp directory: name -> (pid, start time) of the process
    that made it."""
    names = {e: match_module._WORK_NAME.fullmatch(e) for e in os.listdir(tempfile.gettempdir())}
    return {e: (int(m[1]), int(m[2])) for e, m in names.items() if m}


@pytest.fixture(autouse=True)
def no_work_folder_left():
    """No test leaves a match's work folder in the temp directory, a killed process's included (its
    keeper removes it within seconds). Folders of running matches that are not this process's own
    (another test session's) are not its business."""
    before = work_folders()
    yield
    deadline = time.monotonic() + 6.0
    while True:
        left = [f for f, (pid, started) in work_folders().items()
                if f not in before and (match_module._started(pid) != started or _ours(pid))]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, f"work folders left in {tempfile.gettempdir()}: {left}"


def shared_memory_in_use() -> set[str]:
    """The files under /dev/shm that a live process holds open or mapped (another test's engines
    included): a file of a killed engine that nobody released is held by no one."""
    held = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            held.update(line.split()[-1] for line in (proc / "maps").read_text().splitlines()
                        if "/dev/shm/" in line)
            held.update(os.readlink(fd) for fd in (proc / "fd").iterdir() if "/dev/shm/" in os.readlink(fd))
        except OSError:
            continue
    return held


def shared_memory_leaked(before: set[str], within: float = 5.0) -> set[str]:
    """The ViZDoom files in /dev/shm that are new since ``before`` and that no live process holds,
    asked again for up to ``within`` seconds until there are none. A game that another test closes
    meanwhile unmaps its files a moment before it unlinks them, and one it starts creates them a
    moment before it maps them, so a file seen free once may be passing; a leaked file stays."""
    deadline = time.monotonic() + within
    while True:
        files = set(glob.glob("/dev/shm/ViZDoom*")) - before
        leaked = {f for f in files - shared_memory_in_use() if os.path.exists(f)}
        if not leaked or time.monotonic() > deadline:
            return leaked
        time.sleep(0.25)


def doom_of(env) -> DoomCoopEnv:
    """The ParallelEnv inside marlkit's wrappers and adapter."""
    while not isinstance(env, DoomCoopEnv):
        env = env.env
    return env


def random_actions(env, rng) -> dict:
    return {a: int(rng.integers(env.action_space(a).n)) for a in env.agents}


@pytest.fixture
def env2():
    env = DoomCoopEnv(players=2, actions=ACTIONS, **SHORT)
    yield env
    env.close()


def test_parallel_api_test_passes(env2):
    parallel_api_test(env2, num_cycles=200)


def test_observations_actions_and_game_variables(env2):
    obs, infos = env2.reset(seed=3)
    assert env2.agents == ["player_0", "player_1"]
    for a in env2.agents:
        assert obs[a].shape == (1, 120, 160) and obs[a].dtype == np.uint8
        assert env2.observation_space(a).contains(obs[a])
        assert env2.action_space(a).n == len(ACTIONS)
        assert {"health", "ammo", "kills", "deaths", "damage"} <= set(infos[a])
        assert infos[a]["health"] == 100 and infos[a]["deaths"] == 0 and infos[a]["kills"] == 0
    assert np.abs(obs["player_0"].astype(int) - obs["player_1"].astype(int)).mean() > 1, \
        "the two players see the same screen: they did not get separate starts"
    state = env2.state()
    assert state.shape == env2.state_space.shape and state.dtype == np.float32
    # The action table reaches the engine: ATTACK (action 1) spends pistol ammo, a no-op does not.
    start = [infos[a]["ammo"] for a in env2.agents]
    for _ in range(12):
        _, _, _, _, infos = env2.step({"player_0": 1, "player_1": 0})
    assert infos["player_0"]["ammo"] < start[0]
    assert infos["player_1"]["ammo"] == start[1]


def test_action_table_from_buttons_and_combinations():
    cfg = DoomConfig(buttons=["ATTACK", "MOVE_FORWARD", "TURN_LEFT"], actions=ACTIONS)
    assert cfg.action_table() == [[0, 0, 0], [1, 0, 0], [0, 1, 1]]
    default = DoomConfig(buttons=["ATTACK", "TURN_LEFT"])
    assert default.action_table() == [[0, 0], [1, 0], [0, 1]]    # no-op, then each button alone
    with pytest.raises(ConfigError, match=r"env.actions\[1\].*JUMP"):
        DoomConfig(buttons=["ATTACK"], actions=[[], ["JUMP"]])
    with pytest.raises(ConfigError, match="unknown button 'ATACK'.*ATTACK"):
        DoomCoopEnv(buttons=["ATACK"], **SHORT)


def _vars(**per_player) -> np.ndarray:
    """``[N, V]`` game variables; ``per_player[name]`` lists the value of each player."""
    n = len(next(iter(per_player.values())))
    v = np.zeros((n, len(VARIABLES)))
    v[:, VARIABLES.index("HEALTH")] = 100
    for name, values in per_player.items():
        v[:, VARIABLES.index(name)] = values
    return v


def test_reward_from_game_variable_changes_keeps_player_and_shared_parts_apart():
    w = RewardWeights(kills=1.0, team_kills=0.5, damage=0.01, deaths=-1.0, health=0.1, ammo=0.5)
    before = _vars(KILLCOUNT=[3, 3], KILLS=[2, 0], DAMAGECOUNT=[0, 40], DEATHCOUNT=[0, 0], HEALTH=[100, 30],
                   AMMO2=[10, 10])
    after = _vars(KILLCOUNT=[6, 6], KILLS=[4, 0], DAMAGECOUNT=[30, 40], DEATHCOUNT=[0, 1], HEALTH=[90, 100],
                  AMMO2=[8, 50])
    player, shared = reward_parts(before, after, w)
    assert shared == 0.5 * 2                                # the team's kills: player 0's two; the level's third
    # player 0: 2 kills of its own, 30 damage dealt, lost 10 health, spent 2 ammo; player 1 died
    # (its health and ammo jumped back to their start values on respawn, which is no reward)
    np.testing.assert_allclose(player, [2.0 + 0.3 - 1.0 - 1.0, -1.0], rtol=1e-6)
    assert player_stats(after[0], before[0])["kills"] == 2 and player_stats(after[0], before[0])["level_kills"] == 3
    # without env.own_kills every player reads the level's count as its kills: the team counts it once
    level = _vars(KILLCOUNT=[3, 3], KILLS=[3, 3]), _vars(KILLCOUNT=[6, 6], KILLS=[6, 6])
    assert reward_parts(*level, w, own_kills=False)[1] == 0.5 * 3
    # the engine's odd health reading of a dead player is clipped
    dead = _vars(HEALTH=[-999900, 100], DEAD=[1, 0])
    player, _ = reward_parts(dead, _vars(HEALTH=[-999900, 100], DEAD=[1, 0]), w)
    np.testing.assert_array_equal(player, [0.0, 0.0])
    assert player_stats(after[1], before[1])["deaths"] == 1 and player_stats(after[0], before[0])["damage"] == 30


def test_rewards_in_a_real_game_add_up_to_the_game_variables():
    """Every step's reward is the player's part plus the shared part, the shared part is the same for
    everyone, and over an episode they add up to the changes in the counters seen in info and in
    the ammo of every kind (a player walking over a box of shells gains ammo of another weapon)."""
    w = RewardWeights(kills=1.0, team_kills=0.5, damage=0.01, deaths=-1.0, health=0.0, ammo=0.5)
    env = DoomCoopEnv(players=2, actions=ACTIONS, reward=w, **SHORT)
    try:
        _, infos = env.reset(seed=0)
        first = {a: dict(infos[a]) for a in env.agents}
        first_ammo = env._vars[:, AMMO].sum(1)
        totals = {a: 0.0 for a in env.possible_agents}
        shared_total = 0.0
        while env.agents:
            _, rewards, _, _, infos = env.step({"player_0": 1, "player_1": 2})   # player_0 keeps firing
            shares = {infos[a]["reward_shared"] for a in env.possible_agents}
            assert len(shares) == 1
            shared_total += shares.pop()
            for a in env.possible_agents:
                assert rewards[a] == pytest.approx(infos[a]["reward_player"] + infos[a]["reward_shared"])
                totals[a] += rewards[a]
        ammo = env._vars[:, AMMO].sum(1) - first_ammo
        d = {a: {k: infos[a][k] - first[a][k] for k in ("kills", "damage", "deaths")} for a in env.possible_agents}
        assert shared_total == pytest.approx(0.5 * sum(d[a]["kills"] for a in env.possible_agents))
        for i, a in enumerate(env.possible_agents):
            assert d[a]["deaths"] == 0   # a respawn refills ammo, which the reward leaves out: not this test's case
            assert totals[a] - shared_total == pytest.approx(d[a]["kills"] + 0.01 * d[a]["damage"] + 0.5 * ammo[i])
        assert totals["player_0"] - shared_total < 0          # firing cost ammo: the player part saw it
        assert env.last_episode["player_0"]["ammo"] == infos["player_0"]["ammo"]
    finally:
        env.close()


DEFEND = {"scenario": "defend_the_center.cfg", "buttons": ["ATTACK", "TURN_LEFT", "TURN_RIGHT"],
          "actions": [[], ["ATTACK"]], "episode_timeout": 2100}


@pytest.mark.slow
def test_without_respawn_a_dead_player_is_out_until_the_last_one_dies():
    """``respawn: false``: a player that dies is terminated and leaves ``agents`` (its engine idles
    in lockstep), and the episode ends when the last player dies; the info counters are episode
    totals although the engine's death, damage and hit counters run on over the whole match."""
    env = DoomCoopEnv(players=2, respawn=False, **DEFEND)
    try:
        parallel_api_test(env, num_cycles=50)
        for episode in range(2):
            _, infos = env.reset(seed=episode)
            assert {infos[a]["deaths"] for a in env.agents} == {0.0}
            ended, step = {}, 0
            while env.agents:
                acting = list(env.agents)
                obs, rewards, term, trunc, infos = env.step({a: int(a == "player_0") for a in acting})
                step += 1
                assert set(obs) == set(rewards) == set(term) == set(infos) == set(acting)
                for a in acting:
                    if term[a] or trunc[a]:
                        ended[a] = (step, term[a], infos[a]["deaths"], infos[a]["dead"])
                        assert a not in env.agents
                    else:
                        assert a in env.agents and not infos[a]["dead"]
                for a in ended:   # out players stay dead: nothing respawns them
                    assert env._vars[env._index[a], VARIABLES.index("DEAD")] == 1
            # both died before the timeout, each exactly once in this episode
            assert ended.keys() == {"player_0", "player_1"}, ended
            assert all(term and deaths == 1 and dead for _, term, deaths, dead in ended.values()), ended
            assert max(step for step, *_ in ended.values()) < 2100 // env.cfg.frame_skip
            assert env.last_episode["player_1"]["deaths"] == 1
            stats = env.episode_stats()     # the team's numbers, as the runner logs them
            assert stats["deaths"] == 2 and stats["kills"] == sum(p["kills"] for p in env.last_episode.values())
            assert stats["hits"] == sum(p["hits"] for p in env.last_episode.values())
    finally:
        env.close()


def test_the_kill_that_ends_an_episode_is_rewarded():
    """basic.cfg's level ends when its one monster dies; ViZDoom has no state after the end, yet the
    kill must reach its killer's reward, once, and the episode's stats. The level ends in the step
    of the kill or in the next one (the end can fall a tic after the kill, past the step's frame skip)."""
    env = DoomCoopEnv(scenario="basic.cfg", players=2, respawn=False, buttons=["ATTACK", "MOVE_LEFT", "MOVE_RIGHT"],
                      actions=[[], ["ATTACK"], ["MOVE_LEFT"], ["MOVE_RIGHT"]], episode_timeout=300,
                      reward=RewardWeights(kills=1.0, damage=0.0, deaths=0.0))   # the reward is the player's kills
    rng = np.random.default_rng(0)
    try:
        env.reset(seed=100)   # an episode cut from outside (a step limit) while players are in it
        env.step({a: 0 for a in env.agents})
        assert env.agents and env.episode_stats() == {"kills": 0.0, "deaths": 0.0, "damage": 0.0, "hits": 0.0,
                                                      "kills_player_0": 0.0, "kills_player_1": 0.0,
                                                      "level_kills": 0.0, "restarts": 0.0}
        for episode in range(80):   # random play kills in about 9 episodes of 10
            env.reset(seed=episode)
            paid = {a: 0.0 for a in env.agents}
            while env.agents:
                _, rewards, term, _, infos = env.step({a: int(rng.integers(4)) for a in env.agents})
                for a in rewards:
                    paid[a] += rewards[a]
            if all(term.values()):   # the monster died: the level ended
                break
        else:
            pytest.fail("no episode of 80 ended with the kill")
        stats = env.episode_stats()
        killer = max(env.possible_agents, key=lambda a: stats[f"kills_{a}"])
        assert stats["kills"] == stats["level_kills"] == stats[f"kills_{killer}"] == 1
        assert paid[killer] == 1.0 and sum(paid.values()) == 1.0
    finally:
        env.close()


@pytest.mark.slow
def test_each_player_is_credited_with_its_own_kills_and_infighting_with_none():
    """defend_the_center without respawns: player_0 turns and fires, player_1 never fires; every
    kill of the team is player_0's. deathmatch.cfg with both players idle: the monsters kill each
    other, which the level counts and no player is credited with (an idle player's only kills are
    telefrags, on a respawn onto a monster). A network game is not replayed by its seed: the same
    seed gave 4 to 22 kills by monsters in an episode, so any of them (a count that credited the
    level's kills to the players would show none) is the evidence."""
    fire = {"buttons": ["ATTACK", "TURN_LEFT"], "actions": [[], ["TURN_LEFT", "ATTACK"]]}
    env = DoomCoopEnv(scenario="defend_the_center.cfg", players=2, respawn=False, episode_timeout=1050, **fire)
    try:
        for episode in range(2):
            env.reset(seed=episode)
            while env.agents:
                env.step({a: int(a == "player_0") for a in env.agents})
            stats = env.episode_stats()
            assert stats["kills_player_0"] > 0 and stats["kills_player_1"] == 0, stats
            assert stats["kills"] == stats["kills_player_0"] and stats["level_kills"] >= stats["kills"]
    finally:
        env.close()
    env = DoomCoopEnv(scenario="deathmatch.cfg", players=2, episode_timeout=2100, **fire)
    try:
        env.reset(seed=0)
        while env.agents:
            _, _, _, _, infos = env.step({a: 0 for a in env.agents})
        stats = env.episode_stats()
        assert stats["damage"] == 0 and stats["level_kills"] > stats["kills"], stats
        assert all(stats[f"kills_{a}"] <= infos[a]["deaths"] for a in env.possible_agents), (stats, infos)
    finally:
        env.close()


@pytest.mark.slow
def test_episodes_start_after_the_screen_wipe():
    """A network game opens every episode with ZDoom's screen wipe, a mostly white screen for about
    2 s; the first observation comes after it (episode_start_time)."""
    brightness = {}
    for start in (0, 70):
        env = DoomCoopEnv(players=2, scenario="defend_the_center.cfg", episode_start_time=start, **SHORT)
        try:
            brightness[start] = [float(np.mean([o.mean() for o in env.reset(seed=e)[0].values()])) for e in range(2)]
        finally:
            env.close()
    assert min(brightness[0]) > 150 and max(brightness[70]) < 110, brightness   # the map is grey, the wipe white
    assert DoomConfig().episode_start_time == 70


@pytest.mark.slow
def test_four_players_end_their_episode_together_and_render_side_by_side():
    env = DoomCoopEnv(players=4, render_mode="rgb_array", **SHORT)
    try:
        obs, _ = env.reset(seed=1)
        assert sorted(obs) == [f"player_{i}" for i in range(4)]
        rng = np.random.default_rng(0)
        steps = 0
        while env.agents:
            obs, _, term, trunc, _ = env.step(random_actions(env, rng))
            steps += 1
        assert steps == 40 // 2 and all(trunc.values()) and not any(term.values())
        frame = env.render()
        assert frame.shape == (120, 4 * 160, 3) and frame.dtype == np.uint8
        np.testing.assert_array_equal(frame[:, 160:320, 0], obs["player_1"][0])
        assert env.state().shape == (4 * 8 + 1,)
    finally:
        env.close()


def test_screens_state_rgb_and_wrappers_through_a_vector_env():
    cfg = replace(resolve("MAPPO", "doom_coop").env, grayscale=False, state="screens", resize=[30, 40],
                  frame_stack=2, **SHORT)
    venv = make_env_vector(cfg, RunnerConfig(vectorize="sync"), 1)
    try:
        ob = venv.reset(seed=0)
        assert ob.obs["agents"].shape == (1, 2, 2 * 3, 30, 40) and ob.obs["agents"].dtype == np.uint8
        assert ob.state.shape == (1, 2 * 3, 30, 40) and ob.state.dtype == np.uint8
        res = venv.step({"agents": np.zeros((1, 2), np.int64)})
        assert res.next.obs["agents"].shape == (1, 2, 6, 30, 40)
    finally:
        venv.close()


@pytest.mark.slow
def test_every_env_of_two_vector_envs_runs_on_its_own_port():
    cfg = replace(resolve("MAPPO", "doom_coop").env, resize=[30, 40], frame_stack=1, **SHORT)
    venvs = [make_env_vector(cfg, RunnerConfig(vectorize="sync"), 2) for _ in range(2)]
    try:
        raws = [doom_of(e) for v in venvs for e in v.venv.envs]
        ports = [r.match.current_port for r in raws]
        assert len(set(ports)) == 4 and None not in ports
        assert [r.index for r in raws] == [0, 1, 0, 1]
        for v in venvs:
            v.reset(seed=0)
        for _ in range(5):
            for v in venvs:
                v.step({"agents": np.ones((2, 2), np.int64)})
    finally:
        for v in venvs:
            v.close()


def test_a_fixed_base_port_gives_env_i_port_plus_i():
    base = match_module.free_port()
    env = DoomCoopEnv(DoomConfig(port=base, **SHORT), index=1)
    try:
        assert env.match.current_port == base + 1
    finally:
        env.close()


@pytest.mark.slow
def test_with_a_fixed_base_port_evaluation_envs_take_the_ports_after_the_training_envs(tmp_path, monkeypatch):
    """Training and evaluation envs are open at once; with ``env.port`` fixed, evaluation env i is
    numbered after the training envs (port base + parallels + i) instead of colliding with them."""
    import marlkit
    started = []
    real_start = match_module.DoomMatch._start_once
    monkeypatch.setattr(match_module.DoomMatch, "_start_once", lambda self, port: (started.append(port),
                                                                                     real_start(self, port))[1])
    base = match_module.free_port()
    result = marlkit.run(agent="MAPPO", env="doom_coop", mode="benchmark", seed=1, logger="none", **{
        **{f"env.{k}": v for k, v in SHORT.items()}, "env.port": base, "env.resize": [30, 40],
        "env.frame_stack": 1, "runner.parallels": 2, "runner.vectorize": "sync", "runner.horizon": 8,
        "runner.total_steps": 16, "runner.eval_interval": 16, "runner.eval_episodes": 1,
        "runner.eval_parallels": 1, "runner.progress": False, "runner.run_root": str(tmp_path)})
    assert started == [base, base + 1, base + 2]          # two training envs, then the evaluation env
    assert [e["step"] for e in result.evaluations] == [0, 16]


@pytest.mark.slow
def test_a_port_taken_before_the_host_binds_it_is_retried(monkeypatch, caplog):
    """Where matches share the machine's network (the system allows them no namespace of their
    own), the host engine crashes when its port is taken; the match starts again on another port."""
    monkeypatch.setattr(match_module, "_shared_because", "no network namespaces here")
    before = set(glob.glob("/dev/shm/ViZDoom*"))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("0.0.0.0", 0))
        busy = taken.getsockname()[1]
        picks = iter([busy])
        real = match_module.free_port
        monkeypatch.setattr(match_module, "free_port", lambda: next(picks, None) or real())
        with caplog.at_level(logging.WARNING, logger="marlkit.doom"):
            env = DoomCoopEnv(players=2, **SHORT)
        try:
            assert not env.match.isolated and env.match.current_port not in (None, busy)
            assert f"did not start on port {busy}" in caplog.text
            env.reset(seed=0)
            env.step({a: 0 for a in env.agents})
        finally:
            env.close()
    # the failed start's engines were killed: their shared memory went with the match's folder (the
    # files of engines that other tests run meanwhile are held by those engines)
    assert shared_memory_leaked(before) == set()


HOLDER = """
import mmap, os, sys, time
fds = [os.open(path, os.O_CREAT | os.O_RDWR, 0o600) for path in sys.argv[1:]]
for fd in fds:
    os.ftruncate(fd, 4096)
maps = [mmap.mmap(fds[0], 4096)]   # the first file mapped and closed, as a queue once created
os.close(fds[0])
print("ready", flush=True)
time.sleep(60)
"""


def _hold(*paths: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, *paths], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline() == b"ready\n"
    return proc


def test_closing_a_match_releases_the_queues_a_player_holds_before_its_engine_is_on_record(tmp_path):
    """A controller creates its two queues before its engine's launcher records the instance id, so a
    player killed in between leaves them with no id to release (seen as a leak when a failed start
    was closed at that moment). Closing a match stops each player's group, reads the files its
    processes hold, mapped or open, kills it and unlinks them; a file held outside the group stays."""
    name = f"test{os.getpid()}x"
    ours = [f"/dev/shm/ViZDoomMQCtr{name}", f"/dev/shm/ViZDoomMQDoom{name}"]
    other = f"/dev/shm/ViZDoomSM{name}other"
    player, bystander = _hold(*ours), _hold(other)
    try:
        match = match_module.DoomMatch(match_module.PlayerSettings(0, 1, 0, "", str(tmp_path)))
        match.pgids = [player.pid]
        match.close(grace=0.0)
        assert player.wait(5) == -signal.SIGKILL
        assert [os.path.exists(p) for p in ours] == [False, False]
        assert os.path.exists(other) and bystander.poll() is None
    finally:
        for proc in (player, bystander):
            proc.kill()
            proc.wait()
        for path in [*ours, other]:
            if os.path.exists(path):
                os.unlink(path)


def test_engine_files_never_land_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = DoomCoopEnv(players=2, **SHORT)
    work_dir = Path(env.match.work_dir)
    env.reset(seed=0)
    env.step({a: 0 for a in env.agents})
    # the engines wrote their files, but here, each in a directory of its own (two engines creating
    # one _vizdoom/ side by side race, and the loser crashes)
    assert [(work_dir / f"player_{i}" / "_vizdoom").is_dir() for i in range(2)] == [True, True]
    env.close()
    assert list(tmp_path.iterdir()) == []
    assert not work_dir.exists()


def test_close_leaves_no_process(env2):
    pids = match_pids(env2)
    env2.close()
    assert gone_within(pids, 5)


def test_a_killed_player_is_an_error_naming_env_and_player():
    env = DoomCoopEnv(DoomConfig(players=2, **SHORT), index=3)
    try:
        env.reset(seed=0)
        pids = match_pids(env)
        os.kill(env.match.pids()[1], signal.SIGKILL)
        with pytest.raises(DoomPlayerError, match=r"env 3: player_1 \(pid \d+\) died with exit code -9"):
            for _ in range(5):
                env.step({a: 0 for a in env.agents})
        assert gone_within(pids, 5)
    finally:
        env.close()


@pytest.mark.slow
def test_a_hung_player_is_an_error_within_the_player_timeout():
    assert DoomConfig().player_timeout <= 10
    env = DoomCoopEnv(DoomConfig(players=2, player_timeout=2.0, **SHORT))
    try:
        env.reset(seed=0)
        pids = match_pids(env)
        os.kill(env.match.pids()[1], signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(DoomPlayerError, match=r"env 0: player_1 \(pid \d+\) is stopped and did not answer "
                                                  r"within 2 s while stepping"):
            env.step({a: 0 for a in env.agents})
        assert time.monotonic() - start < 4
        assert gone_within(pids, 5)      # the stopped worker and every spinning engine too
    finally:
        env.close()


@pytest.mark.slow
def test_a_failed_match_restarts_when_asked_and_counts_it(caplog):
    env = DoomCoopEnv(DoomConfig(players=2, restart_on_failure=True, **SHORT))
    try:
        env.reset(seed=0)
        old = match_pids(env)
        os.kill(env.match.pids()[0], signal.SIGKILL)
        with caplog.at_level(logging.WARNING, logger="marlkit.doom"):
            _, rewards, term, trunc, infos = env.step({a: 0 for a in env.agents})
        assert all(trunc.values()) and not any(term.values()) and env.agents == []
        assert infos["player_0"]["restarts"] == 1 and env.episode_stats()["restarts"] == 1
        assert "player_0" in caplog.text and "restarting the match (restart 1 of this env)" in caplog.text
        assert gone_within(old, 5)
        _, infos = env.reset(seed=1)
        assert infos["player_1"]["restarts"] == 1 and env.step({a: 0 for a in env.agents})[0]
    finally:
        env.close()


@pytest.mark.slow
def test_a_doom_benchmark_reports_the_random_policy_with_its_kills(tmp_path, capsys):
    """A short real doom_coop benchmark: the random policy is evaluated once with the same protocol,
    with the env's statistics (kills), and stands in benchmark.json and the summary table."""
    import json

    import marlkit
    result = marlkit.run(agent="MAPPO", env="doom_coop", mode="benchmark", seed=1, logger="none", **{
        **{f"env.{k}": v for k, v in SHORT.items()}, "env.resize": [30, 40], "env.frame_stack": 1,
        "runner.parallels": 1, "runner.vectorize": "sync", "runner.horizon": 8, "runner.total_steps": 8,
        "runner.eval_interval": 8, "runner.eval_episodes": 2, "runner.eval_parallels": 1,
        "runner.progress": False, "runner.run_root": str(tmp_path)})
    report = json.loads((result.run_dir / "benchmark.json").read_text())
    baseline = report["baseline"]
    assert set(baseline["mean"]) == set(baseline["std"]) == set(report["final"]["mean"])
    assert {"kills", "deaths"} <= set(baseline["env"]) and baseline["env"]["kills"] >= 0
    assert baseline == result.baseline
    out = capsys.readouterr().out.splitlines()
    assert "random" in next(line for line in out if "eval return of group" in line)
    # the team's kills beside the return: random, final, at best.pt
    kills = next(line for line in out if line.split()[:1] == ["kills"]).split()
    assert [float(v) for v in kills[1::3]] == [round(baseline["env"]["kills"], 3),
                                               round(report["final"]["env"]["kills"], 3),
                                               round(report["best"]["env"]["kills"], 3)]
    assert (result.run_dir / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
