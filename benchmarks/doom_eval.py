"""Kills, deaths, damage and return per episode of doom_coop policies, over several evaluation seeds:
a trained checkpoint beside the random policy, on the same envs and seeds.

    python benchmarks/doom_eval.py [--load runs/doom_coop/MAPPO/<run>/latest.pt] [--seeds 1 2 3]
                                   [--episodes 4] [--env doom_coop] [--tag NAME] [--set key=value ...]

Without ``--load`` only the random policy is evaluated.

Return is the mean over players of their episode return (what the runner logs); kills are the
level's kill count (shared by the team); deaths and damage are summed over the players. Writes
benchmarks/results/doom_eval[_NAME].json.
"""
from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml


def doom_of(env):
    from marlkit.envs.doom import DoomCoopEnv
    while not isinstance(env, DoomCoopEnv):
        env = env.env
    return env


def evaluate(agent: str, env: str, load: str | None, seed: int, episodes: int, overrides: dict) -> list[dict]:
    """``episodes`` episodes on ``episodes`` sync envs, one each, with the policy sampling (as in
    the runner's evaluation unless runner.eval_deterministic is set)."""
    from marlkit.api import build_config
    from marlkit.envs.factory import make_env_vector
    from marlkit.runners.runner import Runner

    cfg = build_config(agent, env, "test" if load else "train", seed=seed, **({"load": load} if load else {}),
                       **overrides)
    runner = Runner(cfg)
    venv = make_env_vector(cfg.env, replace(cfg.runner, vectorize="sync"), episodes)
    try:
        runner.agents = runner._build_agents(venv.spec, episodes)
        obs = venv.reset(seed=seed * 10_000 + 777)
        hidden = {g: a.initial_hidden(episodes) for g, a in runner.agents.items()}
        results: dict[int, dict] = {}
        while len(results) < episodes:
            outs = runner._act(obs, hidden, explore=not cfg.runner.eval_deterministic)
            res = venv.step({g: out.actions for g, out in outs.items()})
            for e, info in enumerate(res.infos):
                if "episode" in info and e not in results:
                    stats = doom_of(venv.envs[e]).last_episode
                    results[e] = {"return": float(np.mean(list(info["episode"]["return"].values()))),
                                  "kills": stats["player_0"]["kills"],
                                  "deaths": sum(s["deaths"] for s in stats.values()),
                                  "damage": sum(s["damage"] for s in stats.values())}
            hidden = runner._advance_hidden(outs, res.episode_end, res.agent_end)
            obs = res.next
        return [results[e] for e in range(episodes)]
    finally:
        venv.close()


def summary(rows: list[dict]) -> dict:
    return {k: {"mean": statistics.mean(r[k] for r in rows), "std": statistics.pstdev(r[k] for r in rows)}
            for k in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", help="a checkpoint (best.pt or latest.pt); none: the random policy only")
    parser.add_argument("--env", default="doom_coop")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--episodes", type=int, default=4, help="episodes per seed")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    overrides = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in args.set)}

    out: dict = {"checkpoint": args.load, "env": args.env, "episodes_per_seed": args.episodes, "policies": {}}
    policies = [("trained", None, args.load)] if args.load else []
    for name, agent, load in policies + [("random", "random", None)]:
        per_seed = {}
        for seed in args.seeds:
            rows = evaluate(agent, args.env, load, seed, args.episodes, overrides)
            per_seed[seed] = {"episodes": rows, **summary(rows)}
            print(f"{name:8s} seed {seed}: " + "  ".join(f"{k} {v['mean']:.2f}" for k, v in summary(rows).items()),
                  flush=True)
        seed_means = {k: [per_seed[s][k]["mean"] for s in args.seeds] for k in ("return", "kills", "deaths", "damage")}
        out["policies"][name] = {"per_seed": per_seed, "over_seeds": {
            k: {"mean": statistics.mean(v), "std": statistics.pstdev(v)} for k, v in seed_means.items()}}
    for name, p in out["policies"].items():
        print(f"{name:8s} over {len(args.seeds)} seeds: " + "  ".join(
            f"{k} {v['mean']:.2f} ± {v['std']:.2f}" for k, v in p["over_seeds"].items()))
    path = Path(__file__).parent / "results" / f"doom_eval{'_' + args.tag if args.tag else ''}.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
