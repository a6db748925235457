"""Self-play: Elo from match outcomes, the pool and its schedule, the learner's seat changes, exact
resume, acting in env workers, evaluation against fixed opponents, and refusals of what it cannot
rate."""
import json
import os
import pickle

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import marlkit
from conftest import assert_same_training
from forked_cli import run_marlkit
from marlkit.agents.connect_four_rules import choose
from marlkit.errors import ConfigError
from marlkit.runners.elo import DRAW, LOSS, WIN, elo_change, expected_score, match_result, rate_interval
from marlkit.runners.self_play import check_teams_for_self_play

AGENTS_OF = {"p0": ["a0"], "p1": ["a1"]}


def test_elo_moves_by_k_times_the_surprise_and_is_zero_sum():
    assert expected_score(1200, 1200) == 0.5
    assert expected_score(1600, 1200) == pytest.approx(1 / (1 + 10 ** -1))
    assert elo_change(1200, 1200, WIN, k=16) == 8.0
    assert elo_change(1200, 1200, DRAW, k=16) == 0.0
    # a favourite that wins gains little; the upset moves both by the rest of k
    favourite = elo_change(1600, 1200, WIN, k=16)
    assert favourite == pytest.approx(16 * (1 - 1 / 1.1)) and favourite + elo_change(1600, 1200, LOSS, k=16) == \
        pytest.approx(16 * (1 - 2 / 1.1))
    assert elo_change(1200, 1600, WIN, k=32) == pytest.approx(2 * elo_change(1200, 1600, WIN, k=16))


def test_win_rate_intervals_stay_inside_0_and_1():
    assert rate_interval(0, 50)[0] == 0.0 and 0.0 < rate_interval(0, 50)[1] < 0.1
    assert rate_interval(50, 50)[1] == 1.0 and 0.9 < rate_interval(50, 50)[0] < 1.0
    lo, hi = rate_interval(70, 100)
    assert lo < 0.7 < hi and hi - lo == pytest.approx(0.18, abs=0.01)


def test_a_winner_statistic_decides_else_zero_sum_returns_else_refused():
    won = {"return": {"p0": -1.0, "p1": 1.0}, "stats": {"won_a0": 1.0, "won_a1": 0.0}}
    assert match_result(won, ["p0"], ["p1"], AGENTS_OF) == WIN   # the env's word over the returns
    assert match_result(won, ["p1"], ["p0"], AGENTS_OF) == LOSS
    drawn = {"return": {"p0": 0.0, "p1": 0.0}, "stats": {"won_a0": 0.0, "won_a1": 0.0}}
    assert match_result(drawn, ["p0"], ["p1"], AGENTS_OF) == DRAW
    zero_sum = {"return": {"p0": 2.5, "p1": -2.5}}
    assert match_result(zero_sum, ["p0"], ["p1"], AGENTS_OF) == WIN
    assert match_result(zero_sum, ["p1"], ["p0"], AGENTS_OF) == LOSS
    with pytest.raises(ConfigError, match=r"not zero-sum \(an episode ended 3.000 to -1.000\)"):
        match_result({"return": {"p0": 3.0, "p1": -1.0}}, ["p0"], ["p1"], AGENTS_OF)


def test_self_play_refuses_other_than_two_teams_and_groups_that_do_not_learn():
    class Learner:
        learns, registered_name = True, "MAPPO"

    class Fixed:
        learns, registered_name = False, "random"

    with pytest.raises(ConfigError, match=r"this env has 1 \(agents: agents\): one team has no rival"):
        check_teams_for_self_play({"agents": ["agents"]}, {"agents": Learner()})
    with pytest.raises(ConfigError, match="this env has 3 .*a rating of three sides or more is not kept"):
        check_teams_for_self_play({"a": ["a"], "b": ["b"], "c": ["c"]}, {g: Learner() for g in "abc"})
    with pytest.raises(ConfigError, match="group 'b' is played by random, which does not learn"):
        check_teams_for_self_play({"a": ["a"], "b": ["b"]}, {"a": Learner(), "b": Fixed()})


def _board(mine=(), theirs=()):
    m, t = np.zeros((6, 7), np.int8), np.zeros((6, 7), np.int8)
    for r, c in mine:
        m[r, c] = 1
    for r, c in theirs:
        t[r, c] = 1
    return m, t


