"""Training on a Unity scene, end to end: the runner and the agents drive the real ``UnityEnvironment``
over gRPC against the stand-in under ``tests/unity_standin/``, and what lands in the rollout buffer,
the advantages and the logged returns is checked against the stand-in's own record of the actions
it received (its rewards are a known function of them)."""
from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

import marlkit
from marlkit.agents.on_policy import OnPolicyAgent

STANDIN = str(Path(__file__).parent / "unity_standin" / "standin")
GAMMA = 0.99
sys.path.insert(0, str(Path(__file__).parent / "unity_standin"))
from standin import image as standin_image  # noqa: E402
from forked_cli import run_marlkit


@pytest.fixture(autouse=True)
def standin_python(monkeypatch):
    monkeypatch.setenv("UNITY_STANDIN_PYTHON", sys.executable)


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def field_length(agent_id: int, episode_length: int = 5) -> int:
    return episode_length + 2 * (agent_id // 4)


def expected_episode_infos(log: list[dict], fields: int, group_reward_weight: float) -> list[dict]:
    """What the vector env logs, recomputed from the stand-in's record: at each step where fields
    end, per team the mean return of the team's agents that ended (decision period 1: every agent
    acts every step and earns ``0.01 * sum(action) - 0.001``, plus its group reward at a goal)."""
    returns = {a: 0.0 for a in range(4 * fields)}
    episode = {f: 0 for f in range(fields)}
    infos = []
    for row in log:
        for agent_id, action in row["actions"].items():
            returns[int(agent_id)] += 0.01 * sum(action["discrete"])
        for agent_id in returns:
            returns[agent_id] -= 0.001
        if not row["ended"]:
            continue
        info = {}
        for team in (0, 1):
            ended = [a for a in returns if a // 4 in row["ended"] and (a % 4) // 2 == team]
            total = 0.0
            for a in ended:
                ep = episode[a // 4]
                goal = ep % 3 != 2
                total += returns[a] + (group_reward_weight * (1.0 if team == ep % 2 else -1.0) if goal else 0.0)
            info[f"team_{team}"] = total / len(ended)
        infos.append(info)
        for f in row["ended"]:
            episode[f] += 1
            for a in returns:
                if a // 4 == f:
                    returns[a] = 0.0
    return infos


@pytest.fixture
def captured(monkeypatch):
    """Every call of ``OnPolicyAgent.targets``: the agent, copies of its rollout buffer, the values
    it bootstrapped from, and the GAE targets it produced."""
    calls = []
    original = OnPolicyAgent.targets

    def spy(self, batch, last_value, truncation_value):
        buf = batch.rollout
        # each truncation final valued on its own, by the weights (and value normaliser) of this update,
        # with the slots present at its step (a pooled critic pools over them)
        final_values = [self.value_of(f[2][None], f[3][None], buf.agent_mask[f[0], f[1]][None], None)[0]
                        for f in buf.finals]
        relogged = None
        if not self.recurrent:   # the stored actions' log-probs under the policy that acted
            with torch.no_grad():
                mask = self.tensor(buf.action_mask) if self.group.n_actions else None
                dist, _ = self.policy(self.tensor(buf.obs), self.tensor(buf.state), None, None, mask)
                relogged = dist.log_prob(self.tensor(buf.actions)).numpy()
        out = original(self, batch, last_value, truncation_value)
        calls.append({"agent": self, "group": self.group.name, "obs": buf.obs.copy(), "actions": buf.actions.copy(),
                      "reward": buf.reward.copy(), "value": buf.value.copy(), "mask": buf.agent_mask.copy(),
                      "terminated": buf.terminated.copy(), "truncated": buf.truncated.copy(),
                      "finals": list(buf.finals), "final_values": final_values,
                      "truncation_value": truncation_value.copy(), "log_prob": buf.log_prob.copy(),
                      "relogged": relogged,
                      "hidden": None if buf.hidden is None else buf.hidden.copy(),
                      "advantages": out["advantages"].copy()})
        return out

    monkeypatch.setattr(OnPolicyAgent, "targets", spy)
    return calls


def train(tmp_path, steps: int, horizon: int, **overrides):
    log = tmp_path / "standin.jsonl"
    settings = {"env.file_name": STANDIN, "env.additional_args": ["--fields", "2", "--log", str(log)],
                "env.group_reward_weight": 0.5, "env.timeout_wait": 30,
                "runner.parallels": 1, "runner.vectorize": "sync", "runner.horizon": horizon,
                "runner.total_steps": steps, "runner.run_root": str(tmp_path / "runs"), "runner.progress": False,
                "logger": "none", **overrides}
    result = marlkit.run(agent="MAPPO", env="unity", **settings)
    return result, read_log(log)


def test_rewards_and_bootstraps_in_the_buffer_match_the_scene(tmp_path, captured):
    """Field 0's episodes end every 5 steps, field 1's every 7, on a goal (terminated) or, every
    third episode, at the max step (truncated); the ending agents start their next episode in the
    same step."""
    result, log = train(tmp_path, steps=80, horizon=40)
    assert len(log) == 80 and len(captured) == 4   # 2 rollouts x 2 teams
    ids = {"team_0": [0, 1, 4, 5], "team_1": [2, 3, 6, 7]}
    checked = {"terminated": 0, "truncated": 0}
    for k, call in enumerate(captured):
        g = call["group"]
        team = int(g[-1])
        assert call["mask"].all()          # decision period 1: every agent decides every step
        for t in range(40):
            row = log[40 * (k // 2) + t]
            for slot, agent_id in enumerate(ids[g]):
                # the action the buffer holds is the one the scene received
                assert call["actions"][t, 0, slot].tolist() == row["actions"][str(agent_id)]["discrete"]
                obs = call["obs"][t, 0, slot]
                step, episode = int(obs[2]), int(obs[3])
                length = field_length(agent_id)
                ends = step + 1 == length
                assert (agent_id // 4 in row["ended"]) == ends
                expected = 0.01 * sum(row["actions"][str(agent_id)]["discrete"]) - 0.001
                goal = ends and episode % 3 != 2
                if goal:
                    expected += 0.5 * (1.0 if team == episode % 2 else -1.0)
                assert call["reward"][t, 0, slot] == pytest.approx(expected, abs=1e-5), (t, g, agent_id)
                assert call["terminated"][t, 0, slot] == goal
                assert call["truncated"][t, 0, slot] == (ends and not goal)
                if not ends:
                    continue
                if t + 1 < 40:   # the next stored step is the start of the agent's next episode
                    nxt = call["obs"][t + 1, 0, slot]
                    assert (nxt[2], nxt[3]) == (0, episode + 1)
                adv = call["advantages"][t, 0, slot]
                v = call["value"][t, 0, slot]
                if goal:
                    # terminated: nothing after the goal is credited, the next episode least of all
                    assert adv == pytest.approx(call["reward"][t, 0, slot] - v, abs=1e-5)
                    checked["terminated"] += 1
                else:
                    # truncated: bootstrapped from the value of the agent's final observation of
                    # this episode (step 5, same episode), not of its next episode's first one
                    i = [f[0] for f in call["finals"]].index(t)
                    final_obs = call["finals"][i][2]
                    assert (final_obs[slot][2], final_obs[slot][3]) == (length, episode)
                    v_final = call["final_values"][i][slot]
                    assert call["truncation_value"][t, 0, slot] == pytest.approx(v_final, abs=1e-5)
                    assert adv == pytest.approx(call["reward"][t, 0, slot] + GAMMA * v_final - v, abs=1e-5)
                    checked["truncated"] += 1
    # field 0 ends at steps 5, 10, ..., 80 (16 episodes, 5 by max step), field 1 at 7, ..., 77 (11, 3);
    # 2 agents per team and field
    assert checked == {"terminated": 2 * 2 * (11 + 8), "truncated": 2 * 2 * (5 + 3)}
    # logged episode returns: one entry per step where fields ended, per team the mean over its agents
    expected = expected_episode_infos(log, fields=2, group_reward_weight=0.5)
    assert len(result.episode_returns) == len(expected) == 16 + 11 - 2   # steps 35 and 70 end both fields
    for got, want in zip(result.episode_returns, expected):
        assert got.keys() == want.keys()
        for g in want:
            assert got[g] == pytest.approx(want[g], abs=1e-4)


def test_recurrent_state_restarts_with_the_agents_episode(tmp_path, captured):
    """A GRU actor: the hidden state stored for an agent's first step of a new episode is zero,
    while its teammates in the other field (still mid-episode) keep theirs."""
    train(tmp_path, steps=20, horizon=20, **{"agents.MAPPO.actor.name": "gru", "agents.MAPPO.critic.name": "gru"})
    call = [c for c in captured if c["group"] == "team_0"][0]
    hidden = call["hidden"]   # [T, E, A, 2, H]: what was fed to act at each step
    # field 0 (slots 0, 1) restarts after steps 5, 10, 15 (t = 4, 9, 14 -> stored at t = 5, 10, 15);
    # field 1 (slots 2, 3) after step 7 (t = 6 -> t = 7)
    for t in range(1, 20):
        for slot in range(4):
            length = 5 if slot < 2 else 7
            fresh = t % length == 0
            assert (np.abs(hidden[t, 0, slot]).sum() == 0) == fresh, (t, slot)


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["MAPPO", "MAT", "POCA"])
def test_learns_from_the_cli_and_logs_the_scenes_returns(tmp_path, agent):
    """``marlkit --agent <agent> --env unity --set env.file_name=<stand-in>``: without group rewards the
    stand-in pays ``0.01 * sum(action)`` per decision, so a learning policy picks ever higher
    choices; the logged episode return is the one the stand-in's record gives."""
    log = tmp_path / "standin.jsonl"
    env = {**os.environ, "UNITY_STANDIN_PYTHON": sys.executable}
    args = ["--agent", agent, "--env", "unity", "--logger", "console", "--set",
            f"env.file_name={STANDIN}", f"env.additional_args=['--fields','1','--log','{log}']",
            "env.group_reward_weight=0", "runner.parallels=1", "runner.horizon=64", "runner.total_steps=1536",
            "runner.log_interval=1536", f"runner.run_root={tmp_path / 'runs'}", "runner.progress=false",
            f"agents.{agent}.lr=0.003"]
    done = run_marlkit(args, env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_log(log)
    assert len(rows) == 1536
    assert sum(row["violations"] for row in rows) == 0   # the policy never picked a masked choice
    chosen = np.array([[sum(a["discrete"]) for a in row["actions"].values()] for row in rows], float)
    # the first rollout (before any update) is near uniform over the allowed choices: 2.875 on
    # average (the masks forbid a high choice for half the agents); the best allowed sum is 5.5
    first, last = chosen[:64].mean(), chosen[-256:].mean()
    assert 2.5 < first < 3.25 and last > first + 1.5, (first, last)
    infos = expected_episode_infos(rows, fields=1, group_reward_weight=0.0)
    logged = {g: float(v) for g, v in re.findall(r"(team_\d)/episode_return=(-?[\d.e-]+)", done.stdout)}
    for g in ("team_0", "team_1"):
        want = np.mean([i[g] for i in infos[-100:]])
        assert logged[g] == pytest.approx(want, rel=1e-3), g


def test_an_agent_deciding_every_other_step_is_paid_for_its_own_actions(tmp_path, captured):
    """``--decision-period 2``: agent ids 1 and 3 (field 0, 5-step episodes) decide at steps 0, 2
    and 4 of each episode. Unity pays what an agent earned between two decisions when it next
    decides, so the buffer holds that pay at the absent step, and GAE credits it to the action
    before (one ``gamma`` per decision)."""
    result, log = train(tmp_path, steps=40, horizon=40, **{"env.additional_args": [
        "--fields", "2", "--decision-period", "2", "--log", str(tmp_path / "standin.jsonl")]})
    lam = 0.95
    for call in captured:
        slot = 1   # agent id 1 in team_0, id 3 in team_1
        agent_id = 1 if call["group"] == "team_0" else 3
        mask, reward, value, adv = (call[k][:, 0, slot] for k in ("mask", "reward", "value", "advantages"))
        steps = [t % 5 for t in range(40)]
        assert mask.tolist() == [s % 2 == 0 for s in steps]
        for t, s in enumerate(steps):
            if s in (1, 3):    # absent: paid now for the action of step t - 1 and two steps' -0.001
                assert adv[t] == 0
                paid = 0.01 * sum(log[t - 1]["actions"][str(agent_id)]["discrete"]) - 0.002
                assert reward[t] == pytest.approx(paid, abs=1e-5)
            elif s in (0, 2):  # acts; nothing paid until its next decision
                assert reward[t] == 0
                assert adv[t] == pytest.approx(reward[t + 1] + GAMMA * value[t + 2] - value[t]
                                               + GAMMA * lam * adv[t + 2], abs=1e-5), t
            else:              # step 4: its action ends the episode (terminal reward, maybe the goal's)
                assert call["terminated"][t, 0, slot] or call["truncated"][t, 0, slot]
                if call["terminated"][t, 0, slot]:
                    assert adv[t] == pytest.approx(reward[t] - value[t], abs=1e-5)


def test_mappo_trains_on_hybrid_actions(tmp_path, captured):
    """Two continuous actions and branches [3, 3, 3]: what the buffer holds is what the scene got
    (continuous clipped to [-1, 1]), no masked choice is taken, and the stored log-probs are the
    policy's own for those actions (the float encoding of the choices round-trips)."""
    result, log = train(tmp_path, steps=40, horizon=20, **{"env.additional_args": [
        "--fields", "1", "--continuous", "2", "--log", str(tmp_path / "standin.jsonl")]})
    assert sum(row["violations"] for row in log) == 0
    ids = {"team_0": [0, 1], "team_1": [2, 3]}
    for k, call in enumerate(captured):
        assert call["actions"].shape == (20, 1, 2, 5)
        np.testing.assert_allclose(call["relogged"], call["log_prob"], atol=1e-4)
        for t in range(20):
            row = log[20 * (k // 2) + t]
            for slot, agent_id in enumerate(ids[call["group"]]):
                action = call["actions"][t, 0, slot]
                got = row["actions"][str(agent_id)]
                np.testing.assert_allclose(got["continuous"], np.clip(action[:2], -1, 1), atol=1e-6)
                assert got["discrete"] == action[2:].astype(int).tolist()
    assert np.isfinite(result.metrics["team_0/approx_kl"])


def test_mixed_sensors_reach_a_cnn_and_an_mlp_apart(tmp_path, captured):
    """A 3x8x10 camera beside the two vector sensors and the actor ``mixed``, with no image shapes
    given: the group spec tells them. Its convolutions see exactly each agent's image, pixel for
    pixel (the stand-in's pixels differ along every axis), its mlp the vector sensors."""
    seen = []
    result, _ = train(tmp_path, steps=20, horizon=10, **{
        "env.additional_args": ["--fields", "1", "--image", "3x8x10", "--log", str(tmp_path / "standin.jsonl")],
        "agents.MAPPO.actor.name": "mixed"})
    call = captured[0]
    actor = call["agent"].modules["actor"]
    conv = actor.cnns[0].conv[0]
    assert conv.in_channels == 3 and actor.vector[0].normalized_shape == (8 + 3 + 2,)   # + the agent id
    hook = conv.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    try:
        with torch.no_grad():   # the first stored step of team 0: both agents' obs with their ids
            actor.encode(torch.from_numpy(np.concatenate([call["obs"][0, 0], np.eye(2, dtype=np.float32)], -1)))
    finally:
        hook.remove()
    images = seen[0]   # [agents, C, H, W]
    assert images.shape == (2, 3, 8, 10)
    for slot, agent_id in enumerate([0, 1]):
        step = int(call["obs"][0, 0, slot, 240 + 2])
        np.testing.assert_allclose(images[slot].numpy(), standin_image(agent_id, step, (3, 8, 10)) / 255.0, atol=1e-6)
    assert np.isfinite(result.metrics["team_0/policy_loss"])


def test_an_episode_ending_between_two_decisions_is_credited_to_the_last_one(tmp_path, captured):
    """6-step episodes, ``--decision-period 4``: agent ids 1 and 3 decide at steps 0 and 4 and are
    absent when the episode ends after step 5; the terminal reward (what they earned since step 4,
    and the goal) arrives at that absent step and cuts the episode at their last action."""
    train(tmp_path, steps=36, horizon=36, **{"env.additional_args": [
        "--fields", "1", "--episode-length", "6", "--decision-period", "4", "--log", str(tmp_path / "standin.jsonl")]})
    log = read_log(tmp_path / "standin.jsonl")
    ends = 0
    for call in captured:
        agent_id = 1 if call["group"] == "team_0" else 3
        team = agent_id // 2
        mask, reward, value, adv = (call[k][:, 0, 1] for k in ("mask", "reward", "value", "advantages"))
        term, trunc = call["terminated"][:, 0, 1], call["truncated"][:, 0, 1]
        assert mask.tolist() == [t % 6 in (0, 4) for t in range(36)]
        for t in range(4, 36, 6):        # the last decision of each episode, then one absent step
            episode = t // 6
            goal = episode % 3 != 2
            assert not (term[t] or trunc[t]) and reward[t] == 0
            assert (term[t + 1], trunc[t + 1]) == (goal, not goal)
            earned = 0.01 * sum(log[t]["actions"][str(agent_id)]["discrete"]) - 0.002
            group = (1.0 if team == episode % 2 else -1.0) * 0.5 if goal else 0.0
            assert reward[t + 1] == pytest.approx(earned + group, abs=1e-5)
            if goal:
                assert adv[t] == pytest.approx(reward[t + 1] - value[t], abs=1e-5)
            else:
                i = [f[0] for f in call["finals"]].index(t + 1)
                assert call["finals"][i][2][1][2] == 6       # its final observation: step 6 of the episode
                assert adv[t] == pytest.approx(reward[t + 1] + GAMMA * call["final_values"][i][1] - value[t],
                                               abs=1e-5)
            ends += 1
    assert ends == 2 * 6


def standin_pids(tag: str) -> list[int]:
    return [int(pid) for pid in filter(str.isdigit, os.listdir("/proc"))
            if tag.encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]


def test_the_worker_timeout_waits_out_a_scenes_timeout_and_relaunches(tmp_path):
    """An env worker is given up after ``runner.worker_timeout`` seconds without an answer, while the
    scene it steps takes up to ``env.timeout_wait`` to be found hung, then is stopped and relaunched:
    at the packaged defaults the worker waits longer than all of that, a longer timeout_wait
    lengthens it, and a shorter worker timeout set by hand is refused in one line."""
    from marlkit.api import build_config

    def longest_step(timeout_wait: int, max_failures: int = 3) -> int:
        """The hung step's timeout and the stop of its scene (5 s), then the relaunches, each a
        handshake and a reset that may time out, and a stop."""
        return timeout_wait + 5 + (max_failures - 1) * (2 * timeout_wait + 5)

    cfg = build_config("MAPPO", "unity", **{"env.file_name": STANDIN})
    assert cfg.runner.envs_in_workers() and (cfg.env.timeout_wait, cfg.env.max_failures) == (60, 3)
    assert cfg.runner.worker_timeout > longest_step(60)
    slow = build_config("MAPPO", "unity", **{"env.file_name": STANDIN, "env.timeout_wait": 300})
    assert slow.runner.worker_timeout > longest_step(300) > cfg.runner.worker_timeout
    once = build_config("MAPPO", "unity", **{"env.file_name": STANDIN, "env.max_failures": 1})
    assert longest_step(60) > once.runner.worker_timeout > longest_step(60, max_failures=1)
    # one scene stepped in this process: no worker to time out, so any setting goes
    alone = build_config("MAPPO", "unity", **{"env.file_name": STANDIN, "runner.parallels": 1,
                                                "runner.worker_timeout": 60})
    assert alone.runner.worker_timeout == 60
    out = run_marlkit(["--agent", "MAPPO", "--env", "unity", "--logger", "none", "--set", f"env.file_name={STANDIN}",
                       "runner.worker_timeout=60", f"runner.run_root={tmp_path / 'runs'}"], os.environ, timeout=120)
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.strip().splitlines()
    assert "runner.worker_timeout=60 is less than" in line and "env.timeout_wait=60" in line, line
    assert f"set runner.worker_timeout to null (derived) or at least {cfg.runner.worker_timeout:g}" in line, line
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_scene_hung_is_relaunched_before_its_worker_is_given_up(tmp_path):
    """Two scenes in env workers, the worker timeout derived from env.timeout_wait as at the packaged
    defaults (test_the_worker_timeout_waits_out_a_scenes_timeout_and_relaunches checks what that
    derivation gives there), env.timeout_wait shortened to 6 s to keep the wait short: one scene
    stops answering at its 20th step (once: its relaunch runs on). Its env finds it hung after
    env.timeout_wait, relaunches it, and the run goes on to its end."""
    from marlkit.api import build_config
    tag, hung = uuid.uuid4().hex, tmp_path / "hung"
    overrides = {"env.file_name": STANDIN, "env.timeout_wait": 6, "runner.parallels": 2, "runner.horizon": 16,
                 "runner.total_steps": 96, "runner.progress": False, "runner.run_root": str(tmp_path / "runs")}
    derived = build_config("MAPPO", "unity", **overrides).runner
    assert derived.envs_in_workers() and derived.worker_timeout > 6 + 5
    start = time.monotonic()
    result = marlkit.run(agent="MAPPO", env="unity", logger="none", **{
        **overrides, "env.additional_args": ["--tag", tag, "--hang-after", "20", "--fault-once", str(hung)]})
    assert hung.exists() and time.monotonic() - start > 6
    assert result.steps == 96 and result.metrics["env/restarts"] >= 1
    assert (result.run_dir / "latest.pt").is_file()
    assert standin_pids(tag) == []


@pytest.mark.slow
@pytest.mark.parametrize("parallels", [1, 2])
def test_a_scene_failure_is_one_line_and_its_traceback_goes_to_error_log(tmp_path, parallels):
    """A scene that exits (not relaunched): the same one line whether it is stepped in this process
    or in an env worker, naming the scene, what was saved and where the traceback is."""
    runs = tmp_path / "runs"
    env = {**os.environ, "UNITY_STANDIN_PYTHON": sys.executable}
    out = run_marlkit(["--agent", "MAPPO", "--env", "unity", "--logger", "none", "--set", f"env.file_name={STANDIN}",
                       "env.additional_args=[--die-after, 20]", "env.restart_on_failure=false",
                       f"runner.parallels={parallels}", "runner.horizon=8", "runner.total_steps=100000",
                       f"runner.run_root={runs}", "runner.progress=false"], env, timeout=300)
    assert out.returncode == 1, out.stderr
    [line] = out.stderr.strip().splitlines()
    assert "unity env" in line and "is gone" in line and "while stepping" in line, line
    [latest] = runs.rglob("latest.pt")   # the scenes died in the third rollout: the second is saved
    assert f"the run up to step {16 * parallels} is saved in {latest}" in line, line
    log = latest.parent / "error.log"
    assert line.endswith(f"the worker's traceback is in {log}"), line
    text = log.read_text()
    assert "Traceback (most recent call last):" in text and "UnityEnvError" in text, text
    assert str(Path("marlkit", "envs", "unity", "env.py")) in text, text


@pytest.mark.slow
def test_poca_trains_in_self_play_over_the_scenes_protocol(tmp_path):
    """``--agent POCA --env unity_soccer_twos``: one policy for both teams (their behaviours are
    alike), the other team played by a past self, every field's end a match rated by the sign of the
    team's last reward (ML-Agents' convention for its scenes)."""
    log = tmp_path / "standin.jsonl"
    result = marlkit.run(agent="POCA", env="unity_soccer_twos", logger="none", **{
        "env.file_name": STANDIN, "env.additional_args": ["--fields", "1", "--log", str(log)],
        "runner.parallels": 1, "runner.horizon": 64, "runner.total_steps": 1536, "runner.progress": False,
        "runner.run_root": str(tmp_path / "runs"), "self_play.save_steps": 256, "self_play.swap_steps": 128,
        "self_play.team_change": 512, "self_play.window": 3, "agents.POCA.actor.hidden_sizes": [64, 64],
        "agents.POCA.critic.hidden_sizes": [64, 64], "agents.POCA.attention_width": 64})
    league = result.self_play
    ends = [row for row in read_log(log) if row["ended"]]
    assert league["symmetric"] and len(ends) > 100
    assert league["matches"] == len(ends)        # every field's end was rated, once
    assert league["learning_team"] == "team_1"   # changed at 512, 1024 and 1536
    assert [e["step"] for e in league["pool"]["shared"]] == [1024, 1280, 1536]
    assert league["elo"]["shared"] != 1200.0
    ckpt = torch.load(result.run_dir / "latest.pt", weights_only=False)
    assert ckpt["groups"]["team_1"]["agent"] == "POCA"
