"""How much of COMA's advantage is signal: the spread of a trained critic's Q over an agent's own
actions, against the critic's error on its own TD(lambda) targets, on fresh mpe_spread rollouts.

    python benchmarks/coma_critic.py RUN_DIR [RUN_DIR ...] [--rollouts 8]

RUN_DIR is a COMA run on mpe_spread (its config.yaml and latest.pt are read). All figures are in
return units (real scale): ``q_spread`` is the std of Q(s, (u^-a, u')) over u', ``advantage`` the
mean |A^a|, ``critic_rmse`` the RMS difference between Q(s, u) and the TD(lambda) target.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import yaml

from marlkit.agents.base import Bootstrap
from marlkit.agents.coma import COMA, counterfactual_advantage, taken
from marlkit.api import build_config
from marlkit.buffers import Transition
from marlkit.envs.factory import make_env_vector
from marlkit.runners.checkpoint import read_steps


def measure(run_dir: Path, rollouts: int) -> dict:
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg = build_config("COMA", "mpe_spread", **{"agents.COMA": saved["agents"]["COMA"]})
    venv = make_env_vector(cfg.env, cfg.runner)
    spec, horizon = venv.spec, cfg.runner.horizon
    agent = COMA(spec.groups["agents"], spec.state_shape, cfg.agents["COMA"], venv.num_envs, horizon, seed=0)
    state = torch.load(run_dir / "latest.pt", weights_only=False)
    agent.load_state_dict(state["groups"]["agents"], weights_only=True)
    rows = {"q_spread": [], "advantage": [], "critic_rmse": []}
    g = "agents"
    try:
        obs = venv.reset(seed=12345)
        for _ in range(rollouts):
            for _ in range(horizon):
                out = agent.act(obs.obs[g], obs.state, obs.agent_mask[g], obs.action_mask[g], None)
                res = venv.step({g: out.actions})
                agent.store(Transition(obs.obs[g], obs.state, obs.agent_mask[g], obs.action_mask[g], out.actions,
                                       out.log_prob, None, res.reward[g], res.terminated[g], res.truncated[g],
                                       res.episode_end, res.final.obs[g], res.final.state))
                obs = res.next
            buf = agent.buffer
            last, cut = agent.estimate_values(Bootstrap(obs.obs[g], obs.state, obs.agent_mask[g],
                                                        obs.action_mask[g], None))
            targets = agent.targets(None, last, cut)
            flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731
            q = agent._denormalize(agent.q_values("critic", flat(buf.state), flat(buf.obs), flat(buf.actions),
                                                  flat(buf.agent_mask)))
            actions, present, mask = (agent.tensor(flat(x)) for x in (buf.actions, buf.agent_mask, buf.action_mask))
            with torch.no_grad():
                dist, _ = agent.policy(agent.tensor(flat(buf.obs)).unsqueeze(0), None, None, None, mask.unsqueeze(0))
                advantage, _ = counterfactual_advantage(q, dist.log_probs[0].exp(), actions, mask, present)
            error = taken(q, actions, present).numpy() - flat(targets["returns"])
            rows["q_spread"].append(float(q.std(-1).mean()))
            rows["advantage"].append(float(advantage.abs().mean()))
            rows["critic_rmse"].append(float(np.sqrt((error ** 2).mean())))
            buf.reset()
    finally:
        venv.close()
    return {"run_dir": str(run_dir), "steps": read_steps(run_dir / "latest.pt"),
            **{k: float(np.mean(v)) for k, v in rows.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "coma_critic.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [measure(d, args.rollouts) for d in args.run_dirs]
    for r in results:
        print(f"{r['run_dir']} @ {r['steps']}: Q spread over own actions {r['q_spread']:.3f}, "
              f"|advantage| {r['advantage']:.3f}, critic RMSE vs TD(lambda) target {r['critic_rmse']:.3f}")
    args.out.write_text(json.dumps(results, indent=2))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
