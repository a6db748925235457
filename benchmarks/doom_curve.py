"""The learning curves of a Doom run from its TensorBoard events: episode return (mean over
players) and the team's kills per episode, in training and in the periodic evaluations, against
env steps, with the random policy's figures (from a doom_eval JSON) as reference lines.

    python benchmarks/doom_curve.py runs/doom_coop/MAPPO/<run> [--eval benchmarks/results/doom_eval.json]
                                    [--out docs/img/doom_learning_curve.png]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def scalars(run_dir: Path, tag: str) -> tuple[list[int], list[float]]:
    """One curve from all the run's events files; a resumed run wrote a new file from its last
    checkpoint on, so what an earlier file logged past that step is replaced (as TensorBoard does)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    points: list[tuple[int, float]] = []
    for events in sorted(run_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            new = [(e.step, e.value) for e in acc.Scalars(tag)]
            points = [p for p in points if p[0] < new[0][0]] + new
    return [s for s, _ in points], [v for _, v in points]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--eval", type=Path, help="a doom_eval JSON: draws the random policy's return")
    parser.add_argument("--out", type=Path, default=Path("docs/img/doom_learning_curve.png"))
    args = parser.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import yaml
    cfg = yaml.safe_load((args.run_dir / "config.yaml").read_text())
    random = json.loads(args.eval.read_text())["policies"]["random"]["over_seeds"] if args.eval else {}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (train_tag, eval_tag, metric, label) in zip(axes, [
            ("agents/episode_return", "eval/agents/return", "return", "episode return (mean over players)"),
            ("env/kills", "eval/env/kills", "kills", "monsters killed per episode (team)")]):
        ax.plot(*scalars(args.run_dir, train_tag), alpha=0.6, label="training episodes (last 100)")
        ax.plot(*scalars(args.run_dir, eval_tag), "o-",
                label=f"evaluation ({cfg['runner']['eval_episodes']} episodes)")
        if metric in random:
            ax.axhline(random[metric]["mean"], color="gray", ls="--",
                       label=f"random policy ({random[metric]['mean']:.2f}, {args.eval.name})")
        ax.set_xlabel("env steps (joint steps of all envs)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    env = cfg["env"]
    fig.suptitle(f"{cfg['agent']} on {cfg['env_name']} ({env['players']} players, {env['scenario']}, "
                 f"seed {cfg['seed']}, 2-core CPU)")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
