"""The Unity adapter against a real ML-Agents client/server pair: ``UnityEnvironment`` launches the
stand-in under ``tests/unity_standin/`` as the build and they talk gRPC over a loopback socket."""
from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "unity_standin"))
from standin import image as standin_image, masked_choices  # noqa: E402

from marlkit.envs.unity import UnityConfig, UnityEnv  # noqa: E402
from marlkit.config import ConfigError  # noqa: E402
from marlkit.envs.unity.env import UnityEnvError, group_names  # noqa: E402
from forked_cli import run_marlkit

STANDIN = str(Path(__file__).parent / "unity_standin" / "standin")


@pytest.fixture(autouse=True)
def standin_python(monkeypatch):
    monkeypatch.setenv("UNITY_STANDIN_PYTHON", sys.executable)


def standin_pids(tag: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if tag.encode() in cmdline:
                pids.append(int(entry))
    return pids


def make(tmp_path=None, *args, tag: str | None = None, **kwargs) -> tuple[UnityEnv, str]:
    """A stand-in scene; ``tag`` (an extra launch argument) finds its process later."""
    tag = tag or uuid.uuid4().hex
    extra = ["--tag", tag, *args]
    if tmp_path is not None:
        extra += ["--log", str(tmp_path / "actions.jsonl")]
    cfg = UnityConfig(file_name=STANDIN, timeout_wait=kwargs.pop("timeout_wait", 20), additional_args=extra, **kwargs)
    return UnityEnv.from_config(cfg), tag


def agent_ids(env, g: str) -> list[int]:
    return [int(name.rsplit("=", 1)[1]) for name in env.spec.groups[g].agents]


def random_allowed(rng, mask: np.ndarray, nvec=(3, 3, 3)) -> np.ndarray:
    """One allowed choice per branch for every agent of ``mask`` ``[A, sum(nvec)]``."""
    out = np.zeros((len(mask), len(nvec)), np.int64)
    for a, row in enumerate(mask):
        for b, part in enumerate(np.split(row, np.cumsum(nvec)[:-1])):
            out[a, b] = rng.choice(np.flatnonzero(part))
    return out


def read_log(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "actions.jsonl").read_text().splitlines()]


def test_soccer_style_behaviours_map_to_team_groups():
    assert group_names(["SoccerTwos?team=1", "SoccerTwos?team=0"]) == {"SoccerTwos?team=1": "team_1",
                                                                       "SoccerTwos?team=0": "team_0"}
    assert group_names(["Striker?team=0", "Goalie?team=0"]) == {"Striker?team=0": "Striker_team_0",
                                                                 "Goalie?team=0": "Goalie_team_0"}
    assert group_names(["3DBall"]) == {"3DBall": "3DBall"}


def test_spec_slots_and_masks_match_the_scene(tmp_path):
    env, tag = make(tmp_path, "--fields", "2")
    try:
        spec = env.spec
        assert list(spec.groups) == ["team_0", "team_1"]
        assert agent_ids(env, "team_0") == [0, 1, 4, 5] and agent_ids(env, "team_1") == [2, 3, 6, 7]
        gs = spec.groups["team_0"]
        assert gs.obs_shape == (11,) and list(gs.action_space.nvec) == [3, 3, 3] and gs.n_actions == 9
        assert spec.state_shape == (2 * 4 * 11,)
        ob = env.reset()
        for g in spec.groups:
            for slot, agent_id in enumerate(agent_ids(env, g)):
                # sensor 0 then sensor 1, concatenated: [id, field, step, episode, last action x3, 1, team, slot, .5]
                assert ob.obs[g][slot][0] == agent_id and ob.obs[g][slot][8] == int(g[-1])
                expected = np.ones(9, bool)
                for b, c in masked_choices(agent_id, 0):
                    expected[3 * b + c] = False
                np.testing.assert_array_equal(ob.action_mask[g][slot], expected)
        np.testing.assert_array_equal(ob.state, np.concatenate([ob.obs["team_0"].ravel(), ob.obs["team_1"].ravel()]))
    finally:
        env.close()
    assert standin_pids(tag) == []


def test_actions_arrive_unchanged_and_masks_are_honoured(tmp_path):
    env, _ = make(tmp_path, "--decision-period", "2")
    rng = np.random.default_rng(0)
    sent = []
    try:
        ob = env.reset()
        for _ in range(12):
            actions = {g: random_allowed(rng, ob.action_mask[g]) for g in env.spec.groups}
            sent.append({agent_ids(env, g)[s]: actions[g][s].tolist()
                         for g in actions for s in np.flatnonzero(ob.agent_mask[g])})
            ob, *_ = env.step(actions)
    finally:
        env.close()
    log = read_log(tmp_path)
    assert len(log) == 12
    for want, got in zip(sent, log):
        assert {int(k): v["discrete"] for k, v in got["actions"].items()} == want
        assert got["violations"] == 0
    # agents 1 and 3 (field 0: 5-step episodes; decision period 2) act every other step of an episode
    expected = [(t % 5) % 2 == 0 for t in range(12)]
    assert [1 in s for s in sent] == expected and [3 in s for s in sent] == expected
    assert all(0 in s for s in sent)


