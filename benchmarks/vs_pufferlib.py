"""marlkit's MAPPO against PufferLib 3's PuffeRL on the same mettagrid game (the packaged mettagrid
YAML's forage map: 4 agents, 16 hearts, 32x32, 128 steps): env steps per CPU-second and per wall
second of training, the same policy size, batch and epochs on both sides.

    .venv/bin/python benchmarks/vs_pufferlib.py --pufferlib-python PYTHON [--updates 8] [--repeats 3]
        [--sides pufferlib marlkit] [--tag NAME | --out FILE]

PYTHON is the interpreter of a virtual environment with pufferlib-core 3.0.23 (its ``_C`` advantage
kernel loading against that venv's torch; a CPU build: docs/benchmarks.md), mettagrid 0.26.22 and
torch. Nothing of PufferLib is copied here.

Each measurement is a process of its own (this script with ``--side``, under the side's Python),
and the sides alternate, ``--repeats`` times. A process times, from just before it builds its
trainer (envs, networks, buffers) to the end of the last of ``--updates`` updates, the wall time
and its CPU time (``getrusage`` of itself and its children: user + system); imports are left out,
and are in the parent's second figure, each process's whole CPU time from its start to its exit.
Both sides run in one process with one torch thread, the envs stepped in that process (marlkit's
``sync`` vector env, PufferLib's ``Serial`` backend), 16 games of 4 agents.

- marlkit: ``marlkit.run(agent="MAPPO", env="mettagrid")`` with the packaged YAML's settings, the
  update on one thread as acting (``runner.update_threads: 1``), ``runner.total_steps`` = updates x
  2,048, no evaluation, logger or periodic checkpoint. Observations: the adapter's ``[16, 13, 13]``
  uint8 images.
- PufferLib: ``pufferl.PuffeRL`` over ``pufferlib.vector.make(MettaGridPufferEnv, backend=Serial)``,
  mettagrid's own PufferLib env (its tokens in the buffers, as PufferLib trains mettagrid); the
  policy turns tokens into the same images (a scatter in torch, per forward pass), then the same
  networks as marlkit's: actor = CNN 16/32/32 (3x3 stride 1, 2, 1) -> 128 -> GRU 128 -> LayerNorm
  -> 5 logits (a GRUCell while acting, as PufferLib's LSTMWrapper, the whole GRU over a segment in
  training); critic = the actor's CNN features where marlkit's YAML shares them
  (``critic_encoder: actor``), else the same CNN of its own, -> 128 -> 128 -> value (marlkit's
  pooled critic's hidden layer reads the agent's and the group's mean features, 256 wide). PuffeRL's defaults
  except: batch 8,192 agent steps (= 2,048 env steps), bptt_horizon 32 (marlkit's chunk_length),
  the YAML's epochs, minibatches (16 of 512 samples) and lr (1e-3), the YAML's gamma, lambda, clips, entropy and
  value weights, max_grad_norm, no prioritised replay (prio_alpha 0), V-trace clips 1 (plain GAE),
  no lr anneal, no torch.compile, float32. Its convolutions run in torch's default (NCHW) memory,
  as PufferLib's own models' do; ``--pufferlib-channels-last`` runs them in channels-last memory,
  as marlkit's ``cnn`` does, to tell that layout's share of the difference from the rest.

Env steps are joint steps of one game (PufferLib counts agent steps: divided by 4). Results go to
benchmarks/results/vs_pufferlib[_NAME].json.

Learning (``--learn``): does marlkit learn the game as well as PuffeRL?

    .venv/bin/python benchmarks/vs_pufferlib.py --learn --pufferlib-python PYTHON [--steps 2000000]
        [--seeds 1 2 3] [--eval-interval 51200] [--eval-episodes 32] [--sides marlkit pufferlib pufferlib_own]
        [--pufferlib-channels-last] [--pufferlib-set KEY=VALUE ...] [--tag NAME]

Each side trains ``--steps`` env steps per seed, a process per run, the sides in turn within a seed,
one torch thread each, 16 games in process:
- ``marlkit``: the packaged YAML as it is (``marlkit --agent MAPPO --env mettagrid --benchmark``),
  its own evaluations (32 games, sampled actions);
- ``pufferlib``: PuffeRL with the networks above and marlkit's settings (the speed comparison's);
- ``pufferlib_own``: the same networks with PufferLib's own settings for mettagrid (its
  ``config/metta.ini`` over ``config/default.ini``: one epoch, 64-step segments, lr 3e-4 annealed,
  gamma 0.977, lambda 0.916, clip 0.1, entropy 0.0021, value coefficient 0.44; see
  :func:`pufferlib_own_settings`).
``--pufferlib-set`` changes PuffeRL's settings on its sides (its config keys, e.g.
``minibatch_size=1024 max_minibatch_size=1024``); the results file records them.
A PuffeRL run is evaluated the way marlkit evaluates: every ``--eval-interval`` env steps its policy
plays ``--eval-episodes`` games of its own with sampled actions, scored as hearts per agent (the
mean over a game's agents of its return, each heart paying 1). Curves are kept against env steps
and against training wall time (evaluations left out on both sides); the summary gives, per side,
the mean and 95% t interval over seeds at every evaluation and the first step whose mean reaches the
scripted forager's 2.1 hearts per agent. Results go to benchmarks/results/vs_pufferlib_learn_NAME.json,
rewritten after every run; the same command again keeps the runs that file holds and runs the rest.
``--plot RESULTS.json [MORE.json ...] --out FIGURE.png`` draws their curves in one figure: hearts
per agent against env steps and against training time, mean and 95% interval over seeds, with the
random team and the forager.
"""
from __future__ import annotations

