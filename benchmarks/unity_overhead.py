"""Steps/s of a Unity scene through marlkit vs a plain ``UnityEnvironment`` loop, random actions, on
the same scene (the stand-in player under ``tests/unity_standin/``), measured alternately in one
process so that both see the same machine load.

    python benchmarks/unity_overhead.py [--fields 1 8] [--envs 1 2] [--blocks 40] [--block-steps 50]
                                        [--tag NAME]

"plain" is what a hand-written mlagents loop does per step: ``get_steps`` and ``set_actions`` (random
actions from ``action_spec.random_action``) for every behaviour, then ``step``; with several envs
(scenes), each in turn. "marlkit" is the vector env the trainer uses (the unity adapter: agent
slots, masks, rewards, per-agent episode ends; batching, episode statistics and auto-reset), in
this process ("sync") and in worker processes, one per env ("subprocess", shared memory), the way
``runner.vectorize`` runs it; unity.yaml's default is 2 envs in workers. Both draw actions the
same way (uniform per branch, masks ignored, as ``random_action`` does), so with one env the
difference is the env stack alone. Rates are env-steps/s (a step of every env counts as E).
Writes benchmarks/results/unity_overhead[_NAME].json; the overhead is ``1 - marlkit / plain``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from marlkit.api import build_config
from marlkit.envs.factory import make_env_vector
from marlkit.envs.unity.env import free_port

STANDIN = str(Path(__file__).resolve().parent.parent / "tests" / "unity_standin" / "standin")
WARMUP = 20


class Plain:
    """A plain mlagents loop over its own scenes, stepped in turn."""

    def __init__(self, fields: int, envs: int):
        from mlagents_envs.environment import UnityEnvironment

        self.envs = []
        for _ in range(envs):
            self.envs.append(UnityEnvironment(file_name=STANDIN, base_port=free_port(), no_graphics=True,
                                              timeout_wait=60, additional_args=["--fields", str(fields)]))
            self.envs[-1].reset()
        self.names = list(self.envs[0].behavior_specs)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            for env in self.envs:
                for name in self.names:
                    decision, _terminal = env.get_steps(name)
                    env.set_actions(name, env.behavior_specs[name].action_spec.random_action(len(decision)))
                env.step()

    def close(self) -> None:
        for env in self.envs:
            env.close()


class Marlkit:
    """marlkit's vector env on its own scenes."""

    def __init__(self, fields: int, envs: int, vectorize: str):
        cfg = build_config("random", "unity", **{"env.file_name": STANDIN,
                                                 "env.additional_args": ["--fields", str(fields)],
                                                 "runner.parallels": envs, "runner.vectorize": vectorize})
        self.venv = make_env_vector(cfg.env, cfg.runner)
        self.rng = np.random.default_rng(0)
        self.nvec = {g: np.asarray(gs.action_space.nvec) for g, gs in self.venv.spec.groups.items()}
        self.shape = {g: (envs, gs.n_agents, len(self.nvec[g])) for g, gs in self.venv.spec.groups.items()}
        self.venv.reset(seed=0)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.venv.step({g: self.rng.integers(0, n, size=self.shape[g]) for g, n in self.nvec.items()})

    def close(self) -> None:
        self.venv.close()


def measure(fields: int, envs: int, blocks: int, block_steps: int) -> dict[str, list[float]]:
    """Env-steps/s per block of ``block_steps`` steps for each path; the paths take turns block by
    block, every scene open at once, so that the shared machine's load drifts over all of them alike."""
    paths = {"plain": Plain(fields, envs)}
    try:
        paths["marlkit_sync"] = Marlkit(fields, envs, "sync")
        paths["marlkit_subprocess"] = Marlkit(fields, envs, "subprocess")
        for path in paths.values():
            path.run(WARMUP)
        rows = {name: [] for name in paths}
        for _ in range(blocks):
            for name, path in paths.items():
                start = time.perf_counter()
                path.run(block_steps)
                rows[name].append(envs * block_steps / (time.perf_counter() - start))
        return rows
    finally:
        for path in paths.values():
            path.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fields", type=int, nargs="+", default=[1, 8],
                        help="fields in the scene (4 agents each; 8 is SoccerTwos' 32 agents)")
    parser.add_argument("--envs", type=int, nargs="+", default=[1], help="envs (scenes) per path")
    parser.add_argument("--blocks", type=int, default=40, help="turns per path")
    parser.add_argument("--block-steps", type=int, default=50, help="steps per turn")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    os.environ.setdefault("UNITY_STANDIN_PYTHON", sys.executable)
    out = Path(__file__).parent / "results" / f"unity_overhead{('_' + args.tag) if args.tag else ''}.json"
    report = {"scene": "tests/unity_standin (2 teams, 4 agents per field, MultiDiscrete [3,3,3] with masks, "
                       "2 vector sensors of 8 and 3 floats)",
              "blocks": args.blocks, "block_steps": args.block_steps, "scenes": {},
              "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}"}
    for fields, envs in itertools.product(args.fields, args.envs):
        rows = measure(fields, envs, args.blocks, args.block_steps)
        # overall rate per path: total steps over total time
        rate = {k: len(v) / sum(1 / x for x in v) for k, v in rows.items()}
        marlkit = [k for k in rows if k != "plain"]
        report["scenes"][f"{fields}_fields" + (f"_{envs}_envs" if envs > 1 else "")] = {
            "agents": 4 * fields, "envs": envs, "block_steps_per_s": rows, "steps_per_s": rate,
            "overhead": {k: 1 - rate[k] / rate["plain"] for k in marlkit},
            # the same figure from neighbouring blocks only (robust to slow load drift)
            "overhead_median_of_blocks": {k: 1 - statistics.median(a / b for a, b in zip(rows[k], rows["plain"]))
                                          for k in marlkit},
            "added_us_per_step": {k: 1e6 * (1 / rate[k] - 1 / rate["plain"]) for k in marlkit}}
        print(f"{fields} fields, {envs} envs: " + ", ".join(f"{k} {v:.0f} steps/s" for k, v in rate.items()),
              flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\n{'scene':<18}{'path':<22}{'steps/s':>10}{'overhead':>10}{'added/step':>12}")
    for name, scene in report["scenes"].items():
        for path, value in scene["steps_per_s"].items():
            over = f"{scene['overhead'][path]:.1%}" if path in scene["overhead"] else ""
            added = f"{scene['added_us_per_step'][path]:.0f} us" if path in scene["added_us_per_step"] else ""
            print(f"{name:<18}{path:<22}{value:>10.0f}{over:>10}{added:>12}")
    print("target: overhead <= 10%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
