"""Evaluation cannot change training, and every benchmark measures the random policy beside the
trained one."""
import json

import numpy as np
import pytest
import torch

import marlkit


def _metrics(run) -> dict:
    return {k: v for k, v in run.metrics.items() if not k.startswith("perf/")}


@pytest.mark.slow
@pytest.mark.exact
@pytest.mark.parametrize("agent", ["MAPPO", "MAT"])
def test_the_same_seed_trains_the_same_in_train_and_benchmark_mode(tiny, agent):
    settings = {**tiny, "runner.total_steps": 200, "runner.eval_episodes": 3}
    train = marlkit.run(agent=agent, env="mpe_spread", mode="train", seed=5, **settings)
    often = marlkit.run(agent=agent, env="mpe_spread", mode="benchmark", seed=5, **settings)
    rarely = marlkit.run(agent=agent, env="mpe_spread", mode="benchmark", seed=5,
                         **{**settings, "runner.eval_interval": 100})
    assert len(often.evaluations) == 11 and len(rarely.evaluations) == 3
    assert _metrics(train) == _metrics(often) == _metrics(rarely)
    assert train.episode_returns == often.episode_returns == rarely.episode_returns
    # and evaluation itself is the same protocol every time: same env seed, same generators
    assert often.evaluations[0]["mean"] == rarely.evaluations[0]["mean"]


@pytest.mark.slow
def test_a_benchmark_reports_the_random_policy_beside_the_trained_one(tiny, capsys):
    run = marlkit.run(agent="MAPPO", env="mpe_spread", mode="benchmark", seed=2,
                      **{**tiny, "runner.eval_episodes": 4})
    report = json.loads((run.run_dir / "benchmark.json").read_text())
    baseline = report["baseline"]
    assert set(baseline["mean"]) == set(baseline["std"]) == {"agents"}
    # the same statistics as an evaluation (its step and its timing are the run's, not the protocol's)
    assert set(baseline) >= set(report["evaluations"][0]) - {"step", "wall_time_s", "eval_s"}
    # mpe_spread: the random policy's return is a sum of negative distances over 25 steps
    assert -200 < baseline["mean"]["agents"] < -5 and baseline["std"]["agents"] > 0
    assert baseline["mean"] != report["evaluations"][0]["mean"]
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "eval return of group" in line)
    assert header.split()[-4:] == ["random", "final", "at", "best.pt"]
    row = next(line for line in out.splitlines() if line.strip().startswith("agents "))
    assert float(row.split()[1]) == pytest.approx(baseline["mean"]["agents"], abs=1e-3)
    # the same baseline for the same env and seed, whatever the agent learnt
    again = marlkit.run(agent="IPPO", env="mpe_spread", mode="benchmark", seed=2,
                        **{**tiny, "runner.eval_episodes": 4})
    assert again.baseline == baseline


def test_a_resumed_benchmark_keeps_its_baseline(tiny, monkeypatch):
    settings = {**tiny, "runner.total_steps": 40, "runner.save_interval": 40}
    half = marlkit.run(agent="MAPPO", env="mpe_spread", mode="benchmark", seed=2, **settings)
    from marlkit.runners import runner
    calls = []
    real = runner.random_policy
    monkeypatch.setattr(runner, "random_policy", lambda *a: (calls.append(1), real(*a))[1])
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 80})
    assert calls == [] and resumed.baseline == half.baseline
    assert json.loads((half.run_dir / "benchmark.json").read_text())["baseline"] == half.baseline


def test_the_random_baseline_does_not_replay_an_untrained_policys_moves():
    """On the same streams, Gumbel-max over an untrained policy's near-uniform logits and the random
    policy's argmax over uniforms pick the same actions; evaluated from the policy's seed, the
    random policy draws from streams offset from it (``RandomAgent.STREAM_OFFSET``)."""
    import numpy as np

    from marlkit.agents.base import Agent
    from marlkit.api import build_config
    from marlkit.envs.pettingzoo import PettingZooEnv
    from marlkit.registry import get_agent
    from mpe2 import simple_spread_v3

    env = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25))
    group, E = env.groups["agents"], 64
    cfg = build_config("MAPPO", "mpe_spread").agents["MAPPO"]
    policy = get_agent("MAPPO")(group, env.spec, cfg)
    random = get_agent("random")(group, env.spec, get_agent("random").config_cls())
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((E, 3, 18)).astype(np.float32)
    state = obs.reshape(E, -1)
    present, allowed = np.ones((E, 3), bool), np.ones((E, 3, 5), bool)

    def actions(agent, own_generators, seed=777):
        with own_generators(agent, seed):
            return agent.act(obs, state, present, allowed, None).actions

    moves = actions(policy, Agent.own_generators)
    assert (moves == actions(random, Agent.own_generators)).mean() > 0.9     # the coincidence
    assert (moves == actions(random, type(random).own_generators)).mean() < 0.5


