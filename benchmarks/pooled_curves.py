"""MAPPO's pooled critic learning on several envs, one panel per env, one line per result file of
``benchmarks/learning.py`` (its first run; the label is the file's tag).

    python benchmarks/pooled_curves.py \
        mpe_spread=results/learning_pooled_mpe_spread.json,results/learning_mappo_s1_2m.json \
        mpe_tag=results/learning_pooled_mpe_tag.json pursuit=results/learning_pooled_pursuit.json \
        [--out docs/img/pooled_critic_learning.png] [--until 200000]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from learning_curves import run_curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("panels", nargs="+", metavar="ENV=RESULT[,RESULT...]")
    parser.add_argument("--out", type=Path, default=Path("docs/img/pooled_critic_learning.png"))
    parser.add_argument("--until", type=int, default=None, help="last env step drawn")
    args = parser.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.panels), figsize=(5 * len(args.panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], args.panels):
        env, files = panel.split("=", 1)
        for path in files.split(","):
            result = json.loads(Path(path).read_text())
            (agent, rows), = list(result["runs"].items())[:1]
            points, _ = run_curve(rows[0])
            points = [(s, v) for s, v in points if args.until is None or s <= args.until]
            label = Path(path).stem.removeprefix("learning_")
            ax.plot([s for s, _ in points], [v for _, v in points], "o-", ms=3, label=f"{agent} {label}")
        ax.set_title(env)
        ax.set_xlabel("env steps")
        ax.set_ylabel("eval return (first group, mean over its agents)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("MAPPO's pooled critic: evaluation return (one seed each; step 0 = untrained), 2-core CPU")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