def test_terminal_and_group_rewards_and_per_agent_episodes(tmp_path):
    """Field 0 ends every 5 steps, field 1 every 7: the ending agents are terminated (goal) or
    truncated (max step, every third episode), carry their final observation, and go on at once in
    their next episode; rewards are the stand-in's 0.01 * sum(action) - 0.001 plus the group reward."""
    env, _ = make(tmp_path, group_reward_weight=0.5)
    rng = np.random.default_rng(1)
    try:
        ob = env.reset()
        ends = 0
        for t in range(1, 16):
            actions = {g: random_allowed(rng, ob.action_mask[g]) for g in env.spec.groups}
            nxt, reward, terminated, truncated, over = env.step(actions)
            assert not over
            for g in env.spec.groups:
                team = int(g[-1])
                for slot, agent_id in enumerate(agent_ids(env, g)):
                    field, length = agent_id // 4, 5 + 2 * (agent_id // 4)
                    ended = t % length == 0
                    expected = 0.01 * actions[g][slot].sum() - 0.001
                    if ended:
                        episode = t // length - 1
                        assert nxt.final is not None
                        final, first = nxt.final.obs[g][slot], nxt.obs[g][slot]
                        assert final[2] == length and final[3] == episode       # last obs of that episode
                        assert first[2] == 0 and first[3] == episode + 1       # already the next one
                        assert nxt.agent_mask[g][slot]                         # and it decides again
                        by_max_step = episode % 3 == 2
                        assert truncated[g][slot] == by_max_step and terminated[g][slot] == (not by_max_step)
                        if not by_max_step:
                            expected += 0.5 * (1.0 if team == episode % 2 else -1.0)
                        ends += 1
                    else:
                        assert not (terminated[g][slot] or truncated[g][slot])
                        if nxt.final is not None:
                            np.testing.assert_array_equal(nxt.final.obs[g][slot], nxt.obs[g][slot])
                    assert reward[g][slot] == pytest.approx(expected, abs=1e-5), (t, g, slot)
            ob = nxt
        assert ends == 3 * 4 + 2 * 4   # field 0 ended at 5, 10, 15 (the third by max step); field 1 at 7, 14
    finally:
        env.close()


def test_flattened_actions_use_the_exact_joint_mask(tmp_path):
    env, _ = make(tmp_path, flatten_actions=True)
    rng = np.random.default_rng(2)
    try:
        assert env.spec.groups["team_0"].action_space.n == 27
        ob = env.reset()
        sent = []
        for _ in range(6):
            actions = {}
            for g in env.spec.groups:
                ids = agent_ids(env, g)
                mask = ob.action_mask[g]
                assert mask.shape == (4, 27)
                for slot, agent_id in enumerate(ids):
                    step = int(ob.obs[g][slot][2])
                    forbidden = masked_choices(agent_id, step)
                    brute = [all((b, c) not in forbidden for b, c in enumerate(np.unravel_index(k, (3, 3, 3))))
                             for k in range(27)]
                    np.testing.assert_array_equal(mask[slot], brute)
                actions[g] = np.array([rng.choice(np.flatnonzero(row)) for row in mask])
            sent.append({agent_ids(env, g)[s]: list(np.unravel_index(actions[g][s], (3, 3, 3)))
                         for g in actions for s in range(4)})
            ob, *_ = env.step(actions)
    finally:
        env.close()
    for want, got in zip(sent, read_log(tmp_path)):
        assert {int(k): v["discrete"] for k, v in got["actions"].items()} == {k: [int(x) for x in v]
                                                                               for k, v in want.items()}
        assert got["violations"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["die", "hang", "never"])
def test_a_broken_scene_is_a_clear_error_within_the_timeout_and_leaves_no_process(fault):
    """Without ``restart_on_failure`` (a scene that never connects is an error either way)."""
    args = {"die": ["--die-after", "2"], "hang": ["--hang-after", "2"], "never": ["--never-connect"]}[fault]
    timeout = 3
    tag = uuid.uuid4().hex
    start = time.monotonic()
    with pytest.raises(UnityEnvError) as info:
        env, _ = make(None, *args, tag=tag, timeout_wait=timeout, restart_on_failure=False)
        for _ in range(5):
            env.step({g: np.zeros((4, 3), np.int64) for g in env.spec.groups})
    elapsed = time.monotonic() - start
    message = str(info.value)
    expected = {"die": "is gone", "hang": f"did not answer within env.timeout_wait={timeout}",
                "never": "did not connect to port"}[fault]
    assert expected in message and "unity env 0" in message
    assert elapsed < 3 * timeout + 10, elapsed
    time.sleep(0.2)
    assert standin_pids(tag) == []


def test_a_missing_build_is_named():
    """Also for an env built directly, which no config check saw: the launch refuses it."""
    with pytest.raises(ConfigError, match="env.file_name='/no/such/build': no Unity build there"):
        UnityEnv(UnityConfig(file_name="/no/such/build", timeout_wait=3))


NOT_A_BUILD = "touch {marker}\n"   # a text file with the run bit: /bin/sh would run it as commands


@pytest.mark.slow
@pytest.mark.parametrize("problem", ["missing", "not executable", "not a build"])
def test_a_bad_build_path_is_a_config_error_in_one_line_before_any_launch(tmp_path, problem):
    """From the command line: exit 2, one line naming env.file_name and the fix, no run directory,
    and nothing of the file run."""
    build, marker = tmp_path / "Game.x86_64", tmp_path / "ran"
    if problem == "not executable":
        build.write_text("#!/bin/sh\nexec sleep 100\n")
    elif problem == "not a build":
        build.write_text(NOT_A_BUILD.format(marker=marker))
        build.chmod(0o755)
    out = run_marlkit(["--agent", "MAPPO", "--env", "unity", "--logger", "none", "--set", f"env.file_name={build}",
                       f"runner.run_root={tmp_path / 'runs'}"], os.environ, timeout=120)
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.strip().splitlines()
    assert f"env.file_name={str(build)!r}" in line
    assert {"missing": "no Unity build there", "not executable": "chmod +x",
            "not a build": "is not a build (neither an executable program nor a script starting with #!)"}[problem] \
        in line, line
    assert not (tmp_path / "runs").exists() and not marker.exists()


def test_a_file_that_is_not_a_build_is_refused_at_launch_too(tmp_path):
    """An env built directly (no config check; or a file changed since): the launch refuses it
    and runs nothing. Programs (ELF) and #! scripts are builds."""
    from marlkit.envs.unity.player import launch_path

    build, marker = tmp_path / "Game.x86_64", tmp_path / "ran"
    build.write_text(NOT_A_BUILD.format(marker=marker))
    build.chmod(0o755)
    with pytest.raises(ConfigError, match=r"is not a build .*point it at the build's executable"):
        UnityEnv(UnityConfig(file_name=str(build), timeout_wait=3))
    time.sleep(0.5)
    assert not marker.exists()
    assert launch_path(sys.executable) == sys.executable and launch_path(STANDIN) == STANDIN


