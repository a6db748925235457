"""The sample outputs the docs quote, made by running their commands, so that they cannot drift.

A sample is a span of a markdown file (README.md, docs/*.md) between ``<!-- sample:NAME -->`` and
``<!-- /sample:NAME -->``. ``SAMPLES`` says which run makes each NAME and how its text is cut from
the run's output and benchmark.json.

    .venv/bin/python docs/samples.py            # run every sample's command, rewrite its spans
    .venv/bin/python docs/samples.py --check    # exit 1, naming each span that differs

The runs use ATen's default CPU kernels and MKL's strict mode (as the golden tests do), so they
print the same numbers on any x86-64 CPU. What differs between two runs on one machine (the
env-steps/s, the run directory's time) is written as measured and ignored by ``--check``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
EXACT = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE,STRICT"}
QUIET = ["--set", "logger=none", "runner.progress=false"]
SPAN = re.compile(r"<!-- sample:(?P<name>[\w.-]+) -->(?P<body>.*?)<!-- /sample:(?P=name) -->", re.S)
VOLATILE = [(re.compile(r"[\d,]+ env-steps/s"), "N env-steps/s"), (re.compile(r"\d{8}-\d{6}"), "<time>")]


@dataclass
class Run:
    """One command; ``spans`` make each sample's text from its output and the run's benchmark.json."""

    command: list[str]
    spans: dict[str, Callable[[str, dict], str]]


def summary_block(output: str, report: dict) -> str:
    """The summary ``--benchmark`` prints at its end, as a fenced block."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("benchmark: "))
    end = next(i for i in range(start, len(lines)) if lines[i].lstrip().startswith("report: "))
    return "\n```\n" + "\n".join(lines[start:end + 1]) + "\n```\n"


def win_rates(output: str, report: dict) -> str:
    won = lambda row: row["env"]["won_player_1"]  # noqa: E731
    return f"{won(report['baseline']):.0%} of games won to {won(report['final']):.0%}"


SAMPLES = {
    "tictactoe": Run(["marlkit", "--agent", "MAPPO", "--env", "tictactoe", "--benchmark"],
                     {"tictactoe_benchmark": summary_block, "tictactoe_win_rates": win_rates}),
}


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def spans() -> dict[str, list[Path]]:
    """Every sample name quoted in the docs, with the files quoting it."""
    found: dict[str, list[Path]] = {}
    for path in documents():
        for m in SPAN.finditer(path.read_text()):
            found.setdefault(m["name"], []).append(path)
    return found


def produce(run: Run) -> dict[str, str]:
    """Runs the command and cuts its spans."""
    return spans_of(run, *execute(run))


def spans_of(run: Run, output: str, report: dict) -> dict[str, str]:
    return {name: make(output, report) for name, make in run.spans.items()}


def execute(run: Run) -> tuple[str, dict]:
    """Runs the command in a scratch directory (so it prints ``runs/...`` paths) -> (what it printed,
    its benchmark.json)."""
    with tempfile.TemporaryDirectory(prefix="marlkit-samples-") as cwd:
        cmd = [sys.executable, "-m", *run.command, *QUIET]   # the marlkit of this interpreter
        done = subprocess.run(cmd, cwd=cwd, env={**os.environ, **EXACT}, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(run.command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
        found = re.search(r"report: (\S+)", done.stdout)
        if found is None:
            raise RuntimeError(f"{' '.join(run.command)} printed no 'report:' line:\n{done.stdout[-2000:]}")
        return done.stdout, json.loads((Path(cwd) / found[1]).read_text())


def normalised(text: str) -> str:
    for pattern, replacement in VOLATILE:
        text = pattern.sub(replacement, text)
    return text


def differences(texts: dict[str, str], produced: dict[str, str]) -> list[str]:
    """One line per span of ``texts`` (file name -> markdown) that differs from what was produced."""
    problems = []
    for file, text in texts.items():
        for m in SPAN.finditer(text):
            if m["name"] in produced and normalised(m["body"]) != normalised(produced[m["name"]]):
                problems.append(f"{file}: sample {m['name']!r} is {m['body']!r}, the command prints "
                                f"{produced[m['name']]!r}")
    return problems


def rewrite(text: str, produced: dict[str, str]) -> str:
    def body(m: re.Match) -> str:
        if m["name"] not in produced:
            return m[0]
        return f"<!-- sample:{m['name']} -->{produced[m['name']]}<!-- /sample:{m['name']} -->"
    return SPAN.sub(body, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="compare the docs with fresh outputs; change nothing")
    p.add_argument("samples", nargs="*", default=list(SAMPLES), help=f"runs to make (default: all of {list(SAMPLES)})")
    args = p.parse_args(argv)
    unknown = [s for s in args.samples if s not in SAMPLES]
    if unknown:
        p.error(f"unknown sample run(s) {unknown}; known: {list(SAMPLES)}")
    produced: dict[str, str] = {}
    for name in args.samples:
        print(f"running {' '.join(SAMPLES[name].command)} ...", file=sys.stderr)
        produced.update(produce(SAMPLES[name]))
    texts = {path.relative_to(ROOT).as_posix(): path.read_text() for path in documents()}
    if args.check:
        problems = differences(texts, produced)
        print("\n".join(problems) or f"the docs quote what {len(produced)} sample(s) print", file=sys.stderr)
        return 1 if problems else 0
    for file, text in texts.items():
        new = rewrite(text, produced)
        if new != text:
            (ROOT / file).write_text(new)
            print(f"rewrote {file}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
