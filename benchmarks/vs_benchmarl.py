"""marlkit's MADDPG, MASAC or MAPPO against BenchMARL 1.5.2's on the same VMAS task, with the same
frames, networks, batch and gradient steps per iteration, each side as a whole process, taking turns.

    .venv/bin/python benchmarks/vs_benchmarl.py [--algorithm maddpg|masac|mappo] [--task navigation|balance]
        [--frames 60000] [--gradient-steps 1000] [--seeds 1 2 3] [--skip-install] [--venv DIR] [--out FILE]

BenchMARL runs in a virtual environment of its own, benchmarks/.benchmarl-venv (``--venv``), which
this script creates on first use: python3.11 -m venv, the CPU build of torch 2.13.0 first, then
``benchmarl==1.5.2 vmas==1.5.2 torch==2.13.0 torchvision==0.28.0`` (without the torchvision pin
pip replaces torch with a CUDA build). No video, no loggers (wandb is not installed there).

Both sides get BenchMARL's experiment defaults where both have the setting, and the task's file
(3 agents, 100 steps, individual rewards):
- a frame is one step of one env with all its agents; an iteration collects 6,000 frames from 60
  envs of 100 steps (marlkit: ``runner.parallels 60``, ``runner.horizon 100``);
- off-policy: ``--gradient-steps`` per iteration (BenchMARL's default 1,000) on batches of 128
  transitions from a replay of 1M (``gradient_steps_per_env_step``: that over 6,000), no random
  frames first (``learning_starts 0``);
- MAPPO: 45 epochs of 15 minibatches of 400 frames per iteration, GAE lambda 0.9, clip 0.2, no
  entropy bonus, a critic of all agents' observations (the state);
- Adam at lr 5e-5 for every network, gradients clipped to a norm of 5, gamma 0.99, soft target
  updates with tau 0.005;
- actor and critic MLPs [256, 256] with tanh, no normalisation layers; parameters shared across
  agents, with no agent id (``use_agent_id: false``); a centralised critic of all agents'
  observations (and actions).
What differs, and is recorded: BenchMARL's MADDPG explores with Gaussian noise whose scale falls from
0.8 to 0.01 over a third of the frames, marlkit's with a fixed 0.1; Adam's eps (1e-6 vs 1e-8).

Each side's final evaluation (BenchMARL: its last evaluation, 60 episodes; marlkit: ``--benchmark``'s
final evaluation of 60 episodes) is the mean over agents of each agent's episode return, and its whole
wall time (imports and start-up included) is measured around the process. Results go to
benchmarks/results/vs_benchmarl_<algorithm>_<task>.json.

``--simulator`` adds a third process to each seed's turn: torch and VMAS imported, the task built
as marlkit's YAML builds it, and stepped for the same frames, evaluation included, with random
actions and nothing learned. It is what any framework pays for this run before it learns: a floor
under both sides' wall times.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VERSION = "1.5.2"
ITERATION = {"frames": 6000, "envs": 60, "steps": 100, "gradient_steps": 1000, "batch": 128,
             "epochs": 45, "minibatch": 400}
SHARED = {"lr": 5e-5, "gamma": 0.99, "tau": 0.005, "clip_grad_norm": 5.0, "memory": 1_000_000,
          "hidden": [256, 256], "activation": "tanh"}

# run with BenchMARL's python as ``helper ALGORITHM TASK FRAMES SEED FOLDER``: prints one JSON line
HELPER = '''
import json, sys, glob
from benchmarl.algorithms import MaddpgConfig, MappoConfig, MasacConfig
from benchmarl.environments import VmasTask
from benchmarl.experiment import Experiment, ExperimentConfig
from benchmarl.models.mlp import MlpConfig

algorithm, task, frames, seed, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
it, shared = json.loads(sys.argv[6]), json.loads(sys.argv[7])
cfg = ExperimentConfig.get_from_yaml()
cfg.loggers, cfg.render, cfg.create_json, cfg.save_folder = [], False, True, folder
cfg.checkpoint_interval, cfg.checkpoint_at_end = 0, False
cfg.max_n_frames = frames
cfg.off_policy_collected_frames_per_batch = it["frames"]
cfg.off_policy_n_envs_per_worker = it["envs"]
cfg.off_policy_n_optimizer_steps = it["gradient_steps"]
cfg.on_policy_collected_frames_per_batch = it["frames"]
cfg.on_policy_n_envs_per_worker = it["envs"]
cfg.on_policy_n_minibatch_iters, cfg.on_policy_minibatch_size = it["epochs"], it["minibatch"]
cfg.off_policy_train_batch_size = it["batch"]
cfg.off_policy_memory_size = shared["memory"]
cfg.lr, cfg.gamma, cfg.polyak_tau, cfg.clip_grad_val = shared["lr"], shared["gamma"], shared["tau"], shared["clip_grad_norm"]
cfg.evaluation_interval, cfg.evaluation_episodes = frames, it["envs"]
chosen = {"maddpg": MaddpgConfig, "masac": MasacConfig, "mappo": MappoConfig}[algorithm].get_from_yaml()
experiment = Experiment(task=getattr(VmasTask, task.upper()).get_from_yaml(), algorithm_config=chosen,
                        model_config=MlpConfig.get_from_yaml(), critic_model_config=MlpConfig.get_from_yaml(),
                        seed=seed, config=cfg)
experiment.run()
[path] = glob.glob(folder + "/**/*.json", recursive=True)
runs = json.load(open(path))
per_seed = next(iter(next(iter(next(iter(runs.values())).values())).values()))
steps = next(iter(per_seed.values()))
last = steps[max((k for k in steps if k.startswith("step_")), key=lambda k: int(k.split("_")[1]))]
returns = last["return"] if "return" in last else next(v["return"] for v in last.values() if isinstance(v, dict))
print(json.dumps({"final_return": sum(returns) / len(returns), "episodes": len(returns)}))
'''


def install(venv: Path) -> None:
    if (venv / f".installed-benchmarl-{VERSION}").exists():
        return
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "--quiet"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, f"benchmarl=={VERSION}", "vmas==1.5.2", "torch==2.13.0", "torchvision==0.28.0"], check=True)
    (venv / f".installed-benchmarl-{VERSION}").touch()


def run_benchmarl(venv: Path, algorithm: str, task: str, frames: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        out = subprocess.run([str(venv / "bin" / "python"), "-c", HELPER, algorithm, task, str(frames), str(seed),
                              folder, json.dumps(ITERATION), json.dumps(SHARED)],
                             capture_output=True, text=True, check=True)
        wall = time.perf_counter() - start
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "wall_s": wall}


def marlkit_settings(algorithm: str, frames: int) -> list[str]:
    agent = algorithm.upper()
    model = "{hidden_sizes: [256, 256], activation: tanh, layer_norm: false}"
    runner = [f"runner.total_steps={frames}", f"runner.parallels={ITERATION['envs']}",
              f"runner.horizon={ITERATION['steps']}", f"runner.eval_interval={frames}",
              f"runner.eval_episodes={ITERATION['envs']}", f"runner.eval_parallels={ITERATION['envs']}",
              f"runner.save_interval={frames}", "runner.progress=false"]
    # BenchMARL's shared networks take no agent id; its centralised shared critic values an env step once
    common = [f"agents.{agent}.lr={SHARED['lr']}", f"agents.{agent}.gamma={SHARED['gamma']}", f"agents.{agent}.use_agent_id=false",
              f"agents.{agent}.max_grad_norm={SHARED['clip_grad_norm']}", f"agents.{agent}.actor={model}",
              f"agents.{agent}.critic={model}"]
    if agent == "MAPPO":
        own = [f"agents.{agent}.epochs={ITERATION['epochs']}",
               f"agents.{agent}.minibatches={ITERATION['frames'] // ITERATION['minibatch']}",
               f"agents.{agent}.gae_lambda=0.9", f"agents.{agent}.clip=0.2", f"agents.{agent}.value_clip=null",
               f"agents.{agent}.entropy_coef=0.0", f"agents.{agent}.critic_input=state"]
    else:
        own = [f"agents.{agent}.target_update_tau={SHARED['tau']}", f"agents.{agent}.buffer_size={SHARED['memory']}",
               f"agents.{agent}.batch_size={ITERATION['batch']}",
               f"agents.{agent}.gradient_steps_per_env_step={ITERATION['gradient_steps'] / ITERATION['frames']}",
               f"agents.{agent}.learning_starts=0"]
    return runner + common + own


def run_marlkit(algorithm: str, task: str, frames: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as root:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "marlkit", "--agent", algorithm.upper(), "--env", f"vmas_{task}",
                        "--benchmark", "--seed", str(seed), "--logger", "none", "--set",
                        *marlkit_settings(algorithm, frames), f"runner.run_root={root}"],
                       capture_output=True, text=True, check=True, cwd=ROOT)
        wall = time.perf_counter() - start
        [report] = Path(root).glob("**/benchmark.json")
        final = json.loads(report.read_text())["final"]
    return {"final_return": final["mean"]["agents"], "episodes": final.get("episodes"), "wall_s": wall}


# run with marlkit's python as ``simulator TASK FRAMES SEED ENVS STEPS``: the floor (see the top)
SIMULATOR = '''
import sys, torch, vmas
from marlkit.api import build_config
task, frames, seed, envs, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cfg = build_config("MADDPG", "vmas_" + task).env
torch.set_num_threads(1)
for phase_steps in (frames // envs, steps):   # training, then one evaluation of as many episodes as envs
    env = vmas.make_env(cfg.scenario, num_envs=envs, device="cpu", continuous_actions=True, max_steps=cfg.max_steps,
                        seed=seed, dict_spaces=False, terminated_truncated=True, clamp_actions=True, **cfg.kwargs)
    env.reset()
    for _ in range(phase_steps):
        _, _, terminated, truncated, _ = env.step([env.get_random_action(agent) for agent in env.agents])
        done = terminated | truncated
        for index in done.nonzero().flatten().tolist():
            env.reset_at(index)
'''


def run_simulator(task: str, frames: int, seed: int) -> dict:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", SIMULATOR, task, str(frames), str(seed), str(ITERATION["envs"]),
                    str(ITERATION["steps"])], capture_output=True, text=True, check=True, cwd=ROOT)
    return {"wall_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", choices=["maddpg", "masac", "mappo"], default="maddpg")
    parser.add_argument("--task", choices=["navigation", "balance"], default="navigation")
    parser.add_argument("--frames", type=int, default=60_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--gradient-steps", type=int, default=ITERATION["gradient_steps"],
                        help="off-policy gradient steps per 6,000-frame iteration, both sides")
    parser.add_argument("--venv", type=Path, default=HERE / ".benchmarl-venv")
    parser.add_argument("--skip-install", action="store_true")
    parser.add_argument("--simulator", action="store_true",
                        help="also time the simulator alone for the same frames (a floor; see the top)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    ITERATION["gradient_steps"] = args.gradient_steps
    if not args.skip_install:
        install(args.venv)
    rows = []
    for seed in args.seeds:
        sides = [("marlkit", lambda: run_marlkit(args.algorithm, args.task, args.frames, seed)),
                 ("benchmarl", lambda: run_benchmarl(args.venv, args.algorithm, args.task, args.frames, seed))]
        if args.simulator:
            sides.append(("simulator", lambda: run_simulator(args.task, args.frames, seed)))
        for side, run in sides:
            row = {"side": side, "seed": seed, **run()}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = args.out or HERE / "results" / f"vs_benchmarl_{args.algorithm}_{args.task}.json"
    out.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "frames": args.frames,
                               "iteration": ITERATION, "shared": SHARED, "algorithm": args.algorithm,
                               "task": args.task, "marlkit_settings": marlkit_settings(args.algorithm, args.frames),
                               "differences": {"exploration": "BenchMARL MADDPG: Gaussian noise 0.8 -> 0.01 over a "
                                               "third of the frames; marlkit: 0.1 throughout",
                                               "adam_eps": "BenchMARL 1e-6, marlkit 1e-8"},
                               "rows": rows}, indent=2))
    print("wrote", out)


if __name__ == "__main__":
    main()
