"""The one runner for every env: collect -> store -> update -> log, in train / test / benchmark mode.

It talks to envs through the vector-env contract and to algorithms through ``Agent``; it never
looks at which algorithm it drives.
"""
from __future__ import annotations

import json
import pickle
import random
import signal
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from marlkit.agents.base import Agent, Bootstrap, Progress, TrainingDivergedError
from marlkit.buffers import Transition
from marlkit.config import ConfigError, RunConfig, save_config
from marlkit.envs.core import EnvAPIError, Observation
from marlkit.envs.factory import make_env_vector
from marlkit.logger import Logger
from marlkit.registry import closest, get_agent
from marlkit.runners.checkpoint import load_checkpoint, save_checkpoint
from marlkit.runners.report import write_benchmark_report, write_video


@dataclass
class RunResult:
    run_dir: Path
    mode: str
    steps: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    episode_returns: list[dict[str, float]] = field(default_factory=list)
    evaluations: list[dict] = field(default_factory=list)


@contextmanager
def _terminate_as_interrupt():
    """SIGTERM unwinds like Ctrl+C, so env workers and game processes are closed on the way out."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def new_run_dir(cfg: RunConfig, suffix: str = "") -> Path:
    base = Path(cfg.runner.run_root) / Path(cfg.env_name).stem / cfg.agent
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        path = base / f"{stamp}{f'-{n}' if n else ''}_seed{cfg.seed}{suffix}"
        try:
            path.mkdir(parents=True, exist_ok=False)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a run directory under {base}")


class Runner:
    """Builds the vector env and one agent per group from a validated :class:`RunConfig`."""

    def __init__(self, cfg: RunConfig, run_dir: Path | None = None):
        self.cfg = cfg
        if cfg.runner.torch_threads:
            torch.set_num_threads(cfg.runner.torch_threads)
        self._seed_everything(cfg.seed)
        try:
            device = torch.device(cfg.device)
        except RuntimeError:
            raise ConfigError(f"device: {cfg.device!r} is not a torch device; use cpu, cuda or cuda:N") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device: {cfg.device!r} was asked for but CUDA is not available; use --device cpu")
        if cfg.mode == "test" and not cfg.load:
            raise ConfigError("--test needs a checkpoint: pass --load runs/<env>/<agent>/<run>/best.pt")
        if cfg.load:
            if not Path(cfg.load).is_file():
                raise FileNotFoundError(f"--load {cfg.load!r}: no such checkpoint file")
            load_checkpoint(cfg.load, cfg.env_name, {})  # a wrong file or env fails before anything starts
        self.run_dir = run_dir or new_run_dir(cfg, "_test" if cfg.mode == "test" else "")
        save_config(cfg, self.run_dir / "config.yaml")
        self.venv = None
        self.logger = None
        self.agents: dict[str, Agent] = {}

    @staticmethod
    def _seed_everything(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    # ------------------------------------------------------------------ building

    def _group_agent_names(self, groups) -> dict[str, str]:
        unknown = [g for g in self.cfg.groups if g not in groups]
        if unknown:
            raise ConfigError(f"groups: unknown group {unknown[0]!r}{closest(unknown[0], groups)}; this env's "
                              f"groups are {', '.join(groups)}")
        return {g: (self.cfg.groups[g].agent if g in self.cfg.groups and self.cfg.groups[g].agent
                    else self.cfg.agent) for g in groups}

    def _build_agents(self, spec, num_envs: int) -> dict[str, Agent]:
        """One agent per group; weights from ``--load`` (every group) or a group's own ``load``."""
        names = self._group_agent_names(spec.groups)
        run_ckpt = load_checkpoint(self.cfg.load, self.cfg.env_name, names) if self.cfg.load else None
        agents = {}
        for i, (g, gs) in enumerate(spec.groups.items()):
            cls = get_agent(names[g])
            agents[g] = cls(gs, spec.state_shape, self.cfg.agents[names[g]], num_envs, self.cfg.runner.horizon,
                            seed=self.cfg.seed * 1000 + i, device=self.cfg.device, state_dtype=spec.state_dtype)
            group_cfg = self.cfg.groups.get(g)
            ckpt = load_checkpoint(group_cfg.load, self.cfg.env_name, {g: names[g]}) \
                if group_cfg is not None and group_cfg.load else run_ckpt
            if ckpt is not None:
                agents[g].load_state_dict(ckpt["groups"][g], weights_only=True)
        return agents

    def _learning(self, g: str) -> bool:
        group_cfg = self.cfg.groups.get(g)
        return self.agents[g].learns and (group_cfg is None or group_cfg.train)

    def _make_venv(self, num_envs: int | None = None, render: bool = False, vectorize: str | None = None):
        runner = self.cfg.runner
        if vectorize is not None:
            runner = replace(runner, vectorize=vectorize)
        return make_env_vector(self.cfg.env, runner, num_envs, render)

    # ------------------------------------------------------------------ acting

    def _act(self, obs: Observation, hidden: dict, explore: bool) -> dict:
        return {g: agent.act(obs.obs[g], obs.state, obs.agent_mask[g], obs.action_mask[g], hidden[g], explore)
                for g, agent in self.agents.items()}

    @staticmethod
    def _advance_hidden(outs: dict, episode_end: np.ndarray) -> dict:
        hidden = {}
        for g, out in outs.items():
            h = out.hidden
            if h is not None and episode_end.any():
                h = h.copy()
                h[episode_end] = 0.0
            hidden[g] = h
        return hidden

    def run_episodes(self, venv, n_episodes: int, explore: bool, seed: int, on_frame=None) -> list[dict]:
        """Play exactly ``n_episodes`` (split evenly over the envs, so short episodes are not
        over-sampled) and return their per-group returns."""
        quota = np.full(venv.num_envs, n_episodes // venv.num_envs)
        quota[: n_episodes % venv.num_envs] += 1
        done = np.zeros(venv.num_envs, int)
        results: list[dict] = []
        obs = venv.reset(seed=seed)
        if on_frame is not None:
            on_frame()
        hidden = {g: a.initial_hidden(venv.num_envs) for g, a in self.agents.items()}
        limit = self.cfg.runner.episode_step_limit * int(quota.max())
        for _ in range(limit):
            if (done >= quota).all():
                break
            outs = self._act(obs, hidden, explore)
            res = venv.step({g: out.actions for g, out in outs.items()})
            if on_frame is not None:
                on_frame()
            for e, info in enumerate(res.infos):
                if "episode" in info and done[e] < quota[e]:
                    done[e] += 1
                    results.append({"return": info["episode"]["return"], "length": info["episode"]["length"]})
            hidden = self._advance_hidden(outs, res.episode_end)
            obs = res.next
        else:
            raise EnvAPIError(f"{int(done.sum())} of {n_episodes} episodes ended within {limit} steps per env; "
                              "an episode that never ends needs env.max_episode_steps (or raise "
                              "runner.episode_step_limit)")
        return results

    # ------------------------------------------------------------------ train / benchmark

    def train(self, evaluate: bool = False) -> RunResult:
        cfg, rc = self.cfg, self.cfg.runner
        result = RunResult(self.run_dir, cfg.mode)
        with _terminate_as_interrupt():
            try:
                self.venv = self._make_venv()
                self.agents = self._build_agents(self.venv.spec, self.venv.num_envs)
                self.logger = Logger(cfg.logger, self.run_dir, cfg.to_dict(), cfg.wandb_project)
                eval_venv = self._make_venv(min(rc.eval_parallels, rc.eval_episodes), vectorize="sync") \
                    if evaluate else None
                try:
                    self._train_loop(result, eval_venv)
                finally:
                    if eval_venv is not None:
                        eval_venv.close()
            finally:
                self.close()
        return result

    def _fresh_state(self) -> dict:
        obs = self.venv.reset(seed=self.cfg.seed * 10_000)
        return {"steps": 0, "updates": 0, "obs": obs,
                "hidden": {g: a.initial_hidden(self.venv.num_envs) for g, a in self.agents.items()},
                "recent": deque(maxlen=100), "episodes": 0, "best": None, "evaluations": [],
                "next_eval": 0, "next_save": self.cfg.runner.save_interval, "next_log": 0}

    def _resume_state(self, path: Path) -> dict:
        names = self._group_agent_names(self.venv.spec.groups)
        ckpt = load_checkpoint(path, self.cfg.env_name, names)
        for g, agent in self.agents.items():
            agent.load_state_dict(ckpt["groups"][g])
        state = pickle.loads(ckpt["runner"])
        if state.pop("venv"):
            self.venv.set_state(ckpt["venv"])
        else:
            state["obs"] = self.venv.reset(seed=self.cfg.seed * 10_000 + state["steps"])
            state["hidden"] = {g: a.initial_hidden(self.venv.num_envs) for g, a in self.agents.items()}
            tqdm.write("resume: the envs cannot be saved, so they start fresh episodes; "
                       "the run continues but is not bit-identical to an uninterrupted one")
        rng = ckpt["rng"]
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        return state

    def _checkpoint(self, path: Path, state: dict, venv_blob: bytes | None) -> None:
        runner_state = {**state, "venv": venv_blob is not None}
        save_checkpoint(path, {
            "env_name": self.cfg.env_name, "agent": self.cfg.agent, "config": self.cfg.to_dict(),
            "groups": {g: a.state_dict() for g, a in self.agents.items()},
            "runner": pickle.dumps(runner_state), "venv": venv_blob,
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}})

    def _train_loop(self, result: RunResult, eval_venv) -> None:
        cfg, rc = self.cfg, self.cfg.runner
        E = self.venv.num_envs
        state = self._resume_state(Path(cfg.resume) / "latest.pt") if cfg.resume else self._fresh_state()
        learners = [g for g in self.agents if self._learning(g)]
        bar = tqdm(total=rc.total_steps, initial=state["steps"], unit="step", disable=not rc.progress,
                   dynamic_ncols=True, desc=f"{cfg.agent}@{Path(cfg.env_name).stem}")
        last_t, last_steps = time.perf_counter(), state["steps"]
        start_t, start_steps = last_t, state["steps"]
        if eval_venv is not None and state["steps"] >= state["next_eval"]:
            self._evaluate(state, eval_venv, result)
        try:
            while state["steps"] < rc.total_steps:
                obs, hidden = state["obs"], state["hidden"]
                for _ in range(rc.horizon):
                    outs = self._act(obs, hidden, explore=True)
                    res = self.venv.step({g: out.actions for g, out in outs.items()})
                    for g in learners:
                        out = outs[g]
                        self.agents[g].store(Transition(
                            obs.obs[g], obs.state, obs.agent_mask[g], obs.action_mask[g], out.actions,
                            out.log_prob, out.value, res.reward[g], res.terminated[g], res.truncated[g],
                            res.episode_end, res.final.obs[g], res.final.state, hidden[g], out.hidden, out.extras))
                    for info in res.infos:
                        if "episode" in info:
                            state["recent"].append(info["episode"]["return"])
                            state["episodes"] += 1
                    hidden = self._advance_hidden(outs, res.episode_end)
                    obs = res.next
                state["steps"] += rc.horizon * E
                bar.update(rc.horizon * E)
                metrics = {}
                for g in learners:
                    update = self.agents[g].update(Bootstrap(obs.obs[g], obs.state, obs.agent_mask[g], obs.action_mask[g],
                                                   hidden[g]), Progress(state["steps"], rc.total_steps))
                    metrics.update({f"{g}/{k}": v for k, v in update.items()})
                state.update(obs=obs, hidden=hidden, updates=state["updates"] + 1)
                if state["recent"]:
                    for g in self.agents:
                        metrics[f"{g}/episode_return"] = float(np.mean([r[g] for r in state["recent"]]))
                result.metrics = metrics
                if state["steps"] >= state["next_log"] or state["steps"] >= rc.total_steps:
                    now = time.perf_counter()
                    metrics["perf/env_steps_per_s"] = (state["steps"] - last_steps) / max(now - last_t, 1e-9)
                    last_t, last_steps = now, state["steps"]
                    self.logger.log(metrics, state["steps"])
                    state["next_log"] = state["steps"] + rc.log_interval
                    shown = {"sps": f"{metrics['perf/env_steps_per_s']:.0f}"}
                    if state["recent"]:
                        shown["return"] = " ".join(f"{metrics[f'{g}/episode_return']:.2f}" for g in self.agents)
                    bar.set_postfix(shown, refresh=False)
                finished = state["steps"] >= rc.total_steps
                if eval_venv is not None and (state["steps"] >= state["next_eval"] or finished):
                    self._evaluate(state, eval_venv, result)
                if state["steps"] >= state["next_save"] or state["steps"] >= rc.total_steps:
                    self._checkpoint(self.run_dir / "latest.pt", state, self.venv.get_state())
                    state["next_save"] = state["steps"] + rc.save_interval
        except TrainingDivergedError as exc:
            kept = self.run_dir / "latest.pt"
            where = f"the last good checkpoint is {kept}" if kept.is_file() else "no checkpoint was written yet"
            raise TrainingDivergedError(f"training stopped at step {state['steps']}: {exc}; {where}") from None
        finally:
            bar.close()
        result.steps = state["steps"]
        result.episode_returns = list(state["recent"])
        result.evaluations = state["evaluations"]
        elapsed = time.perf_counter() - start_t
        result.metrics["perf/env_steps_per_s_overall"] = (state["steps"] - start_steps) / max(elapsed, 1e-9)
        result.metrics["perf/wall_time_s"] = elapsed

    def _evaluate(self, state: dict, eval_venv, result: RunResult) -> None:
        rc = self.cfg.runner
        episodes = self.run_episodes(eval_venv, rc.eval_episodes, explore=not rc.eval_deterministic,
                                     seed=self.cfg.seed * 10_000 + 777)
        row = {"step": state["steps"], "mean": {}, "std": {}}
        for g in self.agents:
            values = np.array([ep["return"][g] for ep in episodes])
            row["mean"][g], row["std"][g] = float(values.mean()), float(values.std())
        score = float(np.mean([row["mean"][g] for g in self.agents if self._learning(g)] or
                              list(row["mean"].values())))
        row["score"] = score
        state["evaluations"].append(row)
        self.logger.log({f"eval/{g}/return": row["mean"][g] for g in self.agents}, state["steps"])
        if state["best"] is None or score > state["best"]["score"]:
            state["best"] = row
            self._checkpoint(self.run_dir / "best.pt", state, None)
        state["next_eval"] = state["steps"] + rc.eval_interval

    def benchmark(self) -> RunResult:
        result = self.train(evaluate=True)
        write_benchmark_report(self.cfg, result)
        return result

    # ------------------------------------------------------------------ test

    def test(self) -> RunResult:
        cfg, rc = self.cfg, self.cfg.runner
        result = RunResult(self.run_dir, "test")
        with _terminate_as_interrupt():
            try:
                render = cfg.render
                self.venv = self._make_venv(1 if render else min(rc.eval_parallels, rc.test_episodes),
                                            render=render, vectorize="sync")
                self.agents = self._build_agents(self.venv.spec, self.venv.num_envs)
                fps = rc.video_fps or self.venv.spec.render_fps
                frames: list = []
                on_frame = (lambda: frames.append(self.venv.render(0))) if render else None
                episodes = self.run_episodes(self.venv, rc.test_episodes, explore=not rc.eval_deterministic,
                                             seed=cfg.seed * 10_000 + 999, on_frame=on_frame)
            finally:
                self.close()
        summary = {}
        for g in self.agents:
            values = np.array([ep["return"][g] for ep in episodes])
            summary[g] = {"mean": float(values.mean()), "std": float(values.std()), "episodes": len(values)}
            result.metrics[f"{g}/return_mean"] = summary[g]["mean"]
        result.episode_returns = [ep["return"] for ep in episodes]
        (self.run_dir / "test.json").write_text(json.dumps({"checkpoint": str(cfg.load), "groups": summary}, indent=2))
        print(f"test of {cfg.load} over {len(episodes)} episodes:")
        for g, s in summary.items():
            print(f"  {g:<16} return {s['mean']:9.3f} ± {s['std']:.3f}")
        if render:
            video = write_video(self.run_dir, [f for f in frames if f is not None], fps)
            print(f"  video: {video}" if video else "  (the env rendered no frames)")
        return result

    def close(self) -> None:
        if self.venv is not None:
            self.venv.close()
            self.venv = None
        if self.logger is not None:
            self.logger.close()
            self.logger = None
