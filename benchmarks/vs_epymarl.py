"""marlkit's QMIX against EPyMARL's QMIX on Level-Based Foraging (lbforaging:Foraging-8x8-2p-2f-coop-v3,
50 steps, the agents' rewards summed): the greedy evaluation return over env steps, and the wall time of
each side's whole process for the same env steps.

    .venv/bin/python benchmarks/vs_epymarl.py --epymarl PATH --epymarl-python PYTHON [--steps 30000]
        [--eval-interval N] [--eval-episodes 100] [--seed 1] [--sides epymarl marlkit]
        [--set KEY=VALUE ...] [--tag NAME | --out FILE]

PATH is a checkout of EPyMARL (its src/main.py) and PYTHON the interpreter of a virtual environment that
runs it (sacred, pyyaml, numpy, gymnasium, lbforaging==2.0.0 and torch; setuptools<81 for sacred's
pkg_resources). Nothing of EPyMARL is copied here.

The sides run one after the other, each a process of its own, timed from its start to its exit:
- EPyMARL: `src/main.py --config=qmix --env-config=gymma with env_args.time_limit=50
  env_args.key=lbforaging:Foraging-8x8-2p-2f-coop-v3` as its README gives it, all else its qmix.yaml
  and default.yaml defaults, plus use_cuda=False, t_max, test_interval, test_nepisode and seed. It
  stops at the first episode's end at or past --steps (t_max = steps - 1, as its loop runs while
  t_env <= t_max). Its test returns are read from the run's sacred file storage (`-F DIR`, info.json:
  test_return_mean, the agents' rewards summed, greedy). It is started through a small launcher that
  (1) stands in an empty module for smaclite, which its envs package imports unconditionally and
  which no package registry carries; (2) after the last training episode, runs one more test of
  test_nepisode episodes if the last one is older than the final step, as marlkit evaluates at the
  end of a run, and records the final t_env.
- marlkit: `marlkit --agent QMIX --env lbf_8x8_2p_2f_coop --benchmark` with runner.total_steps,
  runner.eval_interval and runner.eval_episodes set to match and runner.eval_deterministic=true (its
  evaluation otherwise acts with epsilon_finish, where EPyMARL's tests are greedy), and the eval
  returns read from its benchmark.json (env/team_return: the agents' rewards summed).

Both test at the start and then every --eval-interval env steps (EPyMARL at the first episode end past
each multiple, marlkit at the first rollout boundary, 800 env steps). The EPyMARL side runs first, and
the results file is written after each side, so an interrupted run keeps what finished. Results go to
benchmarks/results/vs_epymarl[_NAME].json.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

TASK = "lbforaging:Foraging-8x8-2p-2f-coop-v3"
MARLKIT_ENV = "lbf_8x8_2p_2f_coop"
TIME_LIMIT = 50

# Run with EPyMARL's python as `launcher.py SRC T_ENV_JSON main.py-args...`.
EPYMARL_LAUNCHER = '''
import importlib.util
import json
import runpy
import sys
import types

src, t_env_out = sys.argv[1], sys.argv[2]
if importlib.util.find_spec("smaclite") is None:
    sys.modules["smaclite"] = types.ModuleType("smaclite")
sys.path.insert(0, src)

from runners.episode_runner import EpisodeRunner

close_env = EpisodeRunner.close_env


def close_env_after_final_test(self):
    # run_sequential closes the env right after its training loop; only then does it leave the
    # last steps untested
    tested = self.logger.stats.get("test_return_mean", [])
    if not tested or tested[-1][0] < self.t_env:
        for _ in range(max(1, self.args.test_nepisode // self.batch_size)):
            self.run(test_mode=True)
    with open(t_env_out, "w") as f:
        json.dump({"t_env": int(self.t_env)}, f)
    close_env(self)


EpisodeRunner.close_env = close_env_after_final_test
sys.argv = [src + "/main.py", *sys.argv[3:]]
runpy.run_path(src + "/main.py", run_name="__main__")
'''


def _scalar(v):
    # sacred's json keeps numpy floats as {"py/object": "numpy.float64", "value": x}
    return float(v["value"]) if isinstance(v, dict) else float(v)


def _run(side: str, cmd: list[str], cwd: str, log: Path) -> float:
    """Whole-process wall seconds of ``cmd``; its output goes to ``log`` (tail it to follow a long run)."""
    print(f"{side}: {shlex.join(cmd)}\n  output: {log}", flush=True)
    with log.open("w") as f:
        start = time.perf_counter()
        done = subprocess.run(cmd, check=False, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                              env={**os.environ, "TQDM_DISABLE": "1"})
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"the {side} run failed (exit {done.returncode}):\n{tail}")
    return seconds


def run_epymarl(args, workdir: Path) -> dict:
    launcher = workdir / "epymarl_launcher.py"
    launcher.write_text(EPYMARL_LAUNCHER)
    storage, t_env_out = workdir / "sacred", workdir / "t_env.json"
    settings = {"env_args.time_limit": TIME_LIMIT, "env_args.key": TASK, "use_cuda": False,
                "t_max": args.steps - 1, "test_interval": args.eval_interval,
                "test_nepisode": args.eval_episodes, "seed": args.seed}
    cmd = [str(args.epymarl_python), str(launcher), str(args.epymarl / "src"), str(t_env_out),
           "--config=qmix", "--env-config=gymma", "-F", str(storage),
           "with", *[f"{k}={v}" for k, v in settings.items()]]
    seconds = _run("epymarl", cmd, str(workdir), workdir / "epymarl.log")
    info = json.loads(next(storage.glob("*/info.json")).read_text())
    config = json.loads(next(storage.glob("*/config.json")).read_text())
    curve = [[int(t), _scalar(v)] for t, v in zip(info["test_return_mean_T"], info["test_return_mean"])]
    keys = ("agent", "hidden_dim", "use_rnn", "obs_agent_id", "obs_last_action", "mixer", "mixing_embed_dim",
            "hypernet_layers", "hypernet_embed", "lr", "batch_size", "buffer_size", "gamma", "double_q",
            "epsilon_start", "epsilon_finish", "epsilon_anneal_time", "target_update_interval_or_tau",
            "standardise_rewards", "standardise_returns", "grad_norm_clip", "batch_size_run", "runner",
            "test_nepisode", "test_interval", "t_max", "common_reward", "reward_scalarisation", "seed")
    return {"command": shlex.join(["python", "src/main.py", *cmd[4:]]), "process_seconds": seconds,
            "env_steps": json.loads(t_env_out.read_text())["t_env"], "eval_return": curve,
            "config": {k: config.get(k) for k in keys}}


def _git_source() -> dict:
    """The commit of this checkout and the files under marlkit/ that differ from it."""
    repo = Path(__file__).resolve().parent.parent

    def git(*a):
        done = subprocess.run(["git", *a], check=False, cwd=repo, capture_output=True, text=True)
        return done.stdout.rstrip("\n") if done.returncode == 0 else None
    changed = git("status", "--porcelain", "--", "marlkit")
    return {"commit": git("rev-parse", "HEAD"),
            "marlkit_changed": [line[3:] for line in changed.splitlines()] if changed else []}


def run_marlkit(args, workdir: Path) -> dict:
    root = workdir / "runs"
    settings = [f"runner.total_steps={args.steps}", f"runner.eval_interval={args.eval_interval}",
                f"runner.eval_episodes={args.eval_episodes}", "runner.eval_deterministic=true",
                "runner.progress=false", "logger=none",
                f"runner.run_root={root}", *args.set]
    cmd = [str(Path(sys.executable).parent / "marlkit"), "--agent", "QMIX", "--env", MARLKIT_ENV, "--benchmark",
           "--seed", str(args.seed), "--set", *settings]
    # the tree may be edited while the EPyMARL side runs: what marlkit ran is what it was at its start
    source = _git_source()
    seconds = _run("marlkit", cmd, str(workdir), workdir / "marlkit.log")
    report = json.loads(next(root.glob("**/benchmark.json")).read_text())
    curve = [[row["step"], row["env"]["team_return"]] for row in report["evaluations"]]
    from marlkit.api import build_config
    cfg = build_config("QMIX", MARLKIT_ENV, overrides=args.overrides)
    agent = cfg.agents["QMIX"]
    return {"command": shlex.join(["marlkit", *cmd[1:]]), "process_seconds": seconds, "env_steps": report["steps"],
            "eval_return": curve, "train_loop_seconds": report["wall_time_s"], "source": source,
            "config": {"q": {"name": agent.q.name, "hidden_sizes": agent.q.hidden_sizes,
                             "layer_norm": agent.q.layer_norm, "activation": agent.q.activation},
                       "use_agent_id": agent.use_agent_id, "mixing_embed_dim": agent.mixing_embed_dim,
                       "hypernet_layers": agent.hypernet_layers, "hypernet_embed": agent.hypernet_embed,
                       "lr": agent.lr, "batch_size": agent.batch_size, "buffer_size": agent.buffer_size,
                       "gamma": agent.gamma, "double_q": agent.double_q, "epsilon_start": agent.epsilon_start,
                       "epsilon_finish": agent.epsilon_finish, "epsilon_anneal_steps": agent.epsilon_anneal_steps,
                       "target_update_interval": agent.target_update_interval,
                       "gradient_steps_per_episode": agent.gradient_steps_per_episode,
                       "standardise_rewards": agent.standardise_rewards, "max_grad_norm": agent.max_grad_norm,
                       "team_reward": agent.team_reward, "parallels": cfg.runner.parallels,
                       "horizon": cfg.runner.horizon, "vectorize": cfg.runner.vectorize,
                       "workers": cfg.runner.workers, "overlap": cfg.runner.overlapped(),
                       "torch_threads": cfg.runner.torch_threads}}


def main() -> None:
    p = harness.parser(__doc__, repeats=None)
    p.add_argument("--epymarl", type=Path, required=True, help="the EPyMARL checkout (holding src/main.py)")
    p.add_argument("--epymarl-python", type=Path, required=True, help="the python of EPyMARL's virtual environment")
    p.add_argument("--steps", type=int, default=30_000, help="env steps per side")
    p.add_argument("--eval-interval", type=int, default=None, help="env steps between evaluations (default steps/10)")
    p.add_argument("--eval-episodes", type=int, default=100,
                   help="greedy episodes per evaluation (EPyMARL's gymma test_nepisode)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sides", nargs="+", choices=("epymarl", "marlkit"), default=["epymarl", "marlkit"])
    args = harness.parse_args(p)
    args.eval_interval = args.eval_interval or max(1, args.steps // 10)
    if not (args.epymarl / "src" / "main.py").is_file():
        sys.exit(f"--epymarl {args.epymarl}: no src/main.py there")

    import marlkit
    runs: dict[str, dict] = {}
    payload = {"task": f"QMIX on {TASK}, time limit {TIME_LIMIT}, common reward (sum)",
               "marlkit_version": marlkit.__version__, "steps": args.steps, "eval_interval": args.eval_interval,
               "eval_episodes": args.eval_episodes, "seed": args.seed, "marlkit_overrides": args.set, "runs": runs}
    with tempfile.TemporaryDirectory() as tmp:
        for side in args.sides:
            workdir = Path(tmp) / side
            workdir.mkdir()
            load_before = [round(x, 2) for x in os.getloadavg()]
            runs[side] = {**(run_epymarl if side == "epymarl" else run_marlkit)(args, workdir),
                          "load_average_before": load_before,
                          "load_average_after": [round(x, 2) for x in os.getloadavg()]}
            if "epymarl" in runs and "marlkit" in runs:
                payload["epymarl_over_marlkit_process_seconds"] = (runs["epymarl"]["process_seconds"]
                                                                   / runs["marlkit"]["process_seconds"])
            out = harness.write_results("vs_epymarl", args, payload)

    for side, run in runs.items():
        print(f"\n{side}: {run['env_steps']:,} env steps in {run['process_seconds']:.0f} s (whole process)")
        harness.table(["env steps", "eval return (greedy)"], [[s, r] for s, r in run["eval_return"]])
    if "epymarl_over_marlkit_process_seconds" in payload:
        ratio = payload["epymarl_over_marlkit_process_seconds"]
        print(f"\nEPyMARL / marlkit whole-process wall time = {ratio:.2f} ({out})")


if __name__ == "__main__":
    main()
