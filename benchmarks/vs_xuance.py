"""Training throughput (env-steps/s) of marlkit's MAPPO vs XuanCe 1.4.4's MAPPO on MPE simple_spread_v3,
each with its own default config for that task, measured alternately in one invocation so both see the
same machine load.

    .venv/bin/python benchmarks/vs_xuance.py [--steps 100000] [--repeats 1] [--skip-install]
                                             [--xuance-threads N] [--set KEY=VALUE ...] [--tag NAME | --out FILE]

XuanCe runs in its own virtual environment, benchmarks/.xuance-venv, which this script creates on first
use (python3.11 -m venv; the local CPU build of torch 2.13.0 first, then xuance 1.4.4 with numpy<2 and
pettingzoo 1.24.4, whose pettingzoo.mpe provides XuanCe's MPE envs; torch stays pinned throughout).
--skip-install uses that venv as it is.

What is measured, per repeat and side, in a helper process of each side's own: env steps (vector steps
x parallel envs) divided by the wall time of the training loop alone, i.e. without imports, env or
worker start-up, or the final model save; and the helper's whole wall time (start-up included), for
the ratio by wall time:
- XuanCe: `get_runner(algo="mappo", env="mpe", env_id="simple_spread_v3")` with its default YAML
  (configs/mappo/mpe/simple_spread_v3.yaml), only `running_steps` set to --steps, device cpu, no
  rendering and its tensorboard logs in a temp dir; the timed call is `agent.train(running_steps //
  parallels)`, exactly what its runner's train mode does, run in a helper subprocess in that venv.
- marlkit: `marlkit.run(agent="MAPPO", env="mpe_spread")` with `runner.total_steps` set to --steps and
  no logger; its own `perf/env_steps_per_s_overall` metric times the same loop (which ends with one
  small checkpoint write).
The two defaults differ in more than the code (XuanCe: continuous actions, 16 subprocess envs, 1 epoch,
torch's default thread count; marlkit: discrete actions, 16 in-process envs, 10 epochs, 1 torch thread);
--xuance-threads N sets XuanCe's torch threads, which on a busy machine changes its throughput a lot.
The JSON records these config facts beside the samples, the medians, the ratio marlkit / xuance and the
final training return of each side (mean over agents, last 100 training episodes). Results go to
benchmarks/results/vs_xuance[_NAME].json.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

XUANCE_VERSION = "1.4.4"
TORCH_PIN = "torch==2.13.0"
HERE = Path(__file__).resolve().parent
VENV = HERE / ".xuance-venv"
VENV_PY = VENV / "bin" / "python"
INSTALLED_MARKER = VENV / f".installed-xuance-{XUANCE_VERSION}"

# Run with the XuanCe venv's python as `helper.py STEPS WORKDIR OUT_JSON [TORCH_THREADS]`; writes its
# measurement to OUT_JSON. Without TORCH_THREADS, torch keeps its own default thread count, as XuanCe does.
XUANCE_HELPER = '''
import json
import sys
import time
from argparse import Namespace

import numpy as np
import torch
import xuance
from xuance.common import MultiAgentBaseCallback


class EpisodeReturns(MultiAgentBaseCallback):
    """Collects each finished training episode's return, averaged over the agents."""

    def __init__(self):
        super().__init__()
        self.returns = []

    def on_train_episode_info(self, **kwargs):
        scores = kwargs["infos"][kwargs["env_id"]]["episode_score"]
        self.returns.append(float(np.mean(list(scores.values()))))