def test_a_new_best_must_beat_the_old_one_by_more_than_the_noise():
    """Intervals are Student's t over the episodes; a later evaluation replaces the best only when
    its score is higher by more than 1.96 standard errors of the difference."""
    from marlkit.runners.statistics import beats, mean_ci
    mean, ci, se = mean_ci([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and se == pytest.approx(0.6455, abs=1e-4) and ci == pytest.approx(3.182 * se)
    assert mean_ci([5.0]) == (5.0, 0.0, 0.0)
    best = {"score": 1.0, "score_se": 0.5}
    assert not beats({"score": 2.3, "score_se": 0.5}, best)     # 1.3 < 1.96 * sqrt(0.5)
    assert beats({"score": 2.5, "score_se": 0.5}, best)         # 1.5 > 1.386
    assert not beats({"score": 0.9, "score_se": 0.0}, {"score": 1.0, "score_se": 0.0})
    assert beats({"score": 1.01, "score_se": 0.0}, {"score": 1.0, "score_se": 0.0})   # no noise: any gain


def test_benchmark_rows_carry_intervals_and_best_follows_the_rule(tiny):
    from conftest import best_by_the_rule
    run = marlkit.run(agent="MAPPO", env="mpe_spread", mode="benchmark", seed=3,
                      **{**tiny, "runner.total_steps": 200, "runner.eval_episodes": 6, "runner.eval_interval": 50})
    rows = run.evaluations
    assert len(rows) == 5 and all(r["episodes"] == 6 for r in rows)
    for r in rows:
        assert 0 < r["ci"]["agents"] and r["score_ci"] == pytest.approx(r["ci"]["agents"])
    assert run.best == best_by_the_rule(rows)
    assert torch.load(run.run_dir / "best.pt", weights_only=False)["steps"] == run.best["step"]
    # each row has the run's wall time when it began, the evaluations before it included, and its own
    walls = [r["wall_time_s"] for r in rows]
    assert walls == sorted(walls) and all(r["eval_s"] > 0 for r in rows)
    assert all(later - earlier >= r["eval_s"] for later, earlier, r in zip(walls[1:], walls, rows))


@pytest.mark.slow
def test_teams_that_play_each_other_are_chosen_on_their_returns_against_the_random_policy(tiny, env_yaml, capsys):
    """A zero-sum duel where both teams learn: their returns against each other sum to 0 whatever they
    learn, so best.pt would be chosen on noise (it kept the untrained step-0 policy in a two-team
    Unity scene); each team is evaluated against the random policy playing the other too, and best.pt
    is chosen on those returns."""
    path = env_yaml("toy_envs:duel", {"length": 6}, env={"groups": {"red": ["red_*"], "blue": ["blue_*"]}})
    run = marlkit.run(agent="MAPPO", env=path, mode="benchmark", seed=1, **{
        **tiny, "runner.total_steps": 1200, "runner.eval_interval": 400, "runner.eval_episodes": 8,
        "runner.horizon": 12, "agents.MAPPO.lr": 3e-3})
    rows = run.evaluations
    for row in rows:
        assert row["mean"]["red"] + row["mean"]["blue"] == pytest.approx(0.0, abs=1e-6)   # zero-sum
        assert set(row["vs_random"]) == {"red", "blue"}
        assert row["score"] == pytest.approx(np.mean([row["vs_random"][g]["mean"] for g in ("red", "blue")]))
    assert rows[-1]["score"] > rows[0]["score"] + 1.0          # both learned to play 1 against random play
    assert run.best["step"] > 0 and run.best["score"] >= rows[0]["score"] + 1.0
    out = capsys.readouterr().out
    assert "vs the random policy" in out and "red vs random " in out
    report = json.loads((run.run_dir / "benchmark.json").read_text())
    assert report["best_metric"] == ("mean return of the learning teams against the random policy playing the "
                                     "other teams")
    assert report["final"]["vs_random"]["red"]["mean"] > 1.0
