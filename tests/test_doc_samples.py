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


@pytest.mark.slow
def test_the_docs_quote_what_the_commands_print_now():
    """Runs every sample's command (tictactoe's 60k-step benchmark, about a minute) under the
    default CPU kernels, and compares its figures with the docs'."""
    produced = {}
    for run in samples.SAMPLES.values():
        produced.update(samples.produce(run))
    texts = {p.name: p.read_text() for p in samples.documents()}
    assert samples.differences(texts, produced) == []