def test_on_a_ray_cluster_training_needs_the_build_on_the_nodes_only():
    """The build is opened where the envs are hosted: in train mode the driver does not look for
    it; --benchmark and --test play on the driver, which then needs it."""
    from marlkit.api import build_config
    train = build_config("MAPPO", "unity", **{"env.file_name": "/only/on/the/nodes", "runner.vectorize": "ray"})
    assert train.env.file_name == "/only/on/the/nodes"
    with pytest.raises(ConfigError, match="no Unity build there"):
        build_config("MAPPO", "unity", mode="benchmark",
                     **{"env.file_name": "/only/on/the/nodes", "runner.vectorize": "ray"})


def test_single_branch_is_discrete_and_continuous_actions_arrive_unchanged(tmp_path):
    env, _ = make(tmp_path, "--branches", "5")
    rng = np.random.default_rng(3)
    try:
        space = env.spec.groups["team_0"].action_space
        assert space.n == 5 and env.spec.groups["team_0"].n_actions == 5
        ob = env.reset()
        sent = []
        for _ in range(4):
            actions = {g: np.array([rng.choice(np.flatnonzero(row)) for row in ob.action_mask[g]])
                       for g in env.spec.groups}
            sent.append({agent_ids(env, g)[s]: [int(actions[g][s])] for g in actions for s in range(4)})
            ob, *_ = env.step(actions)
        # agent ids 0, 2, 4, 6 may not pick choice 2 of branch 0; the others have no forbidden choice
        assert not ob.action_mask["team_0"][0][2] and ob.action_mask["team_0"][1].all()
    finally:
        env.close()
    for want, got in zip(sent, read_log(tmp_path)):
        assert {int(k): v["discrete"] for k, v in got["actions"].items()} == want
        assert got["violations"] == 0

    env, _ = make(tmp_path, "--branches", "", "--continuous", "2")
    try:
        space = env.spec.groups["team_1"].action_space
        assert space.shape == (2,) and env.spec.groups["team_1"].n_actions == 0
        env.reset()
        actions = {g: rng.uniform(-1, 1, (4, 2)).astype(np.float32) for g in env.spec.groups}
        env.step(actions)
    finally:
        env.close()
    got = read_log(tmp_path)[-1]["actions"]
    for g in actions:
        for slot, agent_id in enumerate(agent_ids(env, g)):
            np.testing.assert_array_equal(np.float32(got[str(agent_id)]["continuous"]), actions[g][slot])
            assert got[str(agent_id)]["discrete"] == []


def test_hybrid_actions_arrive_unchanged(tmp_path):
    """Two continuous actions and branches [3, 3, 3] in one behaviour: one float vector per agent,
    continuous values first (clipped to [-1, 1]), then the branch choices."""
    from gymnasium import spaces

    from marlkit.agents.random_policy import RandomAgent

    env, _ = make(tmp_path, "--continuous", "2")
    try:
        gs = env.spec.groups["team_0"]
        assert isinstance(gs.action_space, spaces.Tuple) and gs.n_actions == 9
        ob = env.reset()
        policy = {g: RandomAgent(env.spec.groups[g], env.spec, None, seed=i)
                  for i, g in enumerate(env.spec.groups)}
        sent = []
        for t in range(4):
            actions = {g: p.act(ob.obs[g][None], ob.state[None], ob.agent_mask[g][None], ob.action_mask[g][None],
                                None).actions[0] for g, p in policy.items()}
            if t == 3:
                actions["team_0"][0, 0] = 7.0   # outside the Box: clipped on the way
            sent.append(actions)
            ob, *_ = env.step(actions)
    finally:
        env.close()
    log = read_log(tmp_path)
    for actions, row in zip(sent, log):
        assert row["violations"] == 0
        for g in actions:
            for slot, agent_id in enumerate(agent_ids(env, g)):
                got = row["actions"][str(agent_id)]
                want = actions[g][slot]
                np.testing.assert_array_equal(np.float32(got["continuous"]), np.clip(want[:2], -1, 1))
                assert got["discrete"] == [int(c) for c in want[2:]]
    assert log[3]["actions"]["0"]["continuous"][0] == 1.0


@pytest.mark.parametrize("compression", ["none", "png"])
def test_image_sensors_come_first_and_a_single_one_keeps_its_shape(tmp_path, compression):
    """Cameras arrive channels first, as mlagents-envs decodes them (a PNG as well as raw floats),
    and the group spec says so: the layout and, for several sensors, each sensor's shape."""
    png = ["--png"] if compression == "png" else []
    env, _ = make(tmp_path, "--image", "3x8x10", *png, "--fields", "1")
    try:
        # the image and the vector sensors together: the image first (240 floats), then 8 + 3
        spec = env.spec.groups["team_0"]
        assert spec.obs_shape == (240 + 8 + 3,)
        assert spec.obs_parts == ((3, 8, 10), (8,), (3,)) and spec.channels_last is False
        ob = env.reset()
        image = ob.obs["team_0"][:, :240].reshape(2, 3, 8, 10)
        np.testing.assert_allclose(image[1], standin_image(1, 0, (3, 8, 10)) / 255.0, atol=1e-6)
        assert ob.obs["team_0"][1, 240] == 1 and ob.obs["team_0"][1, 248] == 0   # agent id 1, team 0
    finally:
        env.close()
    env, _ = make(tmp_path, "--image", "3x8x10", *png, "--no-vector", "--fields", "1")
    try:
        spec = env.spec.groups["team_0"]
        assert spec.obs_shape == (3, 8, 10) and spec.obs_parts is None and spec.channels_last is False
        assert env.spec.state_shape == (2 * 2 * 240,)
        ob = env.reset()
        assert ob.obs["team_1"].shape == (2, 3, 8, 10)
        np.testing.assert_allclose(ob.obs["team_1"][1], standin_image(3, 0, (3, 8, 10)) / 255.0, atol=1e-6)
    finally:
        env.close()