def test_the_scripted_connect_four_player_wins_if_it_can_and_blocks_if_it_must():
    allowed, flat = np.ones(7, bool), np.zeros(7)
    # three of its own in the bottom row, and three of theirs in column 6: it takes the win
    mine, theirs = _board(mine=[(5, 0), (5, 1), (5, 2)], theirs=[(5, 6), (4, 6), (3, 6)])
    assert choose(mine, theirs, allowed, flat) == 3
    # no win of its own: it blocks column 6
    mine, theirs = _board(mine=[(5, 0), (4, 0)], theirs=[(5, 6), (4, 6), (3, 6)])
    assert choose(mine, theirs, allowed, flat) == 6
    # a diagonal win lands on top of pieces
    mine, theirs = _board(mine=[(5, 0), (4, 1), (3, 2)], theirs=[(5, 1), (5, 2), (4, 2), (5, 3), (4, 3), (3, 3)])
    assert choose(mine, theirs, allowed, flat) == 3
    # nothing to win or block: the allowed column with the highest draw
    mine, theirs = _board(mine=[(5, 0)], theirs=[(5, 1)])
    scores = np.array([0.1, 0.9, 0.2, 0.3, 0.4, 0.5, 0.6])
    assert choose(mine, theirs, allowed, scores) == 1
    assert choose(mine, theirs, np.array([1, 0, 1, 1, 1, 1, 1], bool), scores) == 6


def _play(tiny, **extra):
    """A small self-play run on connect four: 2 envs x 16 steps a rollout (32 env steps)."""
    return marlkit.run(agent="MAPPO", env="connect_four", seed=3, **{
        **tiny, "runner.horizon": 16, "runner.total_steps": 256, "runner.eval_interval": 128,
        "runner.eval_episodes": 4, "runner.save_interval": 128, "self_play.save_steps": 64,
        "self_play.swap_steps": 32, "self_play.team_change": 128, "self_play.window": 2,
        "agents.MAPPO.epochs": 1, **extra})


def _checkpoint(run, name="latest.pt"):
    ckpt = torch.load(run.run_dir / name, weights_only=False)
    return ckpt, pickle.loads(ckpt["runner"])["self_play"]


def test_a_symmetric_game_keeps_one_pool_rates_every_match_and_evaluates_each_seat(tiny):
    run = _play(tiny, mode="benchmark", logger="tensorboard", **{"runner.log_interval": 64})
    league = run.self_play
    assert league["symmetric"] and list(league["pool"]) == ["shared"]
    # snapshots at 64, 128, 192, 256 (and the first at 0): the window keeps the last two
    assert [e["step"] for e in league["pool"]["shared"]] == [192, 256]
    # the learner took the other seat at 128 and came back at 256
    assert league["learning_team"] == "player_0"
    assert [s for s, _ in league["elo_curve"]] == list(range(0, 257, 32))
    assert league["matches"] > 0 and league["elo"]["shared"] != 1200.0
    report = json.loads((run.run_dir / "benchmark.json").read_text())
    assert report["self_play"]["elo"] == league["elo"]
    final = report["final"]
    assert sorted(final["matches"]) == ["connect_four_rules as player_0", "connect_four_rules as player_1",
                                        "random as player_0", "random as player_1"]
    for m in final["matches"].values():
        assert m["episodes"] == 4 and m["win"] + m["draw"] + m["loss"] == pytest.approx(1.0)
        assert m["win_low"] <= m["win"] <= m["win_high"]
    # the pool's snapshots are files of the run while it keeps them, each a frozen reference opponent
    assert sorted(p.name for p in (run.run_dir / "pool").iterdir()) == ["shared_step192.pt", "shared_step256.pt"]
    reference = str(run.run_dir / "pool" / "shared_step192.pt")
    against = _play(tiny, mode="benchmark", **{"runner.total_steps": 32, "self_play.opponents": [reference]})
    assert sorted(against.evaluations[-1]["matches"]) == [f"{reference} as player_0", f"{reference} as player_1"]
    # best.pt is chosen on the win rates against the fixed opponents, not on the Elo
    assert final["score"] == pytest.approx(np.mean([m["win"] for m in final["matches"].values()]))
    events = EventAccumulator(str(run.run_dir))
    events.Reload()
    elo = {e.step: e.value for e in events.Scalars("self_play/elo")}
    assert sorted(elo) == [32, 96, 160, 224, 256]   # every log line: the first rollout, then every 64 steps, the end
    assert elo[256] == pytest.approx(league["elo"]["shared"])
    curve = dict(league["elo_curve"])
    assert all(value == pytest.approx(curve[step]) for step, value in elo.items())
    assert [e.value for e in events.Scalars("eval/vs/connect_four_rules/player_1/win_rate")] == \
        [r["matches"]["connect_four_rules as player_1"]["win"] for r in run.evaluations]


