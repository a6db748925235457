"""The learning curve of a doom_coop run from its TensorBoard events: training episode return
(mean over players) and the periodic evaluation return, against env steps, with the random
policy's return (from a doom_eval JSON) as a reference line.

    python benchmarks/doom_curve.py runs/doom_coop/MAPPO/<run> [--eval benchmarks/results/doom_eval.json]
                                    [--out docs/img/doom_learning_curve.png]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def scalars(run_dir: Path, tag: str) -> tuple[list[int], list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    steps, values = [], []
    for events in sorted(run_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            for e in acc.Scalars(tag):
                steps.append(e.step)
                values.append(e.value)
    return steps, values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--eval", type=Path, help="a doom_eval JSON: draws the random policy's return")
    parser.add_argument("--out", type=Path, default=Path("docs/img/doom_learning_curve.png"))
    args = parser.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps, values = scalars(args.run_dir, "agents/episode_return")
    ax.plot(steps, values, alpha=0.6, label="training episodes (mean over players)")
    steps, values = scalars(args.run_dir, "eval/agents/return")
    ax.plot(steps, values, "o-", label="evaluation (4 episodes)")
    if args.eval:
        random = json.loads(args.eval.read_text())["policies"]["random"]["over_seeds"]["return"]
        ax.axhline(random["mean"], color="gray", ls="--", label=f"random policy ({random['mean']:.1f})")
    ax.set_xlabel("env steps (joint steps of all envs)")
    ax.set_ylabel("episode return")
    ax.set_title("MAPPO on doom_coop (2 players, deathmatch.cfg map, 2-core CPU)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
