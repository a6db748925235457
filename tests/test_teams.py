"""Groups that share a reward are one team: found from the random policy's rewards (or set, or
declared by the env), scored as one (the team's return, best.pt chosen on it), and learned as one
by the agents that mix across groups (one QMIX mixer over a speaker and a listener of different
shapes). Rival teams keep their evaluation against the random policy (tests/test_evaluation.py,
tests/test_run_safety.py)."""
import json

import numpy as np
import pytest
import torch

import marlkit
from conftest import best_by_the_rule
from marlkit.api import build_config
from marlkit.errors import ConfigError
from marlkit.runners.evaluation import team_return
from marlkit.runners.setup import build_parts
from marlkit.runners.teams import check_teams
from marlkit.storage import Collected, StorageLayout

# MPE speaker-listener as two groups of different shapes (speaker: 3 observations, 3 actions;
# listener: 11 and 5), which share every reward
SPEAKER_LISTENER = {"env.pad_spaces": False}


def _parts(agent: str, env: str, **overrides):
    cfg = build_config(agent, env, **{"runner.vectorize": "sync", "runner.parallels": 2, **overrides})
    return cfg, build_parts(cfg, None)


def test_groups_sharing_every_reward_of_the_random_policy_are_one_team_said_once(capsys):
    cfg, parts = _parts("MAPPO", "mpe_speaker_listener", **SPEAKER_LISTENER)
    try:
        assert list(parts.venv.spec.groups) == ["speaker", "listener"]
        assert parts.teams == {"speaker+listener": ["speaker", "listener"]}
        assert cfg.env.teams == parts.teams            # kept in the run's config: a resume does not look again
        err = capsys.readouterr().err
        assert err.count("marlkit: teams, from the random policy's rewards") == 1 and "speaker+listener" in err
    finally:
        parts.venv.close()


def test_rival_groups_are_teams_of_their_own_and_rewards_that_never_come_tell_nothing(env_yaml, capsys):
    duel = env_yaml("toy_envs:duel", {"length": 6}, env={"groups": {"red": ["red_*"], "blue": ["blue_*"]}})
    _, parts = _parts("MAPPO", duel)
    parts.venv.close()
    assert parts.teams == {"red": ["red"], "blue": ["blue"]}
    capsys.readouterr()
    silent = env_yaml("toy_envs:duel", {"length": 6, "stakes": 0.0}, name="silent.yaml",
                      env={"groups": {"red": ["red_*"], "blue": ["blue_*"]}})
    _, parts = _parts("MAPPO", silent)
    parts.venv.close()
    assert parts.teams == {"red": ["red"], "blue": ["blue"]}
    assert "every reward of the random policy's first 100 steps was 0" in capsys.readouterr().err


def test_teams_set_in_the_yaml_are_checked_against_the_groups():
    groups = ["listener", "speaker", "observer"]
    assert check_teams({"team": ["speaker", "listener"]}, groups) == {"team": ["listener", "speaker"],
                                                                      "observer": ["observer"]}
    with pytest.raises(ConfigError, match=r"env.teams.team: unknown group 'speakr' \(did you mean 'speaker'\?\)"):
        check_teams({"team": ["speakr"]}, groups)
    with pytest.raises(ConfigError, match=r"group 'speaker' is in two teams, 'a' and 'b'"):
        check_teams({"a": ["speaker"], "b": ["speaker", "listener"]}, groups)
    with pytest.raises(ConfigError, match=r"team 'observer' has the name of a group it does not hold"):
        check_teams({"observer": ["speaker"]}, groups)


def test_a_unity_scene_declares_its_teams_from_the_team_ids():
    from marlkit.envs.unity.env import group_names, scene_teams
    two = group_names(["SoccerTwos?team=0", "SoccerTwos?team=1"])
    assert scene_teams(two) == {"team_0": ["team_0"], "team_1": ["team_1"]}
    four = group_names(["Striker?team=0", "Goalie?team=0", "Striker?team=1", "Goalie?team=1"])
    assert scene_teams(four) == {"team_0": ["Striker_team_0", "Goalie_team_0"],
                                 "team_1": ["Striker_team_1", "Goalie_team_1"]}
    assert scene_teams(group_names(["Walker"])) is None