def test_pettingzoo_parallel_api(tmp_path):
    """The ParallelEnv view passes PettingZoo's own API test, with masked actions only (checked
    by the stand-in), and hands each agent its terminal reward and final observation."""
    from pettingzoo.test import parallel_api_test

    from marlkit.envs.unity.parallel import UnityParallelEnv

    tag = uuid.uuid4().hex
    env = UnityParallelEnv(file_name=STANDIN, timeout_wait=20,
                           additional_args=["--tag", tag, "--log", str(tmp_path / "actions.jsonl")])
    try:
        parallel_api_test(env, num_cycles=50)
        assert sum(row["violations"] for row in read_log(tmp_path)) == 0
        obs, _ = env.reset()
        assert all(env.observation_space(a).contains(obs[a]) for a in env.agents)
        episode = {a: int(obs[a]["observation"][3]) for a in env.agents}
        finished = {}
        while env.agents:
            actions = {a: env.action_space(a).sample(mask=obs[a]["action_mask"]) for a in env.agents}
            obs, rew, term, trunc, _ = env.step(actions)
            for a in rew:
                if term[a] or trunc[a]:
                    finished[a] = (obs[a]["observation"], rew[a], term[a])
        assert sorted(finished) == sorted(env.possible_agents)
        for a, (final, reward, terminated) in finished.items():
            agent_id, ep = int(a.rsplit("=", 1)[1]), episode[a]
            assert final[2] == 5 + 2 * (agent_id // 4) and final[3] == ep   # the last obs of that episode
            goal = ep % 3 != 2
            assert terminated == goal
            if goal:   # the group reward: +1 to the scoring team, -1 to the other
                assert abs(reward) > 0.9 and (reward > 0) == ((agent_id % 4) // 2 == ep % 2)
            else:
                assert abs(reward) < 0.1
    finally:
        env.close()
    assert standin_pids(tag) == []


def test_each_env_of_a_vector_env_gets_its_own_scene_and_port():
    from marlkit.envs.factory import make_env_vector
    from marlkit.config import RunnerConfig

    tag = uuid.uuid4().hex
    cfg = UnityConfig(file_name=STANDIN, timeout_wait=20, additional_args=["--tag", tag])
    venv = make_env_vector(cfg, RunnerConfig(parallels=2, vectorize="sync"))
    try:
        ports = sorted(env.port for env in venv.venv.envs)
        assert len(set(ports)) == 2 and len(standin_pids(tag)) == 2
        args = [_cmdline(pid).split(b"\0") for pid in standin_pids(tag)]
        launched = sorted(int(a[a.index(b"--mlagents-port") + 1]) for a in args)
        assert launched == ports
        # no_graphics (the default) launches the build headless, as Unity players take it
        assert all(b"-nographics" in a and b"-batchmode" in a for a in args)
    finally:
        venv.close()
    assert standin_pids(tag) == []
    # a fixed base_port: env i listens on base_port + worker_id + i; with graphics, no headless flags
    base = free_base_port(3)
    venv = make_env_vector(UnityConfig(file_name=STANDIN, timeout_wait=20, base_port=base, worker_id=1,
                                       no_graphics=False, additional_args=["--tag", tag]),
                           RunnerConfig(parallels=2, vectorize="sync"))
    try:
        assert [env.port for env in venv.venv.envs] == [base + 1, base + 2]
        args = [_cmdline(pid).split(b"\0") for pid in standin_pids(tag)]
        assert len(args) == 2 and not any(b"-nographics" in a or b"-batchmode" in a for a in args)
    finally:
        venv.close()
    assert standin_pids(tag) == []


@pytest.mark.slow
def test_a_scene_dying_during_training_stops_the_run_with_its_reason_and_leaves_no_process(tmp_path):
    """Subprocess workers, each with its own stand-in; one scene exits after 30 steps, and is not
    relaunched (``restart_on_failure: false``)."""
    import marlkit
    from marlkit.errors import EnvWorkerError

    tag = uuid.uuid4().hex
    start = time.monotonic()
    with pytest.raises(EnvWorkerError) as info:
        marlkit.run(agent="MAPPO", env="unity", logger="none", **{
            "env.file_name": STANDIN, "env.timeout_wait": 5, "env.additional_args": ["--tag", tag, "--die-after", "30"],
            "env.restart_on_failure": False,
            "runner.parallels": 2, "runner.vectorize": "subprocess", "runner.horizon": 16, "runner.total_steps": 640,
            "runner.progress": False, "runner.run_root": str(tmp_path / "runs")})
    message = str(info.value)
    assert "is gone" in message and "while stepping" in message and "unity env" in message, message
    assert time.monotonic() - start < 60
    # the first rollout (2 envs x 16 steps) was done when the scene died in the second: it is kept
    from marlkit.runners.checkpoint import read_steps
    [latest] = (tmp_path / "runs").rglob("latest.pt")
    assert read_steps(latest) == 32
    assert f"the run up to step 32 is saved in {latest}" in " ".join(info.value.__notes__)
    time.sleep(0.5)
    assert standin_pids(tag) == []
    # the env workers (spawned children running multiprocessing's spawn_main) are gone too
    workers = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
               if _parent(pid) == os.getpid() and b"spawn_main" in _cmdline(pid)]
    assert workers == []


def free_base_port(n: int) -> int:
    """A port p with p .. p + n - 1 all free right now."""
    import socket
    for p in range(20000 + os.getpid() % 20000, 65000, n):
        try:
            for port in range(p, p + n):
                with socket.socket() as s:
                    s.bind(("localhost", port))
            return p
        except OSError:
            continue
    raise RuntimeError("no free port range")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_pettingzoo_view_of_hybrid_actions(tmp_path):
    """Hybrid agents act with ``(continuous, branch choices)`` tuples drawn within their masks."""
    from marlkit.envs.unity.parallel import UnityParallelEnv

    env = UnityParallelEnv(file_name=STANDIN, timeout_wait=20,
                           additional_args=["--continuous", "2", "--fields", "1", "--log", str(tmp_path / "actions.jsonl")])
    rng = np.random.default_rng(5)
    try:
        obs, _ = env.reset()
        sent = []
        for _ in range(3):
            actions = {}
            for a in env.agents:
                masks = obs[a]["action_mask"]
                assert len(masks) == 3 and env.observation_space(a).contains(obs[a])
                actions[a] = (rng.uniform(-1, 1, 2).astype(np.float32),
                              np.array([rng.choice(np.flatnonzero(m)) for m in masks]))
                assert env.action_space(a).contains(actions[a])
            sent.append(actions)
            obs, *_ = env.step(actions)
    finally:
        env.close()
    for actions, row in zip(sent, read_log(tmp_path)):
        assert row["violations"] == 0
        for a, (continuous, choices) in actions.items():
            got = row["actions"][a.rsplit("=", 1)[1]]
            np.testing.assert_array_equal(np.float32(got["continuous"]), continuous)
            assert got["discrete"] == choices.tolist()


def test_engine_settings_and_parameters_reach_the_scene(tmp_path):
    side = tmp_path / "side.jsonl"
    env, _ = make(None, "--side-log", str(side), time_scale=7.5, engine={"width": 64, "height": 48.0, "quality_level": 2},
                  parameters={"difficulty": 3})
    env.close()
    got = [json.loads(line) for line in side.read_text().splitlines()]
    assert {"engine": {"time_scale": 7.5}} in got and {"engine": {"width": 64, "height": 48}} in got
    assert {"engine": {"quality_level": 2}} in got and {"parameter": {"difficulty": 3.0}} in got
    with pytest.raises(ConfigError, match="env.engine: set width and height together"):
        make(None, engine={"width": 64})
    with pytest.raises(ConfigError, match=r"env.engine.quality_level=1.5: must be a whole number"):
        make(None, engine={"quality_level": 1.5})
    with pytest.raises(ConfigError, match="env.engine.fov: unknown engine setting"):
        make(None, engine={"fov": 90})


def test_the_editor_is_one_scene_and_settings_that_need_more_fail_before_anything_starts():
    from marlkit.api import build_config
    with pytest.raises(ConfigError, match=r"Unity Editor, which is one scene, but runner.parallels is 2: "
                                          r"set runner.parallels=1"):
        build_config("MAPPO", "unity")                                   # unity.yaml: 2 envs
    with pytest.raises(ConfigError, match="--benchmark needs a second one"):
        build_config("MAPPO", "unity", "benchmark", **{"runner.parallels": 1})
    assert build_config("MAPPO", "unity", **{"runner.parallels": 1}).env.file_name is None
    assert build_config("MAPPO", "unity", "benchmark", **{"env.file_name": STANDIN}).runner.parallels == 2


def test_the_editor_path_waits_for_a_scene_that_connects_by_itself(tmp_path):
    """``file_name: null`` is the Editor: marlkit launches nothing and waits on the port for the
    scene to connect (what pressing Play does). The stand-in, started by hand on that port, plays
    the Editor; closing the env ends its session and it exits, as the Editor stops playing."""
    import subprocess

    from marlkit.envs.unity.env import free_port

    port = free_port()
    editor = subprocess.Popen([STANDIN, "--mlagents-port", str(port), "--log", str(tmp_path / "actions.jsonl")])
    try:
        env = UnityEnv(UnityConfig(file_name=None, base_port=port, timeout_wait=20))
        try:
            assert list(env.spec.groups) == ["team_0", "team_1"]
            ob = env.reset()
            env.step({g: random_allowed(np.random.default_rng(0), ob.action_mask[g]) for g in env.spec.groups})
        finally:
            env.close()
        assert editor.wait(timeout=20) == 0
        assert len(read_log(tmp_path)) == 1
    finally:
        if editor.poll() is None:
            editor.kill()
            editor.wait()
    with pytest.raises(ConfigError, match="is the Unity Editor, which is one env"):
        UnityEnv(UnityConfig(file_name=None), index=1)


# ---------------------------------------------------------------------- start and stop

LAUNCHER = """#!/bin/sh
# a build that starts a child, and neither connects: both note their pid
echo $$ >> {pids}
sleep 100000 &
echo $! >> {pids}
wait
"""


def launcher(tmp_path) -> tuple[str, Path]:
    """A stand-in build that starts a child and never connects, and the file its processes' pids go to."""
    pids = tmp_path / f"pids-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "launcher.sh"
    script.write_text(LAUNCHER.format(pids=pids))
    script.chmod(0o755)
    return str(script), pids


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def launched(pids: Path, n: int, timeout: float = 30.0) -> list[int]:
    """The pids of ``n`` launched processes, once they are all written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = [int(p) for p in pids.read_text().split()] if pids.exists() else []
        if len(got) >= n:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{n} processes were not launched within {timeout} s: {pids}")


def gone_soon(pids: list[int], timeout: float = 5.0) -> list[int]:
    """The processes of ``pids`` still running after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if running(p)]


