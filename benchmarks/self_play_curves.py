"""The curves of self-play runs: the learner's Elo over training, and its win rate against each fixed
opponent in each seat at every evaluation, from the runs' ``benchmark.json``.

    python benchmarks/self_play_curves.py runs/connect_four/MAPPO/<run> [more runs] --out docs/img/connect_four_self_play.png

With several runs (seeds), each pairing's win rate is drawn per run, thin, and their mean bold.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def load(run: Path) -> dict:
    path = run / "benchmark.json" if run.is_dir() else run
    return json.loads(path.read_text())


def plot(reports: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (elo_ax, win_ax) = plt.subplots(1, 2, figsize=(13, 4.5))
    for report in reports:
        curve = np.array(report["self_play"]["elo_curve"])
        elo_ax.plot(curve[:, 0], curve[:, 1], lw=1, label=f"seed {report['seed']}")
    elo_ax.set_xlabel("env steps")
    elo_ax.set_ylabel("the learner's Elo (K 16, against its pool)")
    elo_ax.grid(alpha=0.3)
    elo_ax.legend()
    pairings = list(reports[0]["evaluations"][-1]["matches"])
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for colour, name in zip(colours, pairings):
        rows = []
        for report in reports:
            steps = [r["step"] for r in report["evaluations"]]
            rates = [r["matches"][name]["win"] for r in report["evaluations"]]
            rows.append(rates)
            if len(reports) > 1:
                win_ax.plot(steps, rates, color=colour, lw=0.6, alpha=0.5)
        width = min(len(r) for r in rows)
        steps = [r["step"] for r in reports[0]["evaluations"]][:width]
        win_ax.plot(steps, np.mean([r[:width] for r in rows], 0), color=colour, lw=2, label=f"vs {name}")
    win_ax.set_xlabel("env steps")
    win_ax.set_ylabel(f"win rate over {reports[0]['evaluations'][-1]['episodes']} games")
    win_ax.set_ylim(0, 1)
    win_ax.grid(alpha=0.3)
    win_ax.legend(fontsize=8)
    fig.suptitle(f"{reports[0]['agent']} in self-play on {reports[0]['env']}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (or their benchmark.json)")
    parser.add_argument("--out", type=Path, required=True, help="the figure to write")
    args = parser.parse_args()
    reports = [load(run) for run in args.runs]
    plot(reports, args.out)
    for report in reports:
        final, best = report["evaluations"][-1], report["best"]
        print(f"seed {report['seed']}: Elo {report['self_play']['elo']}, best.pt at step {best['step']}")
        for name, m in final["matches"].items():
            print(f"  vs {name}: final win {m['win']:.3f} [{m['win_low']:.3f}, {m['win_high']:.3f}], "
                  f"at best.pt {best['matches'][name]['win']:.3f}")


if __name__ == "__main__":
    main()
