"""What every benchmark script shares: the common options, the machine's description, alternating
measurement with medians, timing a whole process, training and random-action env-steps/s through
marlkit, the results file and a plain table. Scripts import it as a sibling module (``import
harness``; Python puts a script's own folder on sys.path). marlkit and torch are imported only by
the functions that need them, so that importing this module stays cheap.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

RESULTS = Path(__file__).resolve().parent / "results"
_LOAD_AT_START = os.getloadavg()


def parser(doc: str | None, repeats: int | None = 3, results: bool = True, overrides: bool = True):
    """An argument parser with the common options: ``--repeats`` (unless ``repeats`` is None),
    ``--tag``/``--out`` for the results file (with ``results``), ``--set KEY=VALUE`` (with ``overrides``)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if repeats is not None:
        p.add_argument("--repeats", type=int, default=repeats, help="alternating repeats of each measurement")
    if overrides:
        p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="marlkit config overrides")
    if results:
        p.add_argument("--tag", default="", help="write results/NAME_TAG.json (default: results/NAME_<date-time>.json)")
        p.add_argument("--out", type=Path, default=None, help="write the results to this file instead")
    return p


def parse_args(p: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """``p.parse_args``, plus ``args.overrides``: ``--set`` as the nested dict marlkit takes."""
    args = p.parse_args(argv)
    args.overrides = {}
    if getattr(args, "set", None):
        from marlkit.config import parse_set
        args.overrides = parse_set(args.set)
    return args


def machine() -> dict:
    """CPU model, cores, Python, torch and the load average when the script started."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import torch
    return {"cpu": cpu, "arch": platform.machine(), "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "load_average_at_start": [round(x, 2) for x in _LOAD_AT_START]}


def median(samples: list) -> Any:
    """The median of numbers, or per key of dicts (the keys whose every sample is a number)."""
    if samples and isinstance(samples[0], dict):
        return {k: statistics.median(s[k] for s in samples) for k in samples[0]
                if all(isinstance(s.get(k), (int, float)) and not isinstance(s.get(k), bool) for s in samples)}
    return statistics.median(samples)


def measure(sides: dict[str, Callable[[], Any]], repeats: int, label: str = "") -> tuple[dict, dict]:
    """Each side once per repeat, in turn, so that all see the same machine load; one progress line
    per repeat (a dict sample shows its ``env_steps_per_s``, else its ``wall_s``, else its first
    figure). Returns ``(samples, medians)`` by side."""
    def short(v):
        if isinstance(v, dict):
            v = v.get("env_steps_per_s", v.get("wall_s", next(iter(v.values()), None)))
        return f"{v:,.1f}" if isinstance(v, (int, float)) else str(v)

    samples: dict[str, list] = {name: [] for name in sides}
    for r in range(repeats):
        for name, side in sides.items():
            samples[name].append(side())
        print(f"{label}repeat {r + 1}/{repeats}: " + ", ".join(f"{n} {short(s[-1])}" for n, s in samples.items()),
              flush=True)
    return samples, {name: median(s) for name, s in samples.items()}


def time_process(cmd: list[str], **kwargs) -> float:
    """Wall seconds of ``cmd`` as a whole process, start-up included; its output is kept and shown
    only if it fails."""
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise RuntimeError(f"{shlex.join(cmd)} failed (exit {done.returncode}):\n{tail}")
    return seconds


def train(agent: str, env: str, steps: int, overrides: dict | None = None):
    """A training run of ``steps`` env steps (no logger, no progress bar, no periodic checkpoint, in a
    temporary run root); returns marlkit's RunResult."""
    import marlkit
    with tempfile.TemporaryDirectory() as root:
        return marlkit.run(agent=agent, env=env, logger="none", **{
            **(overrides or {}), "runner.total_steps": steps, "runner.progress": False, "runner.run_root": root,
            "runner.save_interval": 10 ** 9})


def train_steps_per_s(agent: str, env: str, steps: int, overrides: dict | None = None,
                      skip_updates: bool = False) -> float:
    """Env-steps/s of training, the loop alone (marlkit's ``perf/env_steps_per_s_overall``).
    ``skip_updates``: every on-policy update is replaced by nothing, while the agents act as in
    training: the pace collection alone allows, what any update beside it can at best reach."""
    with _updates_skipped() if skip_updates else contextlib.nullcontext():
        return train(agent, env, steps, overrides).metrics["perf/env_steps_per_s_overall"]


@contextlib.contextmanager
def _updates_skipped():
    from marlkit.agents.on_policy import OnPolicyAgent
    update = OnPolicyAgent.update
    OnPolicyAgent.update = lambda self, batch, progress=None: {}
    try:
        yield
    finally:
        OnPolicyAgent.update = update


def random_steps_per_s(cfg, steps: int, runner=None, stats: dict | None = None) -> float:
    """Env-steps/s of uniformly random actions through marlkit's vector env for ``cfg`` (``runner``:
    another runner section), about ``steps`` env steps. ``stats``, if given, receives the loop's
    ``seconds``, its ``env_steps`` and, where the backend counts them (Ray), ``bytes_per_vector_step``."""
    from marlkit.agents.random_policy import RandomAgent, RandomConfig
    from marlkit.envs.factory import make_env_vector
    venv = make_env_vector(cfg.env, runner or cfg.runner)
    try:
        agents = {g: RandomAgent(gs, venv.spec, RandomConfig(), seed=i)
                  for i, (g, gs) in enumerate(venv.spec.groups.items())}
        obs = venv.reset(seed=0)
        rounds = max(1, steps // venv.num_envs)
        moved = getattr(venv, "bytes_sent", 0) + getattr(venv, "bytes_received", 0)
        start = time.perf_counter()
        for _ in range(rounds):
            actions = {g: a.act(obs.obs[g], obs.state, obs.agent_mask[g], obs.action_mask[g], None).actions
                       for g, a in agents.items()}
            obs = venv.step(actions).next
        seconds = time.perf_counter() - start
        if stats is not None:
            ray = hasattr(venv, "bytes_sent")
            stats.update(seconds=seconds, env_steps=rounds * venv.num_envs, bytes_per_vector_step=(
                (venv.bytes_sent + venv.bytes_received - moved) / rounds if ray else None))
        return rounds * venv.num_envs / seconds
    finally:
        venv.close()


def value_at(curve: dict[int, float], step: int) -> float | None:
    """The evaluation nearest to ``step``, if one lies within 5% of it: runs with other rollout
    sizes evaluate at other multiples (MAT's 1,600-step rollouts: 460,800 and 512,000 around 500k)."""
    near = min(curve, key=lambda s: abs(s - step), default=None)
    return curve[near] if near is not None and abs(near - step) <= 0.05 * step else None


def write_results(name: str, args: argparse.Namespace, payload: dict) -> Path:
    """``results/NAME_TAG.json``, or ``results/NAME_<date-time>.json`` without ``--tag`` (a run never
    overwrites the figures the docs quote, which keep their own names), or ``--out``: the command
    line, the machine, then ``payload``."""
    tag = args.tag or time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or RESULTS / f"{name}_{tag}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"command": shlex.join(["python", *sys.argv]), "machine": machine(), **payload}
    out.write_text(json.dumps(record, indent=2))
    print(f"written {out}", flush=True)
    return out


def table(headers: list[str], rows: list[list]) -> None:
    """Print an aligned table: the first column left, the others right; numbers of 100 or more
    with thousands separators and no decimals, smaller ones to 3 significant digits."""
    def cell(v):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
        return "" if v is None else str(v)
    cells = [headers] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
