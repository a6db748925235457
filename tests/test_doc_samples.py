"""The sample outputs quoted in the docs are what their commands print (docs/samples.py)."""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("doc_samples", ROOT / "docs" / "samples.py")
samples = importlib.util.module_from_spec(spec)
sys.modules["doc_samples"] = samples   # its dataclass looks its module up there
spec.loader.exec_module(samples)


def test_every_quoted_sample_is_made_by_a_run_and_every_run_is_quoted():
    made = {name for run in samples.SAMPLES.values() for name in run.spans}
    quoted = samples.spans()
    assert set(quoted) == made, (set(quoted) ^ made)


def test_a_changed_figure_is_found_and_a_new_speed_or_time_is_not():
    produced = {"s": "\n```\nbenchmark: X, 100 env steps, 899 env-steps/s\n  won 0.600\n"
                     "  report: runs/x/20261126-172857_seed1/benchmark.json\n```\n"}
    quoted = "a <!-- sample:s -->{}<!-- /sample:s --> b"
    same = quoted.format(produced["s"].replace("899", "1,204").replace("172857", "090000"))
    assert samples.differences({"doc.md": same}, produced) == []
    drifted = quoted.format(produced["s"].replace("0.600", "0.540"))
    (problem,) = samples.differences({"doc.md": drifted}, produced)
    assert problem.startswith("doc.md: sample 's'") and "0.540" in problem
    assert samples.rewrite(drifted, produced) == quoted.format(produced["s"])


@pytest.fixture(scope="module")
def executed():
    """Every sample's command, run once (tictactoe's 60k-step benchmark, about a minute) under the
    default CPU kernels: name -> (what it printed, its benchmark.json)."""
    return {name: samples.execute(run) for name, run in samples.SAMPLES.items()}


@pytest.mark.slow
def test_the_docs_quote_what_the_commands_print_now(executed):
    produced = {}
    for name, run in samples.SAMPLES.items():
        produced.update(samples.spans_of(run, *executed[name]))
    texts = {p.name: p.read_text() for p in samples.documents()}
    assert samples.differences(texts, produced) == []


@pytest.mark.slow
def test_mappo_learns_to_beat_a_random_player_at_tictactoe(executed):
    """The tictactoe sample is also the learning check of a turn-based game (an AECEnv, only the
    player to move acts): player_1 learns (MAPPO), player_2 plays at random, and --benchmark
    measures the random policy in both seats first, so player_1 then wins about 55-60% of its games;
    after the packaged 60k steps it wins far more, and its evaluation return rises with it."""
    _, report = executed["tictactoe"]
    random_wins, trained_wins = (report[row]["env"]["won_player_1"] for row in ("baseline", "final"))
    assert 0.4 < random_wins < 0.7
    assert trained_wins > 0.85 and trained_wins > random_wins + 0.2
    assert report["final"]["mean"]["player_1"] > report["baseline"]["mean"]["player_1"] + 0.4
