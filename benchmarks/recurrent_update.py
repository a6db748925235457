"""The update of a recurrent actor, in real training runs that take turns, in one process, in four
forms:

- ``per_step``: one GRU call per step, the pooled critic with a CNN of its own (how it ran before);
- ``per_stretch``: the GRU over each stretch of steps with no episode start in one call (marlkit's
  ``gru``), the critic's CNN still its own;
- ``shared_trunk``: per stretch, and the pooled critic reading the actor's CNN trunk
  (``critic_encoder: actor``): one CNN pass serves both losses (workloads with a pooled critic);
- ``shared_trunk_bf16``: the same with the update's forward passes in bfloat16 (``precision``).

Each run is the packaged YAML's MAPPO with a ``gru`` actor, for a few rollouts of the real env, with
collection and update taking turns (no double buffering); only ``agent.update`` is timed. Every
form runs the same seed; the first two give the same numbers to float rounding (acting does not go
through the stretch code), so their episode returns agree; the shared trunk is another network,
whose learning curve is measured in full by ``benchmarks/vs_pufferlib.py --learn``.

- ``mettagrid``: the packaged mettagrid (a gru over a cnn, 32-step chunks of 128-step rollouts of
  16 envs);
- ``doom_coop_gru``: doom_coop as packaged with its actor made recurrent (a gru over its cnn,
  32-step chunks of 128-step rollouts of 4 envs);
- ``mpe_spread_gru``: mpe_spread with a gru actor and critic (25-step rollouts, whole episodes).

    python benchmarks/recurrent_update.py                          # every workload, 3 rounds each
    python benchmarks/recurrent_update.py --workloads mettagrid --rounds 5 --out benchmarks/results/recurrent_update.json
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import marlkit
from marlkit.agents.on_policy import OnPolicyAgent
from marlkit.networks.base import as_float
from marlkit.networks.rnn import GRU

GRU_ACTOR = {"name": "gru", "hidden_sizes": [256], "rnn_hidden": 256,
             "kwargs": {"encoder": "cnn", "channels": [16, 32, 32]}}
WORKLOADS = {
    # name: (env, rollouts per run, overrides, whether the critic pools the observations)
    "mettagrid": ("mettagrid", 4, {}, True),
    "doom_coop_gru": ("doom_coop", 4, {"agents.MAPPO.actor": GRU_ACTOR, "agents.MAPPO.chunk_length": 32}, False),
    "mpe_spread_gru": ("mpe_spread", 40, {"agents.MAPPO.actor": {"name": "gru"},
                                          "agents.MAPPO.critic": {"name": "gru"}}, False),
}


def stepwise(self, x, hidden=None, episode_start=None, copies: int = 0):
    """``GRU.forward`` as it ran before: one GRU call per step (the baseline)."""
    length, batch = x.shape[:2]
    z = self.mlp(as_float(x.reshape(length * batch, -1))) if self.flat else \
        self.encoder.encode(x.reshape(length * batch, *x.shape[2:]))
    z = z.reshape(length, batch, -1)
    if copies:
        z = z.unsqueeze(2).expand(-1, -1, copies, -1).reshape(length, batch * copies, -1)
        batch *= copies
    h = torch.zeros(batch, self.hidden_size, device=x.device) if hidden is None else hidden
    outputs = []
    for t in range(length):
        if episode_start is not None and t > 0:
            h = h * (~episode_start[t]).unsqueeze(-1).to(h.dtype)
        out, h_seq = self.gru(z[t:t + 1], h.unsqueeze(0).contiguous())
        h = h_seq.squeeze(0)
        outputs.append(out)
    features = self.norm(torch.cat(outputs, 0))
    return (features.reshape(length, -1, copies, self.hidden_size) if copies else features), h


def train(env: str, rollouts: int, overrides: dict, forward) -> tuple[list[float], list[float]]:
    """One short run with ``GRU.forward`` set to ``forward`` -> (seconds of each update, the last
    episodes' returns, each the mean over groups)."""
    seconds, update, stretch = [], OnPolicyAgent.update, GRU.forward

    def timed(self, batch, progress=None):
        start = time.perf_counter()
        try:
            return update(self, batch, progress)
        finally:
            seconds.append(time.perf_counter() - start)

    GRU.forward, OnPolicyAgent.update = forward, timed
    try:
        with tempfile.TemporaryDirectory() as root:
            cfg = marlkit.build_config("MAPPO", env, **overrides)
            steps = cfg.runner.parallels * cfg.runner.horizon * rollouts
            result = marlkit.run(agent="MAPPO", env=env, seed=1, logger="none", **{
                **overrides, "runner.run_root": root, "runner.progress": False, "runner.total_steps": steps,
                "runner.eval_interval": 10 ** 9, "runner.save_interval": 10 ** 9, "runner.double_buffer": False})
    finally:
        GRU.forward, OnPolicyAgent.update = stretch, update
    returns = [float(np.mean(list(episode.values()))) for episode in result.episode_returns]
    return seconds[1:], returns   # the first update allocates


def measure(name: str, rounds: int) -> dict:
    env, rollouts, overrides, pooled = WORKLOADS[name]
    own = {"agents.MAPPO.critic_encoder": "own"} if pooled else {}
    forms = {"per_step": (stepwise, own), "per_stretch": (GRU.forward, own)}
    if pooled:
        forms["shared_trunk"] = (GRU.forward, {"agents.MAPPO.critic_encoder": "actor",
                                               "agents.MAPPO.precision": "float32"})
        forms["shared_trunk_bf16"] = (GRU.forward, {"agents.MAPPO.critic_encoder": "actor",
                                                    "agents.MAPPO.precision": "bfloat16"})
    times = {label: [] for label in forms}
    returns = {}
    for _ in range(rounds):
        for label, (forward, critic) in forms.items():
            seconds, returns[label] = train(env, rollouts, {**overrides, **critic}, forward)
            times[label].append(float(np.median(seconds)))
    ratios = {label: [a / b for a, b in zip(times[label], times["per_step"])] for label in forms if label != "per_step"}
    return {"workload": name, "env": env, "rollouts_per_run": rollouts, "overrides": overrides,
            **{f"update_s_{label}_median": float(np.median(t)) for label, t in times.items()},
            **{f"ratio_{label}_over_per_step": {"min": min(r), "median": float(np.median(r)), "max": max(r)}
               for label, r in ratios.items()},
            "episode_return_mean": {k: float(np.mean(v)) if v else None for k, v in returns.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=3, help="runs of each form, the forms in turn")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.workloads:
        row = measure(name, args.rounds)
        rows.append(row)
        line = f"{name}: update {row['update_s_per_step_median']:.3f} s with a GRU call per step"
        for label in ("per_stretch", "shared_trunk", "shared_trunk_bf16"):
            if f"ratio_{label}_over_per_step" in row:
                r = row[f"ratio_{label}_over_per_step"]
                line += (f"; {label} {row[f'update_s_{label}_median']:.3f} s: {r['median']:.2f}x "
                         f"({r['min']:.2f}-{r['max']:.2f} over {args.rounds} rounds)")
        print(line, flush=True)
    if args.out:
        args.out.write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                                        "threads": args.threads, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