def main():
    steps, workdir, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if len(sys.argv) > 4:
        torch.set_num_threads(int(sys.argv[4]))
    overrides = Namespace(running_steps=steps, device="cpu", render=False, render_mode=None,
                          log_dir=f"{workdir}/logs", model_dir=f"{workdir}/models")
    runner = xuance.get_runner(algo="mappo", env="mpe", env_id="simple_spread_v3", parser_args=overrides)
    cfg, agent = runner.config, runner.agent
    agent.callback = returns = EpisodeReturns()
    vector_steps = max(1, cfg.running_steps // runner.n_envs)
    start_step = agent.current_step
    start = time.perf_counter()
    agent.train(vector_steps)
    elapsed = time.perf_counter() - start
    env_steps = agent.current_step - start_step
    agent.finish()
    runner.envs.close()
    recent = returns.returns[-100:]
    result = {
        "env_steps": int(env_steps), "train_seconds": elapsed, "env_steps_per_s": env_steps / elapsed,
        "final_train_return": float(np.mean(recent)) if recent else None,
        "config": {
            "parallels": runner.n_envs, "vectorize": cfg.vectorize, "continuous_action": cfg.continuous_action,
            "buffer_size": cfg.buffer_size, "rollout_steps_per_env": cfg.buffer_size // runner.n_envs,
            "n_epochs": cfg.n_epochs, "n_minibatch": cfg.n_minibatch, "learning_rate": cfg.learning_rate,
            "gamma": cfg.gamma, "representation_hidden_size": cfg.representation_hidden_size,
            "actor_hidden_size": cfg.actor_hidden_size, "critic_hidden_size": cfg.critic_hidden_size,
            "use_parameter_sharing": cfg.use_parameter_sharing, "logger": cfg.logger,
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        },
    }
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
'''


# Run with marlkit's python as `helper.py STEPS WORKDIR OUT_JSON OVERRIDES_JSON`: marlkit's side as a
# process of its own too, so that both sides' whole-process wall times compare.
MARLKIT_HELPER = '''
import json
import statistics
import sys

if __name__ == "__main__":   # marlkit's env workers import the main module again
    sys.path.insert(0, sys.argv[5])
    import harness
    steps, workdir, out, overrides = int(sys.argv[1]), sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    result = harness.train("MAPPO", "mpe_spread", steps, overrides)
    returns = [v for k, v in result.metrics.items() if k.endswith("/episode_return")]
    with open(out, "w") as f:
        json.dump({"env_steps": result.steps, "train_seconds": result.metrics["perf/wall_time_s"],
                   "env_steps_per_s": result.metrics["perf/env_steps_per_s_overall"],
                   "final_train_return": statistics.mean(returns) if returns else None}, f)
'''


class SetupError(RuntimeError):
    pass


def _run_step(name: str, cmd: list[str], log: Path) -> None:
    print(f"xuance venv: {name} ...", flush=True)
    with log.open("a") as f:
        f.write(f"\n$ {shlex.join(cmd)}\n")
        f.flush()
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise SetupError(
            f"setting up XuanCe failed at step '{name}' (exit {done.returncode}).\n"
            f"Command: {shlex.join(cmd)}\nLast lines of {log}:\n{tail}\n"
            f"Fix the cause and rerun the same command, which resumes the set-up; to start over: "
            f"rm -rf {VENV} && {shlex.join([sys.executable, *sys.argv])}")


def ensure_xuance_venv() -> None:
    """Create benchmarks/.xuance-venv with XuanCe and its MPE dependencies, unless already complete."""
    if INSTALLED_MARKER.is_file():
        return
    python311 = shutil.which("python3.11")
    if python311 is None:
        raise SetupError("python3.11 is needed to create the XuanCe venv but is not on PATH")
    log = HERE / "results" / "xuance-install.log.tmp"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    pip = [str(VENV_PY), "-m", "pip", "install", "--quiet"]
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(TORCH_PIN + "\n")
        if not VENV_PY.is_file():
            _run_step("create the venv", [python311, "-m", "venv", str(VENV)], log)
        _run_step(f"install {TORCH_PIN} (CPU build)", pip + [TORCH_PIN], log)
        _run_step(f"install xuance=={XUANCE_VERSION}",
                  pip + ["-c", str(constraints), f"xuance=={XUANCE_VERSION}", "numpy<2", "pettingzoo==1.24.4"], log)
        _run_step("check that xuance and pettingzoo.mpe import",
                  [str(VENV_PY), "-c", "import xuance, pettingzoo.mpe.simple_spread_v3"], log)
    INSTALLED_MARKER.touch()
    log.unlink()


def measure_process(side: str, cmd: list[str]) -> dict:
    """Run a helper process (``cmd`` + WORKDIR OUT_JSON ...); -> its measurement of the training
    loop, with ``process_seconds``: the helper's whole wall time (interpreter and library start-up,
    envs, training, the final save)."""
    with tempfile.TemporaryDirectory() as workdir:
        out = Path(workdir) / "result.json"
        start = time.perf_counter()
        done = subprocess.run([*cmd[:3], workdir, str(out), *cmd[3:]], cwd=workdir,
                              env={**os.environ, "TQDM_DISABLE": "1"}, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0 or not out.is_file():
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
            raise RuntimeError(f"the {side} run failed (exit {done.returncode}):\n{tail}")
        return {**json.loads(out.read_text()), "process_seconds": seconds}


def marlkit_config_facts(overrides: dict) -> dict:
    import torch

    from marlkit.api import build_config
    cfg = build_config("MAPPO", "mpe_spread", overrides=overrides)
    agent = cfg.agents["MAPPO"]
    return {"parallels": cfg.runner.parallels, "vectorize": cfg.runner.vectorize,
            "continuous_actions": cfg.env.kwargs.get("continuous_actions"),
            "rollout_steps_per_env": cfg.runner.horizon, "epochs": agent.epochs, "minibatches": agent.minibatches,
            "lr": agent.lr, "gamma": agent.gamma, "actor_hidden_sizes": agent.actor.hidden_sizes,
            "critic_hidden_sizes": agent.critic.hidden_sizes, "torch_threads": cfg.runner.torch_threads,
            "torch": torch.__version__}


def main() -> None:
    p = harness.parser(__doc__, repeats=1)
    p.add_argument("--steps", type=int, default=100_000, help="env steps per training run")
    p.add_argument("--skip-install", action="store_true", help="use benchmarks/.xuance-venv as it is")
    p.add_argument("--xuance-threads", type=int, default=None,
                   help="torch threads for XuanCe (default: torch's own, as XuanCe leaves it; marlkit uses "
                        "its runner.torch_threads, 1)")
    args = harness.parse_args(p)

    if args.skip_install:
        if not VENV_PY.is_file():
            sys.exit(f"--skip-install: {VENV} has no python; run once without --skip-install to create it")
    else:
        try:
            ensure_xuance_venv()
        except SetupError as exc:
            sys.exit(str(exc))

    with tempfile.TemporaryDirectory() as tmp:
        helpers = {"xuance": Path(tmp) / "xuance_mappo_mpe.py", "marlkit": Path(tmp) / "marlkit_mappo_mpe.py"}
        helpers["xuance"].write_text(XUANCE_HELPER)
        helpers["marlkit"].write_text(MARLKIT_HELPER)
        commands = {
            "xuance": [str(VENV_PY), str(helpers["xuance"]), str(args.steps)]
            + ([str(args.xuance_threads)] if args.xuance_threads else []),
            "marlkit": [sys.executable, str(helpers["marlkit"]), str(args.steps), json.dumps(args.overrides),
                        str(HERE)]}
        runs, _ = harness.measure({side: lambda side=side: measure_process(side, commands[side])
                                   for side in commands}, args.repeats)

    import marlkit
    med = {side: harness.median([run["env_steps_per_s"] for run in rs]) for side, rs in runs.items()}
    final_return = {side: rs[-1]["final_train_return"] for side, rs in runs.items()}
    ratio = med["marlkit"] / med["xuance"]
    process = {side: harness.median([run["process_seconds"] for run in rs]) for side, rs in runs.items()}
    process_ratio = process["xuance"] / process["marlkit"]
    out = harness.write_results("vs_xuance", args, {
        "task": "MAPPO on MPE simple_spread_v3 (N=3, 25 steps), each library's default config",
        "xuance_version": XUANCE_VERSION, "marlkit_version": marlkit.__version__,
        "steps_per_measurement": args.steps, "repeats": args.repeats,
        "config": {"xuance": runs["xuance"][0]["config"], "marlkit": marlkit_config_facts(args.overrides)},
        "marlkit_overrides": args.set,
        "samples_env_steps_per_s": {side: [run["env_steps_per_s"] for run in rs] for side, rs in runs.items()},
        "env_steps_done": {side: [run["env_steps"] for run in rs] for side, rs in runs.items()},
        "median_env_steps_per_s": med, "marlkit_over_xuance": ratio,
        "samples_process_seconds": {side: [run["process_seconds"] for run in rs] for side, rs in runs.items()},
        "median_process_seconds": process, "xuance_over_marlkit_process_seconds": process_ratio,
        "final_train_return_last_run": final_return})
    harness.table(["MAPPO, simple_spread_v3", "env-steps/s, loop (median)", "whole process s (median)",
                   "final train return"],
                  [[f"XuanCe {XUANCE_VERSION}", med["xuance"], process["xuance"], final_return["xuance"]],
                   ["marlkit", med["marlkit"], process["marlkit"], final_return["marlkit"]]])
    print(f"marlkit / xuance = {ratio:.2f} by the training loop, {process_ratio:.2f} by whole-process wall time   "
          f"({args.steps} env steps x {args.repeats} per side; {out})")


if __name__ == "__main__":
    main()
