"""The one runner for every env: collect -> store -> update -> log, in train / test / benchmark mode.

It talks to envs through the vector-env contract and to algorithms through ``Agent``; it never
looks at which algorithm it drives.
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from marlkit.agents.base import Agent, Progress
from marlkit.config import RunConfig
from marlkit.errors import ConfigError, RunInterrupted, TrainingDivergedError
from marlkit.logger import Logger
from marlkit.runners.checkpoint import read_steps, restore_run_checkpoint, save_run_checkpoint
from marlkit.runners.collector import Collector
from marlkit.runners.double_buffered import DoubleBufferedCollector
from marlkit.runners.evaluation import (EvaluationStopped, Evaluator, best_metric_description, evaluation_line,
                                        mean_stats, random_policy, run_episodes)
from marlkit.runners.learner import Learner
from marlkit.runners.matches import build_opponents, match_lines, match_row
from marlkit.runners.report import write_benchmark_report, write_test_report, write_videos
from marlkit.runners.self_play import SelfPlay
from marlkit.runners.run_dir import discard_run_dir, keep_traceback, open_run_dir
from marlkit.runners.setup import build_parts, make_venv, prepare
from marlkit.runners.signals import StopRequest, terminate_as_interrupt
from marlkit.runners.statistics import beats
from marlkit.runners.train_state import TrainState
from marlkit.runners.worker_acting import WorkerCollector


@dataclass
class RunResult:
    run_dir: Path
    mode: str
    steps: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    episode_returns: list[dict[str, float]] = field(default_factory=list)
    evaluations: list[dict] = field(default_factory=list)
    baseline: dict | None = None    # the random policy under the evaluation protocol (benchmark mode)
    best: dict | None = None        # the evaluation best.pt holds (statistics.beats chose it)
    precision: dict[str, str] = field(default_factory=dict)   # per learning group, what its update computes in
    teams: dict[str, list[str]] = field(default_factory=dict)   # team -> its groups
    self_play: dict | None = None   # the league's ratings, pool and Elo curve (SelfPlay.summary)


class ProgressBar(tqdm):
    """tqdm without its monitor thread, which would outlive the run: env workers are forked only
    in a process with no other thread (``runner.start_method: auto``), so a second run in the same
    process would spawn them. One rate is shown, marlkit's own (``env-steps/s``: env steps of every
    env per wall second since the last log line), not tqdm's smoothed one beside it; where stderr is
    no terminal the bar is not drawn and ``line`` prints a line per log interval instead."""

    monitor_interval = 0
    FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"

    def __init__(self, total: int, initial: int, desc: str, show: bool, **kwargs):
        self.drawn = show and sys.stderr.isatty()
        self.lines = show and not self.drawn
        self.label, self.steps_total = desc, total
        super().__init__(total=total, initial=initial, desc=desc, disable=not self.drawn, bar_format=self.FORMAT,
                         **kwargs)

    def show(self, steps: int, figures: dict) -> None:
        """The log line's figures at ``steps``: beside the bar, or as a line of their own."""
        if self.drawn:
            self.set_postfix(figures, refresh=False)
        elif self.lines:
            done = f"{steps:,}/{self.steps_total:,} steps ({100 * steps / max(self.steps_total, 1):.0f}%)"
            print(f"{self.label}: {done}, " + ", ".join(f"{k} {v}" for k, v in figures.items()),
                  file=sys.stderr, flush=True)