def test_at_a_team_change_the_learner_moves_to_the_other_seat(tiny):
    run = _play(tiny, **{"runner.total_steps": 128})
    ckpt, league = _checkpoint(run)
    assert league["learning"] == "player_1"
    moved, kept = ckpt["groups"]["player_1"], ckpt["groups"]["player_0"]
    for name, tensor in kept["modules"].items():
        torch.testing.assert_close(moved["modules"][name], tensor, rtol=0, atol=0, msg=name)
    assert moved["optimizer"]["state"].keys() == kept["optimizer"]["state"].keys()


def test_an_asymmetric_game_keeps_a_pool_per_team_and_the_side_that_waits_does_not_learn(tiny):
    # a different agent per seat: two policies, each with its past
    run = _play(tiny, **{"runner.total_steps": 128, "groups.player_1.agent": "IPPO", "agents.IPPO.epochs": 1})
    ckpt, league = _checkpoint(run)
    assert sorted(league["pool"]) == ["player_0", "player_1"] and league["learning"] == "player_1"
    first = {team: entries[0] for team, entries in league["pool"].items()}
    assert first["player_1"]["step"] == 0
    waited = ckpt["groups"]["player_1"]["modules"]
    learned = ckpt["groups"]["player_0"]["modules"]
    for name, tensor in waited.items():
        torch.testing.assert_close(tensor, first["player_1"]["weights"][0][name], rtol=0, atol=0, msg=name)
    assert any(not torch.equal(tensor, first["player_0"]["weights"][0][name]) for name, tensor in learned.items())
    # the team that stopped learning put its last policy in its pool
    assert league["pool"]["player_0"][-1]["step"] == 128


@pytest.mark.exact
def test_a_resumed_run_goes_on_with_its_pool_ratings_and_schedule_exactly(tiny):
    full = _play(tiny, mode="benchmark")
    half = _play(tiny, mode="benchmark", **{"runner.total_steps": 160})
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 256})
    assert resumed.self_play == full.self_play
    for group in ("player_0", "player_1"):
        assert_same_training(full, resumed, group)
    (_, a), (_, b) = _checkpoint(full), _checkpoint(resumed)
    assert a["rng"] == b["rng"] and a["opponent"]["step"] == b["opponent"]["step"]
    for x, y in zip(a["pool"]["shared"], b["pool"]["shared"]):
        for name, tensor in x["weights"][0].items():
            torch.testing.assert_close(y["weights"][0][name], tensor, rtol=0, atol=0)
    # the stopped run also evaluated where it stopped (step 160)
    keep = ("step", "score", "matches", "mean")
    assert [{k: r[k] for k in keep} for r in full.evaluations] == \
        [{k: r[k] for k in keep} for r in resumed.evaluations if r["step"] != 160]


@pytest.mark.slow
def test_the_frozen_side_acts_with_its_snapshot_in_the_env_workers(tiny):
    """Acting in the env workers plays the same matches as acting here (act_batch makes the blocks
    alike), so the ratings agree exactly: the workers got the opponent's weights at every swap."""
    here = _play(tiny, **{"runner.vectorize": "sync", "runner.act_batch": 1})
    workers = _play(tiny, **{"runner.vectorize": "subprocess", "runner.act_in_workers": True,
                             "runner.act_batch": 1})
    assert workers.self_play["elo_curve"] == here.self_play["elo_curve"]
    assert workers.self_play["matches"] == here.self_play["matches"] > 0


def test_non_zero_sum_rewards_without_a_winner_are_refused(tiny, tmp_path):
    with pytest.raises(ConfigError, match="Elo needs a winner, but this env's rewards are not zero-sum"):
        marlkit.run(agent="MAPPO", env="mpe_tag", **{**tiny, "self_play.window": 2, "runner.total_steps": 400})
    assert not list((tmp_path / "runs").glob("mpe_tag/MAPPO/*"))   # refused before anything was saved


@pytest.mark.parametrize("args, says", [
    (["--env", "mpe_spread", "--set", "self_play.window=3"], "self_play plays two teams, but this env has 1"),
    (["--env", "connect_four", "--set", "self_play.window=0"], "self_play.window"),
    (["--env", "connect_four", "--set", "runner.overlap=true"], "set runner.overlap: false"),
    (["--env", "tictactoe"], "self_play: group 'player_2' is played by random"),
])
def test_bad_self_play_settings_are_one_line_and_exit_2(tmp_path, args, says):
    extra = ["--set", "self_play.k=16"] if args[1] == "tictactoe" else []
    done = run_marlkit(["--agent", "MAPPO", *args, *extra, "--set", f"runner.run_root={tmp_path}"],
                       env={**os.environ, "PYTHONPATH": os.path.dirname(__file__)}, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert not any(tmp_path.iterdir())
