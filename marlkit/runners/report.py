"""What a run leaves behind for people: the benchmark report, the learning curve, episode videos."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from marlkit.config import RunConfig


def write_benchmark_report(cfg: RunConfig, result) -> None:
    """``benchmark.json``, ``learning_curve.png`` and a summary table on stdout."""
    evals = result.evaluations
    best = max(evals, key=lambda r: r["score"]) if evals else None
    report = {"agent": cfg.agent, "env": cfg.env_name, "seed": cfg.seed, "steps": result.steps,
              "env_steps_per_s": result.metrics.get("perf/env_steps_per_s_overall"),
              "wall_time_s": result.metrics.get("perf/wall_time_s"),
              "best": best, "final": evals[-1] if evals else None, "evaluations": evals,
              "best_checkpoint": str(result.run_dir / "best.pt")}
    (result.run_dir / "benchmark.json").write_text(json.dumps(report, indent=2))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for g in (evals[0]["mean"] if evals else {}):
        steps = np.array([r["step"] for r in evals])
        mean = np.array([r["mean"][g] for r in evals])
        std = np.array([r["std"][g] for r in evals])
        ax.plot(steps, mean, label=g)
        ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("env steps")
    ax.set_ylabel("eval return (mean over agents)")
    ax.set_title(f"{cfg.agent} on {Path(cfg.env_name).stem}, seed {cfg.seed}")
    ax.grid(alpha=0.3)
    if evals:
        ax.legend()
    fig.tight_layout()
    fig.savefig(result.run_dir / "learning_curve.png", dpi=100)
    plt.close(fig)
    print(f"\nbenchmark: {cfg.agent} on {Path(cfg.env_name).stem}, {result.steps} env steps, "
          f"{report['env_steps_per_s'] or 0:.0f} env-steps/s")
    print(f"  {'group':<16}{'final':>12}{'best':>12}{'best @ step':>14}")
    for g in (best["mean"] if best else {}):
        print(f"  {g:<16}{evals[-1]['mean'][g]:>12.3f}{best['mean'][g]:>12.3f}{best['step']:>14}")
    print(f"  report: {result.run_dir / 'benchmark.json'}")


def write_video(run_dir: Path, frames: list, fps: int) -> Path | None:
    if not frames:
        return None
    import imageio.v2 as imageio
    try:
        path = run_dir / "episode.mp4"
        imageio.mimsave(path, frames, fps=fps)
    except Exception:  # no ffmpeg plugin: a gif needs nothing extra
        path = run_dir / "episode.gif"
        imageio.mimsave(path, frames, duration=1000 / fps, loop=0)
    return path
