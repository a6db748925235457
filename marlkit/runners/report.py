"""What a run leaves behind for people: the benchmark report and its learning curve, the test
report, episode videos."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from marlkit.config import RunConfig
from marlkit.runners.statistics import mean_ci


def write_benchmark_report(cfg: RunConfig, result, best_metric: str) -> None:
    """``benchmark.json``, ``learning_curve.png`` and a summary table on stdout; ``best_metric``
    says in words what the "best" evaluation was chosen on. The random policy's evaluation
    (``baseline``) stands beside the trained one in all three."""
    evals, baseline, best = result.evaluations, result.baseline, result.best
    report = {"agent": cfg.agent, "env": cfg.env_name, "seed": cfg.seed, "steps": result.steps,
              "teams": result.teams, "best_metric": best_metric, "best_rule": BEST_RULE,
              "env_steps_per_s": result.metrics.get("perf/env_steps_per_s_overall"),
              "wall_time_s": result.metrics.get("perf/wall_time_s"),
              "device": cfg.device, "precision": result.precision,   # what the speed was measured with
              "best": best, "final": evals[-1] if evals else None, "baseline": baseline, "evaluations": evals,
              "best_checkpoint": str(result.run_dir / "best.pt")}
    if result.self_play is not None:
        report["self_play"] = result.self_play
    shared = any(len(members) > 1 for members in result.teams.values())   # a team of several groups
    _plot_learning_curve(cfg, evals, baseline, result.run_dir / "learning_curve.png", by_team=shared)
    # last and whole (a study takes a run with benchmark.json for finished): a run stopped while
    # it reports leaves none, and reports again when resumed
    partial = result.run_dir / "benchmark.json.partial"
    partial.write_text(json.dumps(report, indent=2))
    os.replace(partial, result.run_dir / "benchmark.json")
    print(f"\nbenchmark: {cfg.agent} on {Path(cfg.env_name).stem}, {result.steps} env steps, "
          f"{report['env_steps_per_s'] or 0:.0f} env-steps/s")
    print(f"  mean ± 95% interval over {evals[-1]['episodes'] if evals else 0} episodes per evaluation")
    print(f"  {'eval return of group':<22}{'random':>18}{'final':>18}{'at best.pt':>18}")
    for g in (best["mean"] if best else {}):
        print(f"  {g:<22}{_cell(baseline, 'mean', 'ci', g)}{_cell(evals[-1], 'mean', 'ci', g)}"
              f"{_cell(best, 'mean', 'ci', g)}")
    if shared and best:
        print(f"  {'eval return of team':<22}{'random':>18}{'final':>18}{'at best.pt':>18}")
        for t in result.teams:
            print(f"  {t:<22}{_cell(_teams(baseline), 'm', 'c', t)}{_cell(_teams(evals[-1]), 'm', 'c', t)}"
                  f"{_cell(_teams(best), 'm', 'c', t)}")
    # the env's own numbers per episode (Doom's kills, a turn-based game's wins), where it counts any
    stats = evals[-1].get("env", {}) if evals else {}
    if stats:
        print(f"  {'env statistic':<22}{'random':>18}{'final':>18}{'at best.pt':>18}")
    for k in stats:
        print(f"  {k:<22}{_cell(baseline, 'env', 'env_ci', k)}{_cell(evals[-1], 'env', 'env_ci', k)}"
              f"{_cell(best, 'env', 'env_ci', k)}")
    # teams that learn against each other: each against the random policy playing the others
    vs_random = evals[-1].get("vs_random", {}) if evals else {}
    if vs_random:
        print(f"  {'vs the random policy':<22}{'':>18}{'final':>18}{'at best.pt':>18}")
    for t in vs_random:
        print(f"  {t:<22}{'':>18}{_cell(_teams(evals[-1], 'vs_random'), 'm', 'c', t)}"
              f"{_cell(_teams(best, 'vs_random'), 'm', 'c', t)}")
    # a self-play run: the learner in each seat against each fixed opponent
    matches = evals[-1].get("matches", {}) if evals else {}
    if matches:
        print(f"  {'win rate (95% interval)':<36}{'final':>22}{'at best.pt':>22}")
    for name, m in matches.items():
        at_best = (best or {}).get("matches", {}).get(name)
        print(f"  {'vs ' + name:<36}{_rate(m):>22}{_rate(at_best):>22}")
    if result.self_play is not None:
        sp = result.self_play
        ratings = ", ".join(f"{key} {elo:.0f}" for key, elo in sp["elo"].items())
        pool = "; ".join(f"{key}: " + ", ".join(f"step {e['step']} {e['elo']:.0f}" for e in entries)
                         for key, entries in sp["pool"].items())
        print(f"  self-play Elo (K {sp['k']:g}, {sp['matches']} matches): {ratings}; pool: {pool}")
    if best:
        setting = "" if result.self_play is not None else " (runner.best_metric)"
        print(f"  best.pt: step {best['step']}, chosen on the {best_metric}{setting}; {BEST_RULE}")
    print(f"  report: {result.run_dir / 'benchmark.json'}")


BEST_RULE = ("a later evaluation replaces it only when its score is higher by more than the 95% interval of "
             "the difference (1.96 * sqrt(se_new^2 + se_best^2))")


def _rate(match: dict | None) -> str:
    if match is None:
        return "-"
    return f"{match['win']:.3f} [{match['win_low']:.2f}, {match['win_high']:.2f}]"


def _teams(row: dict | None, key: str = "teams") -> dict | None:
    """A row's per-team figures (``teams`` or ``vs_random``) as ``_cell`` reads them."""
    if not row or key not in row:
        return None
    return {"m": {t: v["mean"] for t, v in row[key].items()}, "c": {t: v["ci"] for t, v in row[key].items()}}