@pytest.mark.slow
def test_a_build_that_never_connects_is_killed_with_its_children(tmp_path):
    """mlagents killed the build's own process at the timeout, and left the children it started."""
    script, pids = launcher(tmp_path)
    with pytest.raises(UnityEnvError, match="did not connect"):
        UnityEnv(UnityConfig(file_name=script, timeout_wait=2))
    got = launched(pids, 2)
    # killed with its group before the error is raised; on a loaded machine the kill may take a moment
    assert gone_soon(got, timeout=2.0) == []


def _script(tmp_path, body: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text("import sys\nfrom marlkit.envs.unity import UnityConfig, UnityEnv\n" + body)
    return path


def test_a_killed_parent_takes_its_builds_and_their_children_along(tmp_path):
    """SIGKILL of the process holding the env, while the build has not connected: nothing in that
    process runs any more, and the watcher kills the build's process group."""
    import signal
    import subprocess

    script, pids = launcher(tmp_path)
    body = f"UnityEnv(UnityConfig(file_name={script!r}, timeout_wait=120))\n"
    proc = subprocess.Popen([sys.executable, str(_script(tmp_path, body))])
    try:
        got = launched(pids, 2)
        assert all(map(running, got))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert gone_soon(got) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_parent_killed_before_the_build_is_recorded_never_runs_it(tmp_path):
    """SIGKILL between the build's start and its record with the watcher (forced here by dying
    in place of the record): the build never runs its command, so nothing is left unwatched."""
    import subprocess

    script, pids = launcher(tmp_path)
    body = ("import os, signal, subprocess\nfrom marlkit.envs import processes\n"
            "processes._tell = lambda line: os.kill(os.getpid(), signal.SIGKILL)\n"
            f"processes.launch([{script!r}], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n")
    path = tmp_path / "killed.py"
    path.write_text(body)
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == -9, out.stderr
    time.sleep(1.0)   # the launcher would have written its pids by now
    ran = launched(pids, 2) if pids.exists() else []
    for pid in ran:
        os.kill(pid, 9)
    assert ran == []


@pytest.mark.slow
@pytest.mark.parametrize("parallels", [1, 2])
def test_ctrl_c_while_the_builds_connect_leaves_no_build(tmp_path, parallels):
    """Ctrl+C while marlkit waits inside ML-Agents' constructor for the builds to connect (in
    process for one env, in env workers for two): every build and its child are gone when marlkit
    has exited."""
    import signal
    import subprocess

    script, pids = launcher(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "marlkit", "--agent", "MAPPO", "--env", "unity", "--logger", "none",
                             "--set", f"env.file_name={script}", "runner.total_steps=1000", f"runner.parallels={parallels}",
                             f"runner.run_root={tmp_path / 'runs'}", "runner.progress=false"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        got = launched(pids, 2 * parallels)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        out, _ = proc.communicate(timeout=30)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "interrupted before the first checkpoint" in out, out
    assert took < 3, f"{took:.1f} s from Ctrl+C to exit"
    assert [p for p in got if running(p)] == []


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` right now, by the parent ids in /proc."""
    tree: dict[int, list[int]] = {}
    for child in map(int, filter(str.isdigit, os.listdir("/proc"))):
        tree.setdefault(_parent(child), []).append(child)
    out, todo = set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def is_watcher(pid: int) -> bool:
    return b"groups = set()" in _cmdline(pid)


@pytest.mark.slow
@pytest.mark.parametrize("parallels", [1, 2])
def test_sigkill_while_the_scenes_start_leaves_no_process(tmp_path, parallels):
    """The training process killed with SIGKILL while its scenes are still starting (in process for
    one env, in env workers for two, each blocked in the handshake): its env workers, the scenes and
    their watchers are all gone within seconds, not when the scenes would have connected."""
    import signal
    import subprocess

    tag = uuid.uuid4().hex
    env = {**os.environ, "UNITY_STANDIN_PYTHON": sys.executable}
    proc = subprocess.Popen([sys.executable, "-m", "marlkit", "--agent", "MAPPO", "--env", "unity", "--logger", "none",
                             "--set", f"env.file_name={STANDIN}", f"env.additional_args=[--tag, {tag}, --start-delay, 120]",
                             "env.timeout_wait=180", f"runner.parallels={parallels}",
                             f"runner.run_root={tmp_path / 'runs'}", "runner.progress=false"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while not (len(standin_pids(tag)) == parallels and sum(map(is_watcher, seen)) == parallels):
            assert proc.poll() is None and time.monotonic() < deadline, (proc.returncode, seen)
            seen |= descendants(proc.pid)
            time.sleep(0.05)
        time.sleep(0.5)
        seen |= descendants(proc.pid)
        assert set(standin_pids(tag)) <= seen
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert gone_soon(list(seen), 3.0) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in seen:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_script_that_never_closes_its_env_exits_and_leaves_no_scene(tmp_path):
    """ML-Agents' server thread kept the interpreter alive at exit; the env closes itself first."""
    import subprocess

    tag = uuid.uuid4().hex
    body = (f"env = UnityEnv(UnityConfig(file_name={STANDIN!r}, timeout_wait=20, additional_args=['--tag', {tag!r}]))\n"
            "env.reset()\nprint(sorted(env.spec.groups))\n")
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(_script(tmp_path, body))], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started    # start-up, a scene launched and reset, and the exit
    assert out.returncode == 0 and "['team_0', 'team_1']" in out.stdout, out.stderr
    assert took < 10, f"the script took {took:.1f} s"
    assert gone_soon(standin_pids(tag), 1.0) == []


def listening_addresses(port: int) -> set:
    """The local addresses of the TCP sockets listening on ``port`` (from /proc/net/tcp and tcp6,
    where addresses are 32-bit words in host byte order; an IPv4 address held by an IPv6 socket,
    ``::ffff:a.b.c.d``, as the IPv4 address it is)."""
    import ipaddress

    out = set()
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            host, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:   # 0A: LISTEN
                continue
            raw = bytes.fromhex(host)
            address = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
            out.add(getattr(address, "ipv4_mapped", None) or address)
    return out


def test_the_port_a_scene_connects_to_listens_on_loopback_only():
    """ML-Agents' gRPC server listened on every interface ([::]); the scene connects over loopback."""
    import ipaddress

    with make(None)[0] as env:
        env.step(zero_actions(env))   # connected, and answering
        assert listening_addresses(env.port) == {ipaddress.ip_address("127.0.0.1")}


def test_the_env_is_a_context_manager(tmp_path):
    with make(None)[0] as env:
        tag = env.cfg.additional_args[1]
        assert len(standin_pids(tag)) == 1
    assert env._env is None and gone_soon(standin_pids(tag)) == []


def test_a_fixed_port_in_use_is_one_line_naming_the_fix(tmp_path):
    """Two envs on one fixed base_port: the second is refused with the port, the settings and the
    fix, and nothing else is printed at exit (ML-Agents' half-built env raised in its atexit hook)."""
    import subprocess

    base = free_base_port(1)
    body = (f"from marlkit.config import ConfigError\n"
            f"cfg = UnityConfig(file_name={STANDIN!r}, timeout_wait=20, base_port={base})\n"
            "first = UnityEnv(cfg)\n"
            "try:\n    UnityEnv(cfg)\nexcept ConfigError as exc:\n    print(exc)\n"
            "first.close()\n")
    out = subprocess.run([sys.executable, str(_script(tmp_path, body))], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (f"unity env 0: port {base} (env.base_port={base} + env.worker_id=0 + env index 0) "
                                  "is in use, by another run or program; leave env.base_port null for free ports, "
                                  "or pick another env.worker_id")
    assert "Traceback" not in out.stderr and "Error" not in out.stderr, out.stderr


@pytest.mark.slow
def test_a_second_run_on_a_fixed_port_in_use_stops_in_one_line_and_takes_its_scene_along(tmp_path):
    """Two marlkit runs with the same fixed env.base_port: the second exits 2 with the one line
    naming the port and the fix and takes its own scene along; the first runs on, its scene alone."""
    import signal
    import subprocess

    base = free_base_port(1)
    tags = [uuid.uuid4().hex, uuid.uuid4().hex]

    def run(tag: str, steps: int):
        return subprocess.Popen([sys.executable, "-m", "marlkit", "--agent", "MAPPO", "--env", "unity", "--logger",
                                 "none", "--set", f"env.file_name={STANDIN}", f"env.base_port={base}",
                                 f"env.additional_args=[--tag, {tag}]", "runner.parallels=1",
                                 f"runner.total_steps={steps}", f"runner.run_root={tmp_path / tag}",
                                 "runner.progress=false"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    first = run(tags[0], 10_000_000)
    try:
        deadline = time.monotonic() + 60
        while not list((tmp_path / tags[0]).rglob("config.yaml")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(standin_pids(tags[0])) == 1
        second = run(tags[1], 1000)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        [line] = err.strip().splitlines()
        assert f"port {base}" in line and "leave env.base_port null" in line and "env.worker_id" in line
        assert gone_soon(standin_pids(tags[1]), 5.0) == []
        assert first.poll() is None and len(standin_pids(tags[0])) == 1
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
        assert first.returncode == 130
        assert gone_soon(standin_pids(tags[0]), 5.0) == []
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


# ---------------------------------------------------------------------- relaunching a failed scene

def zero_actions(env) -> dict:
    return {g: np.zeros((gs.n_agents, 3), np.int64) for g, gs in env.spec.groups.items()}


def test_a_dead_scene_is_relaunched_and_its_episodes_end_truncated(tmp_path, caplog):
    """The scene exits at its 4th step: that step ends every agent's episode truncated on what it
    saw last and ends the env's episode; the reset hands over the relaunched scene's first
    observation; the restart is logged and counted in the episode statistics."""
    import logging

    env, tag = make(tmp_path, "--die-after", "3", timeout_wait=10)
    try:
        first = standin_pids(tag)
        ob = env.reset()
        for _ in range(3):
            ob, _, _, _, done = env.step(zero_actions(env))
            assert not done
        with caplog.at_level(logging.WARNING, "marlkit.unity"):
            cut, reward, terminated, truncated, done = env.step(zero_actions(env))
        assert done
        for g in env.spec.groups:
            assert truncated[g].all() and not terminated[g].any() and not reward[g].any()
            np.testing.assert_array_equal(cut.obs[g], ob.obs[g])
            np.testing.assert_array_equal(cut.final.obs[g], ob.obs[g])
        assert env.episode_stats() == {"restarts": 1.0}
        warnings = [r.getMessage() for r in caplog.records if r.name == "marlkit.unity"]
        assert len(warnings) == 1 and "is gone" in warnings[0] and "restart 1 of this env" in warnings[0], warnings
        assert first[0] not in standin_pids(tag) and len(standin_pids(tag)) == 1
        new = env.reset()
        for g in env.spec.groups:   # step 0 of episode 0 in every field, every agent deciding
            assert (new.obs[g][:, 2] == 0).all() and (new.obs[g][:, 3] == 0).all() and new.agent_mask[g].all()
            assert agent_ids(env, g) == ([0, 1, 4, 5] if g == "team_0" else [2, 3, 6, 7])
        ob, _, _, _, done = env.step(zero_actions(env))
        assert not done and (ob.obs["team_0"][:, 2] == 1).all()
    finally:
        env.close()
    assert standin_pids(tag) == []


@pytest.mark.slow
def test_failures_in_a_row_stop_with_one_line_and_leave_no_scene(tmp_path):
    """Every launch of the scene exits at its first step: two failures in a row end it."""
    env, tag = make(None, "--die-after", "0", timeout_wait=10, max_failures=2)
    try:
        env.reset()
        assert env.step(zero_actions(env))[4]   # the first failure: relaunched, the episode cut
        env.reset()
        with pytest.raises(UnityEnvError) as info:
            env.step(zero_actions(env))
    finally:
        env.close()
    message = str(info.value)
    assert "\n" not in message and "is gone" in message, message
    assert "2 failures in a row (env.max_failures=2)" in message and env.restarts == 1
    assert standin_pids(tag) == []


@pytest.mark.slow
def test_training_goes_on_over_scenes_that_die(tmp_path):
    """Two scenes in env workers, each exiting after 50 steps, every launch: the run reaches its
    step count and saves, and the restarts are counted in its metrics."""
    import marlkit

    tag = uuid.uuid4().hex
    result = marlkit.run(agent="MAPPO", env="unity", logger="none", **{
        "env.file_name": STANDIN, "env.timeout_wait": 10, "env.additional_args": ["--tag", tag, "--die-after", "50"],
        "runner.parallels": 2, "runner.vectorize": "subprocess", "runner.horizon": 16, "runner.total_steps": 256,
        "runner.progress": False, "runner.run_root": str(tmp_path / "runs")})
    assert result.steps == 256
    assert result.metrics["env/restarts"] >= 1
    assert (result.run_dir / "latest.pt").is_file()
    assert standin_pids(tag) == []


def test_coma_refuses_multidiscrete_after_one_launch_and_names_flatten_actions(tmp_path):
    """The refusal comes from the scene's behaviour specs, read from one launch (closed again),
    before the run's envs start: one player in all, not one per env."""
    import marlkit

    pids = tmp_path / "pids"
    script = tmp_path / "build.sh"
    script.write_text(f'#!/bin/sh\necho $$ >> {pids}\nexec {STANDIN} "$@"\n')
    script.chmod(0o755)
    with pytest.raises(ConfigError) as info:
        marlkit.run(agent="COMA", env="unity", logger="none", **{
            "env.file_name": str(script), "env.timeout_wait": 20, "runner.parallels": 2,
            "runner.total_steps": 64, "runner.progress": False, "runner.run_root": str(tmp_path / "runs")})
    message = str(info.value)
    assert "COMA needs Discrete actions" in message and "set env.flatten_actions: true" in message, message
    got = launched(pids, 1)
    assert len(got) == 1 and not running(got[0])
    # flattened, the same scene trains: one probe, then the run's two envs
    result = marlkit.run(agent="COMA", env="unity", logger="none", **{
        "env.file_name": str(script), "env.timeout_wait": 20, "env.flatten_actions": True, "runner.parallels": 2,
        "runner.horizon": 16, "runner.total_steps": 64, "runner.progress": False,
        "runner.run_root": str(tmp_path / "runs")})
    assert result.steps == 64
    got = launched(pids, 4)
    assert len(got) == 4 and not any(map(running, got))


def critic_values(env, pool: str, ob) -> dict:
    """Per group, MAPPO's centralised critic values ``[A]`` of ``ob`` (the pooled critic the unity
    config resolves to), with the weights of seed 0: the same for every scene of one spec."""
    import torch

    from marlkit.api import build_config
    from marlkit.registry import get_agent

    agent_cfg = build_config("MAPPO", "unity", **{"env.file_name": STANDIN}).agents["MAPPO"]
    agent_cfg.pool = pool
    out = {}
    for g, gs in env.spec.groups.items():
        agent = get_agent("MAPPO")(gs, env.spec, agent_cfg, seed=0)
        obs = torch.as_tensor(ob.obs[g])[None, None]                  # [L=1, B=1, A, obs]
        with torch.no_grad():
            values, _ = agent.values(obs, None, None, None, torch.as_tensor(ob.agent_mask[g])[None, None])
        out[g] = values[0, 0]
    return out


def two_scenes(*args) -> list[tuple]:
    """(env, its first observations, then after a step of the same actions) of two stand-in scenes
    that differ in field 1's observations alone."""
    scenes = []
    for extra in ([], ["--obs-offset", "1:5"]):
        env, _ = make(None, "--fields", "2", *args, *extra)
        first = env.reset()
        actions = {g: np.ones((gs.n_agents, 3), np.int64) for g, gs in env.spec.groups.items()}
        scenes.append((env, [first, env.step(actions)[0]]))
    return scenes


def test_each_group_id_gets_its_own_centralised_critic():
    """Team 0's agents 0, 1 play field 0 (group id 1), agents 4, 5 field 1 (group id 3): moving
    field 1's observations moves none of field 0's critic values, not by one bit, whatever the pool;
    the actor is still one for the behaviour."""
    scenes = two_scenes()
    try:
        (env, obs), (moved_env, moved_obs) = scenes
        assert env.spec.groups["team_0"].subteams == (1, 1, 3, 3)
        assert env.spec.groups["team_1"].subteams == (2, 2, 4, 4)
        assert agent_ids(env, "team_0") == [0, 1, 4, 5] and agent_ids(env, "team_1") == [2, 3, 6, 7]
        for ob, moved in zip(obs, moved_obs):
            for g in env.spec.groups:
                np.testing.assert_array_equal(ob.obs[g][:2], moved.obs[g][:2])
                assert (ob.obs[g][2:] != moved.obs[g][2:]).all()
            for pool in ("mean", "max", "attention"):
                values, moved_values = critic_values(env, pool, ob), critic_values(moved_env, pool, moved)
                for g in env.spec.groups:
                    assert values[g][:2].numpy().tobytes() == moved_values[g][:2].numpy().tobytes(), (pool, g)
                    assert (values[g][2:] != moved_values[g][2:]).all(), (pool, g)
    finally:
        for env, _ in scenes:
            env.close()


def test_without_group_ids_one_critic_reads_the_whole_behaviour():
    """All group ids 0 (no groups): no sub-teams, and every agent's critic value reads every field,
    as before group ids were used; ``env.group_ids: false`` ignores the ids of a scene that has them."""
    scenes = two_scenes("--no-group-ids")
    try:
        (env, obs), (moved_env, moved_obs) = scenes
        assert all(gs.subteams is None for gs in env.spec.groups.values())
        for ob, moved in zip(obs, moved_obs):
            for pool in ("mean", "max", "attention"):
                values, moved_values = critic_values(env, pool, ob), critic_values(moved_env, pool, moved)
                for g in env.spec.groups:
                    assert (values[g] != moved_values[g]).all(), (pool, g)
    finally:
        for env, _ in scenes:
            env.close()
    env, _ = make(None, "--fields", "2", group_ids=False)
    try:
        assert all(gs.subteams is None for gs in env.spec.groups.values())
    finally:
        env.close()


def test_a_group_id_that_changes_is_an_error_naming_the_agent_and_the_fix():
    """The critics were built on the group ids of the first reset: an agent whose id changes stops
    the env with the agent, both ids and the setting that ignores them; with it the scene plays on."""
    from marlkit.errors import EnvAPIError

    env, _ = make(None, "--fields", "2", "--regroup-after", "2")
    try:
        actions = zero_actions(env)
        env.reset()
        env.step(actions)
        with pytest.raises(EnvAPIError) as info:
            env.step(actions)
    finally:
        env.close()
    message = str(info.value)
    assert "agent id 0 has group id 101, but 1 at the first reset" in message, message
    assert "set env.group_ids=false" in message, message
    env, _ = make(None, "--fields", "2", "--regroup-after", "2", group_ids=False)
    try:
        actions = zero_actions(env)
        env.reset()
        for _ in range(4):
            ob, *_ = env.step(actions)
        assert ob.agent_mask["team_0"].all()
    finally:
        env.close()
