"""What a run leaves behind for people: the benchmark report, the learning curve, episode videos."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from marlkit.config import RunConfig


def write_benchmark_report(cfg: RunConfig, result, best_metric: str) -> None:
    """``benchmark.json``, ``learning_curve.png`` and a summary table on stdout; ``best_metric``
    says in words what the "best" evaluation was chosen on. The random policy's evaluation
    (``baseline``) stands beside the trained one in all three."""
    evals, baseline = result.evaluations, result.baseline
    best = max(evals, key=lambda r: r["score"]) if evals else None
    report = {"agent": cfg.agent, "env": cfg.env_name, "seed": cfg.seed, "steps": result.steps,
              "best_metric": best_metric,
              "env_steps_per_s": result.metrics.get("perf/env_steps_per_s_overall"),
              "wall_time_s": result.metrics.get("perf/wall_time_s"),
              "best": best, "final": evals[-1] if evals else None, "baseline": baseline, "evaluations": evals,
              "best_checkpoint": str(result.run_dir / "best.pt")}
    (result.run_dir / "benchmark.json").write_text(json.dumps(report, indent=2))
    _plot_learning_curve(cfg, evals, baseline, result.run_dir / "learning_curve.png")
    print(f"\nbenchmark: {cfg.agent} on {Path(cfg.env_name).stem}, {result.steps} env steps, "
          f"{report['env_steps_per_s'] or 0:.0f} env-steps/s")
    print(f"  {'eval return of group':<22}{'random':>12}{'final':>12}{'at best.pt':>12}")
    for g in (best["mean"] if best else {}):
        random = f"{baseline['mean'][g]:>12.3f}" if baseline and g in baseline["mean"] else f"{'-':>12}"
        print(f"  {g:<22}{random}{evals[-1]['mean'][g]:>12.3f}{best['mean'][g]:>12.3f}")
    # the env's own numbers per episode (Doom's kills, a turn-based game's wins), where it counts any
    stats = evals[-1].get("env", {}) if evals else {}
    if stats:
        print(f"  {'env statistic':<22}{'random':>12}{'final':>12}{'at best.pt':>12}")
    for k, v in stats.items():
        random = f"{baseline['env'][k]:>12.3f}" if baseline and k in baseline.get("env", {}) else f"{'-':>12}"
        at_best = f"{best['env'][k]:>12.3f}" if best and k in best.get("env", {}) else f"{'-':>12}"
        print(f"  {k:<22}{random}{v:>12.3f}{at_best}")
    if best:
        print(f"  best.pt: step {best['step']}, chosen on the {best_metric} (runner.best_metric)")
    print(f"  report: {result.run_dir / 'benchmark.json'}")


def _plot_learning_curve(cfg: RunConfig, evals: list[dict], baseline: dict | None, path: Path) -> None:
    """Each group's evaluation return (mean +- std) over env steps, the random policy's as a dashed
    line in the same colour; a second panel with kills when the env counts them (Doom)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    kills = bool(evals) and all("kills" in r.get("env", {}) for r in evals)
    fig, axes = plt.subplots(1, 2 if kills else 1, figsize=(12 if kills else 7, 4), squeeze=False)
    ax = axes[0][0]
    steps = np.array([r["step"] for r in evals])
    for g in (evals[0]["mean"] if evals else {}):
        mean = np.array([r["mean"][g] for r in evals])
        std = np.array([r["std"][g] for r in evals])
        line, = ax.plot(steps, mean, label=g)
        ax.fill_between(steps, mean - std, mean + std, alpha=0.2, color=line.get_color())
        if baseline and g in baseline["mean"]:
            ax.axhline(baseline["mean"][g], color=line.get_color(), linestyle="--", label=f"{g} (random)")
    ax.set_xlabel("env steps")
    ax.set_ylabel("eval return (mean over agents)")
    ax.set_title(f"{cfg.agent} on {Path(cfg.env_name).stem}, seed {cfg.seed}")
    ax.grid(alpha=0.3)
    if evals:
        ax.legend()
    if kills:
        ax = axes[0][1]
        ax.plot(steps, [r["env"]["kills"] for r in evals], label=cfg.agent)
        if baseline and "kills" in baseline.get("env", {}):
            ax.axhline(baseline["env"]["kills"], color="gray", linestyle="--", label="random")
        ax.set_xlabel("env steps")
        ax.set_ylabel("kills per episode")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_video(stem: Path, frames: list, fps: int) -> Path | None:
    """``stem.mp4``, or ``stem.gif`` where no ffmpeg plugin is installed."""
    if not frames:
        return None
    import imageio.v2 as imageio
    try:
        path = stem.with_suffix(".mp4")
        imageio.mimsave(path, frames, fps=fps)
    except Exception:  # no ffmpeg plugin: a gif needs nothing extra
        path.unlink(missing_ok=True)
        path = stem.with_suffix(".gif")
        imageio.mimsave(path, frames, duration=1000 / fps, loop=0)
    return path