import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

ENV = "mettagrid"
log = logging.getLogger("vs_pufferlib")
PARALLELS, HORIZON, AGENTS = 16, 128, 4
BATCH = PARALLELS * HORIZON                  # env steps per update, both sides
# the packaged YAML's MAPPO settings, which the PufferLib side copies
LR, GAMMA, LAMBDA, CLIP, VALUE_CLIP = 1e-3, 0.99, 0.95, 0.2, 0.2
ENTROPY, VALUE_COEF, MAX_GRAD_NORM, EPOCHS, MINIBATCHES, CHUNK = 0.01, 1.0, 10.0, 4, 16, 32
CHANNELS, WIDTH = (16, 32, 32), 128


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its waited-for children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


# ---------------------------------------------------------------- marlkit's side (marlkit's venv)

def marlkit_side(updates: int) -> dict:
    import torch

    import marlkit
    from marlkit.api import build_config
    from marlkit.envs.mettagrid import parallel_env

    overrides = {"runner.total_steps": updates * BATCH, "runner.progress": False, "runner.eval_interval": 10 ** 9,
                 "runner.save_interval": 10 ** 9, "runner.torch_threads": 1, "runner.update_threads": 1}
    cfg = build_config("MAPPO", ENV, **overrides)
    assert (cfg.runner.parallels, cfg.runner.horizon, cfg.env.kwargs["num_agents"]) == (PARALLELS, HORIZON, AGENTS)
    mappo = cfg.agents["MAPPO"]
    settings = (mappo.lr, mappo.epochs, mappo.minibatches, mappo.chunk_length, mappo.entropy_coef)
    assert settings == (LR, EPOCHS, MINIBATCHES, CHUNK, ENTROPY), f"the YAML changed: {settings}"
    torch.set_num_threads(1)
    # the YAML's map and tags, the views it trains on; built before the timer, as PufferLib's side
    # imports mettagrid's modules there: the env imports them when it is first built
    env = parallel_env(**cfg.env.kwargs)
    with tempfile.TemporaryDirectory() as root:
        start_wall, start_cpu = time.perf_counter(), cpu_seconds()
        result = marlkit.run(agent="MAPPO", env=ENV, seed=1, logger="none",
                             **{**overrides, "runner.run_root": root})
        wall, cpu = time.perf_counter() - start_wall, cpu_seconds() - start_cpu
        weights = torch.load(result.run_dir / "latest.pt", map_location="cpu", weights_only=False)
    return {"wall_s": wall, "cpu_s": cpu, "env_steps": result.steps, "parameters": _parameters(weights),
            "obs_shape": list(env.observation_space("agent_0").shape),
            "losses": {k: v for k, v in result.metrics.items() if k.endswith(("_loss", "entropy"))}}


def _parameters(checkpoint) -> int:
    """Weights in a marlkit checkpoint's networks (the tensors of its state dicts, optimiser aside)."""
    import torch

    def count(node, key=""):
        if isinstance(node, torch.Tensor):
            return node.numel() if node.is_floating_point() and "optim" not in key else 0
        if isinstance(node, dict):
            return sum(count(v, f"{key}/{k}") for k, v in node.items())
        return 0
    return count(checkpoint)


# ---------------------------------------------------------------- PufferLib's side (PufferLib's venv)