class Runner:
    """Builds the vector env and one agent per group from a validated :class:`RunConfig`.

    Nothing is written to disk until the envs and agents are built (and, on resume, restored):
    a run that fails before its first step leaves no run directory behind, and a failed
    ``--resume`` leaves the run as it was.
    """

    def __init__(self, cfg: RunConfig, run_dir: Path | None = None):
        self.cfg = cfg
        self.loaded = prepare(cfg)   # the --load checkpoint, read once
        self.run_dir = run_dir
        self._saved_steps = 0   # env steps of the latest.pt on disk
        self.venv = None
        self.logger = None
        self.agents: dict[str, Agent] = {}
        self.agent_names: dict[str, str] = {}    # group -> the registered agent that drives it
        self.learning_groups: list[str] = []     # the groups whose agent learns and is trained
        self.teams: dict[str, list[str]] = {}    # team -> its groups: who shares a reward
        self.evaluator: Evaluator | None = None
        self.collector: Collector | None = None
        self.self_play: SelfPlay | None = None
        self.opponents: dict | None = None   # self-play: the fixed opponents of every evaluation
        # wall seconds of training so far, this process's and those before a resume (to the checkpoint
        # it resumed from): what a resumed run reports as its wall time, as if it had not stopped
        self._wall_time: Callable[[], float] | None = None

    def _build(self, num_envs: int | None = None, render: bool = False, vectorize: str | None = None) -> None:
        parts = build_parts(self.cfg, self.loaded, num_envs, render, vectorize)
        self.venv, self.agents = parts.venv, parts.agents
        self.agent_names, self.learning_groups, self.teams = parts.agent_names, parts.learning_groups, parts.teams

    def run(self) -> RunResult:
        """The run its config's ``mode`` asks for: ``test`` plays the checkpoint's episodes; ``train``
        trains; ``benchmark`` trains with evaluations and writes the report."""
        return self.test() if self.cfg.mode == "test" else self.train()

    # ------------------------------------------------------------------ train / benchmark

    def train(self) -> RunResult:
        cfg, rc = self.cfg, self.cfg.runner
        evaluate = cfg.mode == "benchmark"
        stop = StopRequest()
        state, finished, failure = None, False, None
        with terminate_as_interrupt():
            try:
                self._build()
                if cfg.self_play is not None:
                    self.self_play = SelfPlay(cfg.self_play, self.teams, self.agents, cfg.seed)
                    if evaluate:
                        self.opponents = build_opponents(cfg.self_play.opponents, self.venv.spec, cfg.env_name)
                self.evaluator = Evaluator(rc, cfg.seed, self.teams, self.learning_groups)
                # numbered after the training envs: both are open at once (fixed ports, worker ids)
                eval_venv = make_venv(cfg, min(rc.eval_parallels, rc.eval_episodes), vectorize="sync",
                                      first_index=rc.parallels) if evaluate else None
                try:
                    state = self._resume_state(Path(cfg.resume) / "latest.pt") if cfg.resume else self._fresh_state()
                    self.run_dir = open_run_dir(self.cfg, self.run_dir)
                    self.venv.log_to(self.run_dir)
                    if self.self_play is not None:
                        self.self_play.save_snapshots(self.run_dir, cfg.env_name)
                    self.logger = Logger(cfg.logger, self.run_dir, cfg.to_dict(), cfg.wandb_project)
                    result = RunResult(self.run_dir, cfg.mode, teams=self.teams, precision={
                        g: agent.precision for g, agent in self.agents.items() if agent.learns})
                    with stop.deferred():
                        self._train_loop(result, state, eval_venv, stop)
                    finished = True
                    if self.self_play is not None:
                        result.self_play = self.self_play.summary()
                    if evaluate:
                        chosen_on = (f"mean win rate against {', '.join(cfg.self_play.opponents)} in each seat"
                                     if self.self_play is not None else best_metric_description(
                                         rc.best_metric, self.agents, self.evaluator.learning_teams))
                        write_benchmark_report(cfg, result, chosen_on)
                finally:
                    if eval_venv is not None:
                        eval_venv.close()
            except KeyboardInterrupt as exc:
                if isinstance(exc, RunInterrupted):
                    raise
                raise RunInterrupted(self._interrupt_message(saved_now=False)) from None
            except Exception as exc:
                failure = exc
                raise
            finally:
                self.close()
                # a setting refused once the run was under way (self-play meeting rewards it cannot
                # rate) leaves nothing behind where nothing was saved yet
                refused = isinstance(failure, ConfigError) and self.run_dir is not None and \
                    not (self.run_dir / "latest.pt").is_file()
                if not finished and not cfg.resume and (state is None or state.steps == 0 or refused):
                    self._discard_run_dir()
                if failure is not None:
                    keep_traceback(failure, self.run_dir)
        return result

    def _discard_run_dir(self) -> None:
        if self.run_dir is not None:
            discard_run_dir(self.run_dir, self.cfg.runner.run_root)
            if not self.run_dir.exists():
                self.run_dir = None

    def _interrupt_message(self, saved_now: bool) -> str:
        latest = self.run_dir / "latest.pt" if self.run_dir is not None else None
        if latest is None or not latest.is_file():
            return "interrupted before the first checkpoint; nothing was saved"
        what = "saved" if saved_now else "the last checkpoint is"
        return (f"interrupted; {what} {latest} (step {read_steps(latest)} of {self.cfg.runner.total_steps}); "
                f"continue with: marlkit --resume {self.run_dir}")

    def _fresh_state(self) -> TrainState:
        obs = self.venv.reset(seed=self.cfg.seed * 10_000)
        return TrainState(obs, {g: a.initial_hidden(self.venv.num_envs) for g, a in self.agents.items()},
                          next_save=self.cfg.runner.save_interval)

    def _resume_state(self, path: Path) -> TrainState:
        state = restore_run_checkpoint(path, self.cfg, self.agents, self.agent_names, self.venv)
        self._saved_steps = state.steps
        if self.self_play is not None and state.self_play is not None:
            self.self_play.load_state_dict(state.self_play)
        return state

    def _checkpoint(self, path: Path, state: TrainState, venv_state: bytes | None, resumable: bool = True) -> None:
        """An overlapped run saves with the next rollout collected (``state.pending``); best.pt is
        never resumed from, so it goes without."""
        if self.collector is not None:
            carried = self.collector.state_dict()
            state.policy_streams, state.storage = carried["policy_streams"], carried["storage"]
        if self._wall_time is not None:
            state.wall_time_s = self._wall_time()
        if self.self_play is not None:
            state.self_play = self.self_play.state_dict()
        save_run_checkpoint(path, self.cfg, self.agents, state, venv_state, resumable)

    def _save_latest(self, state: TrainState) -> None:
        self._checkpoint(self.run_dir / "latest.pt", state, self.venv.state_dict())
        self._saved_steps = state.steps

    def _save_after_failure(self, state: TrainState) -> str:
        """Whatever stops a run (an env error, a dead worker, restarts exhausted) costs no more than
        the rollout in progress: the last rollout boundary is saved, without the envs, which are
        in no state to be snapshotted, so a resume starts fresh episodes. Returns what to tell the user."""
        latest = self.run_dir / "latest.pt"
        if state.steps > self._saved_steps:
            self._checkpoint(latest, state, None)
            self._saved_steps = state.steps
        if not latest.is_file():
            return "nothing was learned yet, so nothing was saved"
        return (f"the run up to step {self._saved_steps} is saved in {latest}; once the env is fixed, continue "
                f"with: marlkit --resume {self.run_dir}")

    def _train_loop(self, result: RunResult, state: TrainState, eval_venv, stop: StopRequest) -> None:
        """Collect a rollout, update on it, log, evaluate and save, until ``total_steps``. With
        ``runner.overlap`` the collector fills the next rollout (acting with the weights of the update
        before) while the learner updates on the last one; at every boundary both have finished,
        and a checkpoint holds the agents after that update and the next rollout, collected."""
        cfg, rc = self.cfg, self.cfg.runner
        E = self.venv.num_envs
        per_update = rc.horizon * E
        # total_steps is rounded up to whole rollouts; the bar shows the real end
        total = math.ceil(rc.total_steps / per_update) * per_update
        learning_groups = self.learning_groups
        overlap = rc.overlapped()
        collecting = (WorkerCollector if rc.acts_in_workers() else DoubleBufferedCollector if rc.double_buffer
                      else Collector)
        collector = self.collector = collecting(self.venv, self.agents, learning_groups, rc.horizon, overlap, rc.act_batch)
        collector.load_state_dict(state.policy_streams, state.storage)
        # with the envs in this process, the update and the next rollout take turns instead
        learner = Learner(self.agents, learning_groups, background=overlap and rc.envs_in_workers(),
                          threads=rc.update_threads)
        if self.self_play is not None:
            self.self_play.install(collector, learner)
        bar = ProgressBar(total=total, initial=state.steps, unit="step", show=rc.progress, dynamic_ncols=True,
                          desc=f"{cfg.agent}@{Path(cfg.env_name).stem}")
        # of the last log line
        clock = {"t": time.perf_counter(), "steps": state.steps, "updates": state.updates, "waited": 0.0}
        # env steps this process stepped: an overlapped run also holds the rollout past its last update
        collected = lambda: state.steps + (per_update if state.pending else 0)   # noqa: E731
        start_t, start_collected = clock["t"], collected()
        before = state.wall_time_s
        self._wall_time = lambda: before + time.perf_counter() - start_t   # noqa: E731
        try:
            if eval_venv is not None and state.steps >= state.next_eval:
                self._evaluate(state, eval_venv, result, stop)
            while state.steps < rc.total_steps:
                metrics = self._next_update(state, collector, learner, per_update, overlap, stop)
                finished_episodes = state.take_finished()
                if self.self_play is not None:
                    metrics.update(self.self_play.after_rollout(state.steps, finished_episodes, collector, learner))
                bar.update(per_update)
                result.metrics = metrics
                if state.steps >= state.next_log or state.steps >= rc.total_steps:
                    self._log(state, metrics, bar, clock, learner if overlap else None)
                finished = state.steps >= rc.total_steps
                if stop:
                    self._save_latest(state)
                    raise RunInterrupted(self._interrupt_message(saved_now=True))
                if eval_venv is not None and (state.steps >= state.next_eval or finished):
                    try:
                        self._evaluate(state, eval_venv, result, stop)
                    except EvaluationStopped:
                        self._save_latest(state)
                        raise RunInterrupted(self._interrupt_message(saved_now=True)) from None
                if state.steps >= state.next_save or finished:
                    self._save_latest(state)
                    state.next_save = state.steps + rc.save_interval
        except TrainingDivergedError as exc:
            kept = self.run_dir / "latest.pt"
            where = f"the last good checkpoint is {kept}" if kept.is_file() else "no checkpoint was written yet"
            # it diverged in the update of the rollout that ends per_update steps past the last boundary
            at = state.steps + per_update
            raise TrainingDivergedError(f"training stopped at step {at}: {exc}; {where}") from None
        except EvaluationStopped:
            raise RunInterrupted(self._interrupt_message(saved_now=False)) from None
        except ConfigError:
            raise
        except Exception as exc:
            saved_before = self._saved_steps
            note = self._save_after_failure(state)
            if stop:
                # the stop signal reached the env's own processes too (a signal to the process group)
                raise RunInterrupted(self._interrupt_message(saved_now=self._saved_steps != saved_before)) from None
            exc.add_note(note)
            raise
        finally:
            bar.close()
        result.steps = state.steps
        result.episode_returns = list(state.recent)
        # from the state, not from this process's evaluations: a run resumed at its end evaluates nothing
        result.evaluations, result.best, result.baseline = state.evaluations, state.best, state.baseline
        elapsed = time.perf_counter() - start_t
        result.metrics["perf/env_steps_per_s_overall"] = (collected() - start_collected) / max(elapsed, 1e-9)
        result.metrics["perf/wall_time_s"] = before + elapsed

    def _next_update(self, state: TrainState, collector: Collector, learner: Learner, per_update: int,
                     overlap: bool, stop: StopRequest) -> dict[str, float]:
        """One update on the rollout collected last (collected now, unless it waits in
        ``state.pending``), with ``overlap`` the next rollout collected beside it (after it where the
        learner does not run in the background: the collector acts with the weights of before the
        update until ``sync``, so the rollout is the same); -> the update's metrics and the recent
        episodes' returns and statistics."""
        total = self.cfg.runner.total_steps
        collected = state.pending or collector.collect(state, Progress(state.steps, total))
        steps = state.steps + per_update
        learner.start(collector.finish(collected), Progress(steps, total, stop_requested=stop.__bool__))
        # beside every update the next rollout, the last update's too: a checkpoint of an overlapped
        # run always holds it, so that a run resumed from it, or extended past its total_steps, goes
        # on exactly as one that never stopped
        pending = None
        try:
            if overlap:
                pending = collector.collect(state, Progress(steps, total))
        except Exception:
            # the update goes on to its end; a failure then finds the run at the boundary after it
            # (the rollout cut short is dropped)
            if learner.finish_quietly():
                state.steps, state.updates, state.pending = steps, state.updates + 1, None
            raise
        except BaseException:
            learner.finish_quietly()
            raise
        metrics = learner.finish()
        collector.sync(self.agents)
        # the state moves to the next rollout boundary in one go, so that a failure at any point
        # finds it consistent with the agents' weights
        state.steps, state.updates, state.pending = steps, state.updates + 1, pending
        if state.recent:
            for g in self.agents:
                metrics[f"{g}/episode_return"] = float(np.mean([r[g] for r in state.recent if g in r]))
        metrics.update({f"env/{k}": v for k, v in mean_stats(state.recent_stats).items()})
        return metrics

    def _log(self, state: TrainState, metrics: dict, bar, clock: dict, learner: Learner | None) -> None:
        """A log line (and the progress bar's figures): env-steps/s since the last one, worker
        restarts, and with overlap (``learner``) how long the collector waited for the update (> 0
        when the update is the slower of the two), with a hint, once, where that bounds the run."""
        now = time.perf_counter()
        metrics["perf/env_steps_per_s"] = (state.steps - clock["steps"]) / max(now - clock["t"], 1e-9)
        if learner is not None:
            metrics["perf/update_wait_s"] = learner.wait_s
            hint = learner.bound_hint(learner.waited_s - clock["waited"], now - clock["t"],
                                      state.updates - clock["updates"])
            if hint and not clock.get("hinted"):
                tqdm.write(hint)
                clock["hinted"] = True
            clock["waited"] = learner.waited_s
        clock.update(t=now, steps=state.steps, updates=state.updates)
        if self.venv.restarts:   # env workers replaced after a loss (vectorize: ray)
            metrics["env/worker_restarts"] = self.venv.restarts
        self.logger.log(metrics, state.steps)
        state.next_log = state.steps + self.cfg.runner.log_interval
        shown = {"env-steps/s": f"{metrics['perf/env_steps_per_s']:.0f}"}
        if self.venv.restarts:
            shown["restarts"] = self.venv.restarts
        if state.recent:
            shown.update({f"return/{g}": f"{metrics[f'{g}/episode_return']:.2f}" for g in self.agents})
        bar.show(state.steps, shown)

    def _evaluate(self, state: TrainState, eval_venv, result: RunResult, stop=None) -> None:
        rc, evaluator = self.cfg.runner, self.evaluator
        started = time.perf_counter()
        # the run's wall time when this evaluation began, evaluations before it included, and this
        # evaluation's own time: a curve against training time subtracts the evaluations before
        clock = {} if self._wall_time is None else {"wall_time_s": self._wall_time()}
        if state.baseline is None:   # once per run: a resumed run has it in its checkpoint
            state.baseline = evaluator.row(eval_venv, random_policy(eval_venv.spec), stop)
            self.logger.log({f"baseline/{g}/return": v for g, v in state.baseline["mean"].items()}, state.steps)
        if self.self_play is not None:
            row = {"step": state.steps, **match_row(evaluator, eval_venv, self.self_play, self.opponents, stop)}
        else:
            # rival teams that learn: each plays the random policy too
            opponents = random_policy(eval_venv.spec) if len(evaluator.learning_teams) > 1 else None
            row = {"step": state.steps, **evaluator.row(eval_venv, self.agents, stop, opponents)}
        stats = row.get("env", {})
        row.update(clock, eval_s=time.perf_counter() - started)
        state.evaluations.append(row)
        self.logger.log({**{f"eval/{g}/return": v for g, v in row["mean"].items()},
                         **{f"eval/team/{t}/return": v["mean"] for t, v in row["teams"].items()},
                         **{f"eval/vs/{m['opponent']}/{m['seat']}/win_rate": m["win"]
                            for m in row.get("matches", {}).values()},
                         "eval/score": row["score"], **{f"eval/env/{k}": v for k, v in stats.items()}}, state.steps)
        new_best = state.best is None or beats(row, state.best)
        if new_best:
            state.best = row
            self._checkpoint(self.run_dir / "best.pt", state, None, resumable=False)
        tqdm.write("\n".join([evaluation_line(row, state.baseline, new_best), *match_lines(row)]))
        state.next_eval = state.steps + rc.eval_interval

    # ------------------------------------------------------------------ test

    def test(self) -> RunResult:
        cfg, rc = self.cfg, self.cfg.runner
        finished = False
        with terminate_as_interrupt():
            try:
                self._build(rc.test_envs(cfg.render), render=cfg.render, vectorize="sync")
                self.run_dir = open_run_dir(self.cfg, self.run_dir)
                frames: dict[int, list] = {}

                def on_frame(episode: int) -> None:
                    if episode < rc.test_episodes:
                        frames.setdefault(episode, []).append(self.venv.render(0))

                episodes = run_episodes(self.venv, self.agents, rc.test_episodes, explore=not rc.eval_deterministic,
                                        seed=cfg.seed * 10_000 + 999, step_limit=rc.episode_step_limit,
                                        on_frame=on_frame if cfg.render else None)
                fps = rc.video_fps or self.venv.spec.render_fps
                finished = True
            except KeyboardInterrupt:
                raise RunInterrupted(f"interrupted during the {rc.test_episodes} test episodes of {cfg.load}; "
                                     "no results were written") from None
            finally:
                self.close()
                if not finished:
                    self._discard_run_dir()
        result = RunResult(self.run_dir, "test", episode_returns=[ep["return"] for ep in episodes])
        result.metrics = write_test_report(self.run_dir, cfg.load, cfg.agent, self.agents, episodes)
        if cfg.render:
            write_videos(self.run_dir, frames, fps)
        return result

    def close(self) -> None:
        if self.venv is not None:
            self.venv.close()
            self.venv = None
        if self.logger is not None:
            self.logger.close()
            self.logger = None