def _cell(row: dict | None, values: str, intervals: str, key: str) -> str:
    """``mean ± ci`` of ``key`` in a report row, right-aligned, or ``-`` where the row lacks it."""
    if not row or key not in row.get(values, {}):
        return f"{'-':>18}"
    ci = row.get(intervals, {}).get(key)
    return f"{row[values][key]:>10.3f} ± {ci:<5.3f}" if ci is not None else f"{row[values][key]:>18.3f}"


def _plot_learning_curve(cfg: RunConfig, evals: list[dict], baseline: dict | None, path: Path,
                         by_team: bool = False) -> None:
    """Each group's evaluation return (``by_team``: each team's) as mean shaded over its 95%
    confidence interval over env steps, the random policy's as a dashed line in the same colour; a
    second panel with kills when the env counts them (Doom)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    kills = bool(evals) and all("kills" in r.get("env", {}) for r in evals)
    fig, axes = plt.subplots(1, 2 if kills else 1, figsize=(12 if kills else 7, 4), squeeze=False)
    ax = axes[0][0]
    steps = np.array([r["step"] for r in evals])
    rows = [_teams(r) if by_team else {"m": r["mean"], "c": r.get("ci", {})} for r in evals]
    random = (_teams(baseline) if by_team else {"m": baseline["mean"]}) if baseline else None
    for g in (rows[0]["m"] if rows else {}):
        mean = np.array([r["m"][g] for r in rows])
        ci = np.array([r["c"].get(g, 0.0) for r in rows])
        line, = ax.plot(steps, mean, label=f"team {g}" if by_team else g)
        ax.fill_between(steps, mean - ci, mean + ci, alpha=0.2, color=line.get_color())
        if random and g in random["m"]:
            ax.axhline(random["m"][g], color=line.get_color(), linestyle="--", label=f"{g} (random)")
    ax.set_xlabel("env steps")
    ax.set_ylabel("eval return of the team" if by_team else "eval return (mean over agents)")
    ax.set_title(f"{cfg.agent} on {Path(cfg.env_name).stem}, seed {cfg.seed}")
    ax.grid(alpha=0.3)
    if evals:
        ax.legend()
    if kills:
        ax = axes[0][1]
        kills_mean = np.array([r["env"]["kills"] for r in evals])
        kills_ci = np.array([r.get("env_ci", {}).get("kills", 0.0) for r in evals])
        line, = ax.plot(steps, kills_mean, label=cfg.agent)
        ax.fill_between(steps, kills_mean - kills_ci, kills_mean + kills_ci, alpha=0.2, color=line.get_color())
        if baseline and "kills" in baseline.get("env", {}):
            ax.axhline(baseline["env"]["kills"], color="gray", linestyle="--", label="random")
        ax.set_xlabel("env steps")
        ax.set_ylabel("kills per episode")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_test_report(run_dir: Path, checkpoint: str | None, agent: str, groups, episodes: list[dict]) -> dict:
    """``test.json`` and a table on stdout: per group its return over ``episodes`` (``run_episodes``'),
    and the env's statistics, each as mean ± 95% interval; -> ``{group}/return_mean`` per group."""
    summary, env = {}, {}
    for g in groups:
        values = np.array([ep["return"][g] for ep in episodes if g in ep["return"]])
        mean, ci, _ = mean_ci(values)
        summary[g] = {"mean": mean, "ci95": ci, "std": float(values.std()), "episodes": len(values)}
    for k in dict.fromkeys(k for ep in episodes for k in ep["stats"]):
        values = [ep["stats"][k] for ep in episodes if k in ep["stats"]]
        mean, ci, _ = mean_ci(values)
        env[k] = {"mean": mean, "ci95": ci, "episodes": len(values)}
    (run_dir / "test.json").write_text(json.dumps({"checkpoint": checkpoint, "agent": agent, "groups": summary,
                                                   "env": env}, indent=2))
    tested = str(checkpoint) if checkpoint else f"the {agent} policy"
    print(f"test of {tested} over {len(episodes)} episode{'' if len(episodes) == 1 else 's'} "
          "(mean ± 95% interval):")
    for g, s in summary.items():
        print(f"  {g:<16} return {s['mean']:9.3f} ± {s['ci95']:.3f}")
    for k, s in env.items():
        print(f"  {k:<16} {s['mean']:16.3f} ± {s['ci95']:.3f}")
    return {f"{g}/return_mean": s["mean"] for g, s in summary.items()}


def write_videos(run_dir: Path, frames: dict[int, list], fps: int) -> None:
    """``episode_<k>.mp4`` (or ``.gif``) per test episode ``k`` of ``frames``, and a line naming them."""
    videos = [write_video(run_dir / f"episode_{k + 1}", [f for f in shots if f is not None], fps)
              for k, shots in sorted(frames.items())]
    videos = [v for v in videos if v is not None]
    print(f"  videos: {len(videos)} in {run_dir} ({', '.join(v.name for v in videos)})" if videos
          else "  (the env rendered no frames)")


def write_video(stem: Path, frames: list, fps: int) -> Path | None:
    """``stem.mp4`` (H.264 through imageio's ffmpeg plugin, ``imageio-ffmpeg``, installed with
    marlkit), or ``stem.gif`` with one line saying why where that plugin is missing. Frames are
    padded to even sides, which H.264's 4:2:0 colour needs (imageio would otherwise resize them,
    with a warning)."""
    if not frames:
        return None
    import imageio.v2 as imageio
    try:
        import imageio_ffmpeg  # noqa: F401  (imageio's MP4 writer)
    except ImportError:
        path = stem.with_suffix(".gif")
        imageio.mimsave(path, frames, duration=1000 / fps, loop=0)
        print(f"marlkit: {path.name} is a GIF, not an MP4: the MP4 writer, imageio-ffmpeg, is not installed "
              "(pip install imageio-ffmpeg)", file=sys.stderr)
        return path
    path = stem.with_suffix(".mp4")
    imageio.mimsave(path, [_even(np.asarray(f)) for f in frames], fps=fps, codec="libx264", macro_block_size=1,
                    output_params=["-pix_fmt", "yuv420p"], ffmpeg_log_level="error")
    return path


def _even(frame: np.ndarray) -> np.ndarray:
    """``frame`` ``[H, W, ...]`` with its last row or column repeated where that side is odd."""
    odd = (frame.shape[0] % 2, frame.shape[1] % 2)
    if not any(odd):
        return frame
    return np.pad(frame, [(0, odd[0]), (0, odd[1])] + [(0, 0)] * (frame.ndim - 2), mode="edge")