def pufferlib_parts(env_config: str, channels_last: bool, tag_planes: bool, shared_trunk: bool):
    """PufferLib's side of the game: (Policy class, make_env for its vector env, its MettaGridConfig).
    ``tag_planes``: the policy's images have a channel per object tag too, as marlkit's YAML's
    (``env.kwargs.tags: planes``); ``shared_trunk``: the value reads the actor's CNN features, as
    marlkit's critic does with ``critic_encoder: actor`` (and PufferLib's own policies do)."""
    import pufferlib.pytorch
    import torch
    from mettagrid.config.mettagrid_config import MettaGridConfig
    from mettagrid.envs.mettagrid_puffer_env import MettaGridPufferEnv
    from mettagrid.policy.policy_env_interface import PolicyEnvInterface
    from mettagrid.simulator import Simulator
    from pufferlib import pufferl
    from torch import nn

    if not pufferl._C_AVAILABLE:
        raise SystemExit("pufferlib._C does not load in this venv: PuffeRL cannot compute advantages")
    torch.set_num_threads(1)
    cfg = MettaGridConfig.model_validate_json(Path(env_config).read_text())
    info = PolicyEnvInterface.from_mg_cfg(cfg)
    height, width = info.obs_height, info.obs_width
    channels = max(int(f.id) for f in info.obs_features) + 1
    tag_id = next(int(f.id) for f in info.obs_features if f.name == "tag")
    n_tags = len(info.tags) if tag_planes else 0
    scale = torch.zeros(256)
    for f in info.obs_features:
        scale[int(f.id)] = 1.0 / max(float(f.normalization), 1.0)

    def images(tokens: torch.Tensor) -> torch.Tensor:
        """[B, T, 3] uint8 tokens -> [B, C, H, W] float, value / normalisation (GridObsWrapper's)."""
        coord, fid, value = tokens.long().unbind(-1)
        row = torch.where(coord == 0xFE, height // 2, coord >> 4)
        col = torch.where(coord == 0xFE, width // 2, coord & 0x0F)
        keep = (coord != 0xFF) & (row < height) & (col < width) & (fid < channels)
        index = torch.where(keep, (fid * height + row) * width + col, 0)
        out = torch.zeros(tokens.shape[0], (channels + n_tags) * height * width)
        out.scatter_add_(1, index, value.float() * scale[fid] * keep)
        if n_tags:   # a plane per tag value, 1 where the cell's object has that tag
            plane = keep & (fid == tag_id) & (value < n_tags)
            index = torch.where(plane, ((channels + value) * height + row) * width + col, 0)
            out.scatter_add_(1, index, plane.float())
        return out.view(-1, channels + n_tags, height, width)

    def cnn() -> nn.Sequential:
        (a, b, c), layers, size = CHANNELS, [], channels + n_tags
        for out, stride in ((a, 1), (b, 2), (c, 1)):
            layers += [nn.Conv2d(size, out, 3, stride), nn.ReLU()]
            size = out
        flat = nn.Sequential(*layers, nn.Flatten())(torch.zeros(1, channels + n_tags, height, width)).shape[1]
        layers.append(nn.Flatten())
        if channels_last:   # marlkit's cnn's memory layout (--pufferlib-channels-last)
            layers = [ChannelsLast(), *(layer.to(memory_format=torch.channels_last) for layer in layers)]
        return nn.Sequential(*layers, pufferlib.pytorch.layer_init(nn.Linear(flat, WIDTH)), nn.ReLU())

    class ChannelsLast(nn.Module):
        def forward(self, x):
            return x.contiguous(memory_format=torch.channels_last)

    class Policy(nn.Module):
        """PufferLib's LSTMWrapper, with a GRU: a cell while acting, the whole GRU over a segment in
        training; ``lstm_h`` carries the GRU's state (``lstm_c`` is unused)."""

        obs_shape = (channels + n_tags, height, width)

        def __init__(self):
            super().__init__()
            self.hidden_size = WIDTH
            self.actor_encoder = cnn()
            self.critic_encoder = None if shared_trunk else cnn()
            self.gru = nn.GRU(WIDTH, WIDTH)
            self.cell = nn.GRUCell(WIDTH, WIDTH)
            self.cell.weight_ih, self.cell.weight_hh = self.gru.weight_ih_l0, self.gru.weight_hh_l0
            self.cell.bias_ih, self.cell.bias_hh = self.gru.bias_ih_l0, self.gru.bias_hh_l0
            self.norm = nn.LayerNorm(WIDTH)
            self.logits = pufferlib.pytorch.layer_init(nn.Linear(WIDTH, int(info.action_space.n)), std=0.01)
            # marlkit's pooled critic: a hidden layer on [own, the group's mean] features (256 in);
            # here on the agent's own (128 in: PuffeRL's segments do not keep a game's agents together)
            self.value = nn.Sequential(pufferlib.pytorch.layer_init(nn.Linear(WIDTH, WIDTH)), nn.ReLU(),
                                       pufferlib.pytorch.layer_init(nn.Linear(WIDTH, 1), std=1))

        def critic_features(self, x, z):
            return z if self.critic_encoder is None else self.critic_encoder(x)

        def forward_eval(self, observations, state):
            x = images(observations)
            z = self.actor_encoder(x)
            h = self.cell(z, state["lstm_h"])
            state["lstm_h"] = h
            return self.logits(self.norm(h)), self.value(self.critic_features(x, z))

        def forward(self, observations, state):
            b, t = observations.shape[:2]
            x = images(observations.reshape(b * t, *observations.shape[2:]))
            z = self.actor_encoder(x)
            h, _ = self.gru(z.view(b, t, WIDTH).transpose(0, 1),
                            None if state["lstm_h"] is None else state["lstm_h"].unsqueeze(0))
            h = h.transpose(0, 1).reshape(b * t, WIDTH)
            return self.logits(self.norm(h)), self.value(self.critic_features(x, z)).view(b, t)

    def make_env(buf=None, seed=0):
        return MettaGridPufferEnv(Simulator(), cfg, buf=buf, seed=seed)

    return Policy, make_env, cfg


def pufferlib_config(seed: int, **changes) -> dict:
    """PuffeRL's settings with marlkit's YAML's (the module's constants), ``changes`` on top."""
    return {
        "env": ENV, "seed": seed, "torch_deterministic": False, "device": "cpu", "cpu_offload": False,
        "compile": False, "compile_mode": "default", "compile_fullgraph": False, "precision": "float32",
        "optimizer": "adam", "learning_rate": LR, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-8,
        "batch_size": BATCH * AGENTS, "bptt_horizon": CHUNK, "minibatch_size": BATCH * AGENTS // MINIBATCHES,
        "max_minibatch_size": BATCH * AGENTS // MINIBATCHES, "update_epochs": EPOCHS, "use_rnn": True,
        "gamma": GAMMA, "gae_lambda": LAMBDA, "clip_coef": CLIP, "vf_clip_coef": VALUE_CLIP,
        "vf_coef": VALUE_COEF, "ent_coef": ENTROPY, "max_grad_norm": MAX_GRAD_NORM, "prio_alpha": 0.0,
        "prio_beta0": 1.0, "vtrace_rho_clip": 1.0, "vtrace_c_clip": 1.0, "anneal_lr": False,
        "total_timesteps": 10 ** 12, "checkpoint_interval": 10 ** 9, "data_dir": tempfile.mkdtemp(), **changes}


def pufferlib_side(updates: int, env_config: str, channels_last: bool, tag_planes: bool, shared_trunk: bool) -> dict:
    import pufferlib.vector
    import torch
    from pufferlib import pufferl

    torch.set_num_threads(1)
    Policy, make_env, _ = pufferlib_parts(env_config, channels_last, tag_planes, shared_trunk)
    config = pufferlib_config(seed=1)
    start_wall, start_cpu = time.perf_counter(), cpu_seconds()
    vecenv = pufferlib.vector.make(make_env, backend=pufferlib.vector.Serial, num_envs=PARALLELS)
    policy = Policy()
    trainer = pufferl.PuffeRL(config, vecenv, policy)
    for _ in range(updates):
        trainer.evaluate()
        logs = trainer.train()
    wall, cpu = time.perf_counter() - start_wall, cpu_seconds() - start_cpu
    losses = {k: float(v) for k, v in trainer.losses.items()}
    del logs
    return {"wall_s": wall, "cpu_s": cpu, "env_steps": trainer.global_step // AGENTS,
            "parameters": sum(p.numel() for n, p in policy.named_parameters() if not n.startswith("cell.")),
            "obs_shape": list(policy.obs_shape), "losses": losses}


# ---------------------------------------------------------------- learning (--learn)

# --learn's sides: marlkit's packaged YAML; PuffeRL with marlkit's settings; PuffeRL with its own
LEARN_SIDES = ("marlkit", "pufferlib", "pufferlib_own")
SCRIPTED_FORAGER = 2.1   # hearts per agent of tests/test_mettagrid.py's forager on the packaged map (docs/envs.md)


def marlkit_learn(seed: int, steps: int, eval_interval: int, eval_episodes: int) -> dict:
    """marlkit's packaged YAML trained ``steps`` env steps, evaluated every ``eval_interval``."""
    import torch

    import marlkit
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        result = marlkit.run(agent="MAPPO", env=ENV, mode="benchmark", seed=seed, logger="none", **{
            "runner.total_steps": steps, "runner.eval_interval": eval_interval, "runner.eval_episodes": eval_episodes,
            "runner.progress": False, "runner.save_interval": 10 ** 12, "runner.torch_threads": 1,
            "runner.update_threads": 1, "runner.run_root": root})
    curve, evaluating = [], 0.0
    for row in result.evaluations:
        curve.append({"step": row["step"], "mean": row["mean"]["agents"], "ci": row["ci"]["agents"],
                      "train_wall_s": row["wall_time_s"] - evaluating})
        evaluating += row["eval_s"]
    return {"curve": curve, "random": result.baseline["mean"]["agents"]}


def pufferlib_own_settings() -> dict:
    """PufferLib's own training settings for mettagrid: its ``config/metta.ini`` over its
    ``config/default.ini`` (PufferLib's repository), on this comparison's batch of 8,192 agent steps
    (its 32,768-step minibatch is more than a batch here: one minibatch per epoch)."""
    return {"optimizer": "adam", "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-12, "clip_coef": 0.1,
            "ent_coef": 0.0021, "gae_lambda": 0.916, "gamma": 0.977, "learning_rate": 3e-4, "max_grad_norm": 0.5,
            "minibatch_size": BATCH * AGENTS, "max_minibatch_size": BATCH * AGENTS, "bptt_horizon": 64,
            "update_epochs": 1, "prio_alpha": 0.0, "prio_beta0": 0.6, "vf_clip_coef": 0.1, "vf_coef": 0.44,
            "vtrace_c_clip": 1.0, "vtrace_rho_clip": 1.0, "anneal_lr": True}


def pufferlib_learn(env_config: str, channels_last: bool, tag_planes: bool, shared_trunk: bool, seed: int, steps: int,
                    eval_interval: int,
                    eval_episodes: int, own_settings: bool, changes: dict | None = None) -> dict:
    """PuffeRL trained ``steps`` env steps; every ``eval_interval`` its policy plays ``eval_episodes``
    games of its own (sampled actions, as marlkit evaluates), scored as hearts per agent."""
    import numpy as np
    import pufferlib.vector
    import torch
    from pufferlib import pufferl

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    Policy, make_env, cfg = pufferlib_parts(env_config, channels_last, tag_planes, shared_trunk)
    # PuffeRL's schedules (the learning-rate anneal, the rise of prioritised segments' beta) run over its
    # total_timesteps: given the run's length in whole updates of agent steps, they end at its last update
    planned = {"total_timesteps": -(-steps // BATCH) * BATCH * AGENTS}
    config = pufferlib_config(seed, **{**planned, **(pufferlib_own_settings() if own_settings else {}), **(changes or {})})
    vecenv = pufferlib.vector.make(make_env, backend=pufferlib.vector.Serial, num_envs=PARALLELS, seed=seed)
    policy = Policy()
    trainer = pufferl.PuffeRL(config, vecenv, policy)
    games = [make_env(seed=10 ** 6 + seed * 1000 + i) for i in range(eval_episodes)]
    generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def evaluate() -> dict:
        obs = np.concatenate([g.reset(seed=10 ** 6 + seed * 1000 + i)[0] for i, g in enumerate(games)])
        state = {"lstm_h": torch.zeros(len(obs), WIDTH)}   # forward_eval carries the GRU's memory in it
        total = np.zeros(len(obs))
        for _ in range(cfg.game.max_steps):   # every game ends at its step limit, all agents together
            logits, _ = policy.forward_eval(torch.as_tensor(obs), state)
            actions = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(1).numpy()
            steps_out = [g.step(a) for g, a in zip(games, np.split(actions, len(games)))]
            obs = np.concatenate([o for o, *_ in steps_out])
            total += np.concatenate([r for _, r, *_ in steps_out])
        per_game = total.reshape(len(games), -1).mean(1)
        return {"mean": float(per_game.mean()), "ci": float(1.96 * per_game.std(ddof=1) / np.sqrt(len(per_game)))}

    curve, train_wall, next_eval = [], 0.0, 0
    while True:
        env_steps = trainer.global_step // AGENTS
        if env_steps >= next_eval or env_steps >= steps:
            curve.append({"step": env_steps, **evaluate(), "train_wall_s": train_wall})
            next_eval += eval_interval
        if env_steps >= steps:
            break
        start = time.perf_counter()
        trainer.evaluate()
        trainer.train()
        train_wall += time.perf_counter() - start
    return {"curve": curve, "settings": {k: v for k, v in config.items() if k != "data_dir"}}


# ---------------------------------------------------------------- the parent

def run_side(side: str, python: str, args, env_config: str, log: Path) -> dict:
    """One measurement: this script under ``python`` as a process of its own; adds its whole CPU
    time (start-up and imports included) from the parent's RUSAGE_CHILDREN."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [python, __file__, "--side", side, "--updates", str(args.updates), "--env-config", env_config,
           *(["--pufferlib-channels-last"] if args.pufferlib_channels_last else []),
           *(["--tag-planes"] if args.tag_planes else []), *(["--shared-trunk"] if args.shared_trunk else [])]
    with open(log, "a") as f:
        done = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, stderr=f, text=True, cwd=Path(__file__).parent)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{side} failed (exit {done.returncode}); see {log}")
    sample = json.loads(done.stdout.strip().splitlines()[-1])
    sample["process_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    sample["env_steps_per_cpu_s"] = sample["env_steps"] / sample["cpu_s"]
    sample["env_steps_per_wall_s"] = sample["env_steps"] / sample["wall_s"]
    sample["env_steps_per_process_cpu_s"] = sample["env_steps"] / sample["process_cpu_s"]
    return sample


def yaml_choices() -> tuple[dict, bool, bool]:
    """What PufferLib's side takes from marlkit's YAML: the game's settings (for ``forage_config``),
    whether views have a plane per tag, and whether the critic reads the actor's CNN trunk."""
    from marlkit.api import build_config
    cfg = build_config("MAPPO", ENV)
    kwargs = dict(cfg.env.kwargs)
    kwargs.pop("map")
    tag_planes = kwargs.pop("tags", "scaled") == "planes"
    return kwargs, tag_planes, cfg.agents["MAPPO"].critic_encoder == "actor"


def spread(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main() -> None:
    parser = harness.parser(__doc__, repeats=3, overrides=False)
    parser.add_argument("--pufferlib-python", default=None, help="the Python of PufferLib's venv")
    parser.add_argument("--updates", type=int, default=8, help="updates of 2,048 env steps per measurement")
    parser.add_argument("--pufferlib-channels-last", action="store_true",
                        help="PufferLib's convolutions in channels-last memory, as marlkit's cnn runs them")
    parser.add_argument("--sides", nargs="+", default=None, choices=LEARN_SIDES,
                        help="default: pufferlib marlkit; with --learn: all three")
    parser.add_argument("--learn", action="store_true", help="learning curves instead of speed (see the top)")
    parser.add_argument("--steps", type=int, default=2_000_000, help="--learn: env steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="--learn: seeds")
    parser.add_argument("--eval-interval", type=int, default=51_200, help="--learn: env steps between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=32, help="--learn: games per evaluation")
    parser.add_argument("--side", choices=LEARN_SIDES, help=argparse_hidden())
    parser.add_argument("--seed", type=int, default=1, help=argparse_hidden())
    parser.add_argument("--env-config", help=argparse_hidden())
    parser.add_argument("--tag-planes", action="store_true", help=argparse_hidden())
    parser.add_argument("--shared-trunk", action="store_true", help=argparse_hidden())
    parser.add_argument("--pufferlib-set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="--learn: PuffeRL settings over its side's (its config keys, e.g. minibatch_size=2048)")
    parser.add_argument("--pufferlib-changes", default="{}", help=argparse_hidden())
    parser.add_argument("--jobs", type=int, default=1, help="--learn: runs at once (each on one thread)")
    parser.add_argument("--plot", type=Path, nargs="+", default=None,
                        help="draw --learn results files in one figure (to --out)")
    args = harness.parse_args(parser)
    if args.plot:
        return plot(args.plot, args.out or Path("vs_pufferlib_learn.png"))
    if args.side:
        # a measurement process: its result as the last line of its output, then out at once, past
        # threads that would keep it alive (PuffeRL's utilisation monitor, also after an error)
        try:
            if args.learn and args.side == "marlkit":
                sample = marlkit_learn(args.seed, args.steps, args.eval_interval, args.eval_episodes)
            elif args.learn:
                sample = pufferlib_learn(args.env_config, args.pufferlib_channels_last, args.tag_planes, args.shared_trunk,
                                         args.seed, args.steps, args.eval_interval, args.eval_episodes,
                                         args.side == "pufferlib_own", json.loads(args.pufferlib_changes))
            else:
                sample = marlkit_side(args.updates) if args.side == "marlkit" else pufferlib_side(
                    args.updates, args.env_config, args.pufferlib_channels_last, args.tag_planes, args.shared_trunk)
            print(json.dumps(sample), flush=True)
        except Exception:
            log.exception("the %s side failed", args.side)   # its traceback, to stderr
            os._exit(1)
        os._exit(0)
    args.sides = args.sides or (list(LEARN_SIDES) if args.learn else ["pufferlib", "marlkit"])
    if any(side.startswith("pufferlib") for side in args.sides) and not args.pufferlib_python:
        parser.error("--pufferlib-python is needed for the pufferlib side")
    if args.learn:
        return learn(args)

    from marlkit.envs.mettagrid import forage_config
    kwargs, args.tag_planes, args.shared_trunk = yaml_choices()
    pythons = {"marlkit": sys.executable, "pufferlib": args.pufferlib_python}
    with tempfile.TemporaryDirectory() as tmp:
        env_config = Path(tmp) / "mettagrid.json"   # the very game marlkit plays, for PufferLib's side
        env_config.write_text(forage_config(**kwargs).model_dump_json())
        side_log = Path(tmp) / "sides.log"
        samples = {side: [] for side in args.sides}
        try:
            for r in range(args.repeats):
                for side in args.sides:
                    samples[side].append(run_side(side, pythons[side], args, str(env_config), side_log))
                    s = samples[side][-1]
                    print(f"repeat {r + 1}/{args.repeats} {side}: {s['env_steps_per_cpu_s']:,.1f} env-steps per "
                          f"CPU-s, {s['env_steps_per_wall_s']:,.1f} per wall s ({s['env_steps']:,} env steps, "
                          f"{s['cpu_s']:.1f} CPU-s, {s['wall_s']:.1f} s)", flush=True)
        except RuntimeError:
            print(side_log.read_text()[-5000:], file=sys.stderr)
            raise
    keys = ("env_steps_per_cpu_s", "env_steps_per_wall_s", "env_steps_per_process_cpu_s")
    summary = {side: {k: spread([s[k] for s in runs]) for k in keys} for side, runs in samples.items()}
    ratios = {}
    if len(samples) == 2:
        # per repeat (the two sides of a repeat ran back to back, under the same load), then the spread
        ratios = {k: spread([m[k] / p[k] for m, p in zip(samples["marlkit"], samples["pufferlib"])]) for k in keys}
    harness.table(["side", "env-steps/CPU-s (min/med/max)", "env-steps/wall-s (min/med/max)", "params"],
                  [[side, "/".join(f"{summary[side]['env_steps_per_cpu_s'][q]:.0f}" for q in ("min", "median", "max")),
                    "/".join(f"{summary[side]['env_steps_per_wall_s'][q]:.0f}" for q in ("min", "median", "max")),
                    samples[side][0]["parameters"]] for side in samples])
    for k, v in ratios.items():
        print(f"marlkit / PufferLib, {k}: {v['median']:.2f}x (min {v['min']:.2f}, max {v['max']:.2f})")
    harness.write_results("vs_pufferlib", args, {"updates": args.updates, "env_steps_per_update": BATCH,
                                                 "pufferlib_channels_last": args.pufferlib_channels_last,
                                                 "samples": samples, "summary": summary, "ratios": ratios})


def learn(args) -> None:
    """Every seed's run of every side, one process each (``--jobs`` at once), seed by seed; the
    results file is rewritten after each run, so a stopped comparison keeps what it finished."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Lock

    from marlkit.envs.mettagrid import forage_config
    kwargs, tag_planes, shared_trunk = yaml_choices()
    pufferlib_changes = {key: json.loads(value) for key, value in (item.split("=", 1) for item in args.pufferlib_set)}
    pythons = {"marlkit": sys.executable, "pufferlib": args.pufferlib_python, "pufferlib_own": args.pufferlib_python}
    runs: dict[str, list] = {side: [] for side in args.sides}
    out = Path(args.out or harness.RESULTS / f"vs_pufferlib_learn_{args.tag or time.strftime('%Y%m%d-%H%M%S')}.json")
    if out.is_file():   # a comparison stopped before: its finished runs are kept, the others run
        before = json.loads(out.read_text())
        if (before["steps"], before["eval_interval"], before["eval_episodes"]) != (args.steps, args.eval_interval,
                                                                                    args.eval_episodes):
            raise SystemExit(f"{out} holds runs of other settings; give another --tag")
        for side, side_runs in before["runs"].items():
            runs.setdefault(side, []).extend(side_runs)
    lock = Lock()

    def one(seed: int, side: str, env_config: Path) -> None:
        cmd = [pythons[side], __file__, "--side", side, "--learn", "--seed", str(seed), "--steps", str(args.steps),
               "--eval-interval", str(args.eval_interval), "--eval-episodes", str(args.eval_episodes),
               "--env-config", str(env_config), *(["--pufferlib-channels-last"] * args.pufferlib_channels_last),
               *(["--tag-planes"] * tag_planes), *(["--shared-trunk"] * shared_trunk)]
        if side.startswith("pufferlib"):
            cmd += ["--pufferlib-changes", json.dumps(pufferlib_changes)]
        start = time.perf_counter()
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parent)
        if done.returncode != 0:
            raise RuntimeError(f"{side}, seed {seed} failed:\n{done.stderr[-5000:]}")
        run = {"seed": seed, "process_wall_s": time.perf_counter() - start, "jobs": args.jobs,
               **json.loads(done.stdout.strip().splitlines()[-1])}
        with lock:
            runs[side].append(run)
            last = run["curve"][-1]
            print(f"{side} seed {seed}: {last['mean']:.2f} hearts per agent at {last['step']:,} env steps "
                  f"({last['train_wall_s']:.0f} s of training)", flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "machine": harness.machine(),
                                       "steps": args.steps, "eval_interval": args.eval_interval,
                                       "eval_episodes": args.eval_episodes, "tag_planes": tag_planes,
                                       "shared_trunk": shared_trunk, "pufferlib_changes": pufferlib_changes,
                                       "scripted_forager": SCRIPTED_FORAGER, "summary": learn_summary(runs),
                                       "runs": runs}, indent=2))

    with tempfile.TemporaryDirectory() as tmp:
        env_config = Path(tmp) / "mettagrid.json"
        env_config.write_text(forage_config(**kwargs).model_dump_json())
        todo = [(seed, side) for seed in args.seeds for side in args.sides
                if not any(run["seed"] == seed for run in runs[side])]
        with ThreadPoolExecutor(args.jobs) as pool:
            for future in [pool.submit(one, seed, side, env_config) for seed, side in todo]:
                future.result()
    summary = learn_summary(runs)
    harness.table(["side", "seeds", "final hearts per agent (mean, 95% t interval)", "first step at the forager's 2.1"],
                  [[side, v["seeds"], f"{v['final']['mean']:.2f} [{v['final']['low']:.2f}, {v['final']['high']:.2f}]",
                    v["reaches_forager"] or "not reached"] for side, v in summary.items()])
    print(f"written {out}")


def learn_summary(runs: dict[str, list]) -> dict:
    """Per side: the curve's mean and 95% t interval over seeds at each evaluation the seeds share,
    the final evaluation's, and the first step whose mean reaches the scripted forager."""
    from scipy import stats
    out = {}
    for side, side_runs in runs.items():
        if not side_runs:
            continue
        points = min(len(r["curve"]) for r in side_runs)
        curve = []
        for k in range(points):
            values = [r["curve"][k]["mean"] for r in side_runs]
            mean = statistics.fmean(values)
            half = (stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
                    if len(values) > 1 else 0.0)
            curve.append({"step": side_runs[0]["curve"][k]["step"], "mean": mean, "low": mean - half,
                          "high": mean + half, "train_wall_s": statistics.fmean(r["curve"][k]["train_wall_s"]
                                                                                for r in side_runs)})
        reach = next((c["step"] for c in curve if c["mean"] >= SCRIPTED_FORAGER), None)
        out[side] = {"seeds": len(side_runs), "curve": curve, "final": curve[-1], "reaches_forager": reach}
    return out


LABELS = {"marlkit": "marlkit MAPPO (packaged YAML)", "pufferlib": "PuffeRL, marlkit's settings",
          "pufferlib_own": "PuffeRL, its own settings for mettagrid"}


def plot(results: list[Path], out: Path) -> None:
    """Every side of every results file, a curve each; a PuffeRL side run with ``--pufferlib-set``
    is labelled with its changes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = [json.loads(path.read_text()) for path in results]
    marlkit_runs = [r for data in files for r in data["runs"].get("marlkit", [])]
    random = statistics.fmean(r["random"] for r in marlkit_runs) if marlkit_runs else None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, x, label in ((axes[0], "step", "env steps"), (axes[1], "train_wall_s", "training wall time (s)")):
        for data in files:
            changes = ", ".join(f"{k}={v}" for k, v in data.get("pufferlib_changes", {}).items())
            for side, summary in data["summary"].items():
                name = LABELS[side] + (f", {changes}" if changes and side.startswith("pufferlib") else "")
                xs = [c[x] for c in summary["curve"]]
                ax.plot(xs, [c["mean"] for c in summary["curve"]], label=f"{name} ({summary['seeds']} seeds)")
                ax.fill_between(xs, [c["low"] for c in summary["curve"]], [c["high"] for c in summary["curve"]],
                                alpha=0.2)
        ax.axhline(files[0]["scripted_forager"], color="k", linestyle="--", label="scripted forager")
        if random is not None:
            ax.axhline(random, color="grey", linestyle=":", label="random team")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("hearts per agent (evaluation, 32 games)")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle("mettagrid forage: marlkit against PuffeRL, the same networks and observations")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    print(f"written {out}")


def argparse_hidden():
    import argparse
    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