@pytest.mark.slow
def test_a_cooperative_teams_score_is_its_return_and_best_pt_follows_it(tiny):
    """Speaker and listener, two groups that learn: evaluated together, never against the random
    policy; the score is the team's return, and best.pt the best evaluation of that score."""
    run = marlkit.run(agent="MAPPO", env="mpe_speaker_listener", mode="benchmark", seed=1, **{
        **tiny, **SPEAKER_LISTENER, "runner.vectorize": "sync", "runner.total_steps": 600,
        "runner.horizon": 25, "runner.eval_interval": 200, "runner.eval_episodes": 6})
    team = ["speaker", "listener"]
    assert run.teams == {"speaker+listener": team}
    for row in run.evaluations:
        assert "vs_random" not in row
        # each group's return is the team's (they share every reward), and the score is it
        assert row["mean"]["speaker"] == pytest.approx(row["mean"]["listener"])
        assert row["score"] == pytest.approx(row["teams"]["speaker+listener"]["mean"])
        assert row["score"] == pytest.approx(np.mean([row["mean"][g] for g in team]))
    assert run.best["step"] == best_by_the_rule(run.evaluations)["step"]
    report = json.loads((run.run_dir / "benchmark.json").read_text())
    assert report["teams"] == {"speaker+listener": team}
    assert report["best_metric"] == "mean return of the learning teams"
    assert torch.load(run.run_dir / "best.pt", weights_only=False)["steps"] == run.best["step"]


def test_a_teams_return_is_the_mean_of_its_groups():
    episode = {"return": {"speaker": -3.0, "listener": -3.0, "rival": 5.0}}
    assert team_return(episode, ["speaker", "listener"]) == -3.0
    assert team_return(episode, ["absent"]) is None


def _rollout(venv, agents, steps: int):
    """``steps`` steps of every env with ``agents`` acting -> per group its transitions and the
    bootstrap after them, as the collector stores them."""
    from marlkit.runners.collector import act
    from marlkit.storage import Bootstrap, Transition
    obs = venv.reset(seed=3)
    out = {g: [] for g in agents}
    for _ in range(steps):
        outs = act(agents, obs, {g: None for g in agents}, True)
        res = venv.step({g: o.actions for g, o in outs.items()})
        for g, o in outs.items():
            out[g].append(Transition(obs.obs[g], obs.state, obs.agent_mask[g], obs.action_mask[g], o.actions,
                                     o.log_prob, o.value, res.reward[g], res.terminated[g], res.truncated[g],
                                     res.episode_end, res.final.obs[g], res.final.state,
                                     final_action_mask=res.final.action_mask[g]))
        obs = res.next
    return out, {g: Bootstrap(obs.obs[g], obs.state, obs.agent_mask[g], obs.action_mask[g], None) for g in agents}


@pytest.mark.parametrize("agent", ["QMIX", "VDN"])
def test_one_mixer_mixes_the_agents_of_both_groups_and_its_gradient_reaches_both_q_networks(agent):
    """Without env.pad_spaces: the speaker's agent (the first group's: the lead) holds one mixer over
    both agents and learns for both groups on the same replayed episodes of each; the listener's
    learns nothing on its own. The team's TD loss sends gradient into both Q networks, and an
    update moves both."""
    _, parts = _parts(agent, "mpe_speaker_listener", **SPEAKER_LISTENER,
                      **{f"agents.{agent}.batch_size": 2, "env.kwargs.max_cycles": 5})
    try:
        speaker, listener = parts.agents["speaker"], parts.agents["listener"]
        assert speaker.learns_for == [speaker, listener] and listener.learns_for == []
        assert "mixer" in speaker.modules and "mixer" not in listener.modules
        assert speaker.mixed_agents == 2 and listener.optimizer is speaker.optimizer
        if agent == "QMIX":
            assert speaker.modules["mixer"].n_agents == 2
        transitions, bootstrap = _rollout(parts.venv, parts.agents, 10)
    finally:
        parts.venv.close()
    index = None
    batches = {}
    for g in ("speaker", "listener"):   # every group's storage is finished before any update, as in a run
        agent_ = parts.agents[g]
        storage = agent_.make_storage(StorageLayout(agent_.group, agent_.env, 2, 10))
        rollout = storage.next_rollout()
        for transition in transitions[g]:
            rollout.add(transition)
        batches[g] = storage.finish(Collected(rollout, bootstrap[g]))
    assert listener.update(batches["listener"]) == {}
    assert speaker.replay.episodes == listener.replay.episodes == 4
    index = speaker.replay.sample_index(2, np.random.default_rng(0))
    samples = [{k: torch.from_numpy(v) for k, v in m.replay.take(index).items()} for m in speaker.learns_for]
    loss, _ = speaker.loss(samples)
    loss.backward()
    for g, a in parts.agents.items():
        grads = [p.grad for p in a.modules["q"].parameters()]
        assert any(grad is not None and grad.abs().sum() > 0 for grad in grads), g
    speaker.optimizer.zero_grad()
    before = {g: [p.detach().clone() for p in a.modules["q"].parameters()] for g, a in parts.agents.items()}
    metrics = speaker.update(batches["speaker"])
    assert metrics["gradient_steps"] == 4.0 and metrics["td_loss"] > 0
    for g, a in parts.agents.items():
        assert any(not torch.equal(p, q) for p, q in zip(a.modules["q"].parameters(), before[g])), g
