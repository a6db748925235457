"""Turn-based PettingZoo games (AECEnv) from ``env.factory``: only the agent to move acts, its
action mask is honoured, the waiting player is paid at the move that ends its game, self-play
and player-vs-player groups, and MAPPO learning to beat a random player at tictactoe."""
import numpy as np
import pytest

import marlkit
from marlkit.agents.mappo import MAPPO
from marlkit.agents.random_policy import RandomAgent
from marlkit.config import resolve
from marlkit.envs.factory import make_env_vector

GAMES = {"tictactoe": ("pettingzoo.classic.tictactoe_v3:env", 5), "connect_four": ("pettingzoo.classic.connect_four_v3:env", 7)}


@pytest.mark.slow
@pytest.mark.parametrize("game", GAMES)
@pytest.mark.parametrize("policy", ["random", "MAPPO"])
def test_only_the_agent_to_move_acts_and_never_makes_an_illegal_move(env_yaml, game, policy):
    """10,000 steps of 4 envs with the mask-respecting random policy or an untrained MAPPO
    (stochastic): one agent acts per step, always a move its mask allows; an illegal move would
    end the game at once, and no game is shorter than the shortest win (5 moves, 7 in connect
    four); every game is zero-sum, the loser's -1 reaching it while it waits."""
    factory, shortest = GAMES[game]
    cfg = resolve("MAPPO", env_yaml(factory), overrides={"runner": {"parallels": 4}})
    venv = make_env_vector(cfg.env, cfg.runner)
    try:
        [(g, spec)] = venv.spec.groups.items()
        agent = (RandomAgent(spec, venv.spec, None, seed=0) if policy == "random" else
                 MAPPO(spec, venv.spec, cfg.agents["MAPPO"], seed=0))
        obs = venv.reset(seed=0)
        games, paid_while_waiting = [], 0
        for _ in range(10_000 // 4):
            live, mask = obs.agent_mask[g], obs.action_mask[g]
            assert (live.sum(1) == 1).all()
            actions = agent.act(obs.obs[g], obs.state, live, mask, None).actions
            chosen = np.take_along_axis(mask, actions[..., None], -1)[..., 0]
            assert chosen[live].all()
            res = venv.step({g: actions})
            paid_while_waiting += int(((res.reward[g] != 0) & ~live).sum())
            for info in res.infos:
                if "episode" in info:
                    games.append((info["episode"]["length"], info["episode"]["stats"]))
            obs = res.next
        assert len(games) > 200 and min(length for length, _ in games) >= shortest
        assert paid_while_waiting > 0
        wins = np.array([[s[f"won_{a}"] for a in spec.agents] for _, s in games])
        assert wins.sum(1).max() <= 1 and 0 < wins.mean() <= 0.5   # one winner at most; draws count for no one
    finally:
        venv.close()


def test_the_winning_move_pays_and_ends_both_players_games():
    """player_1 takes the top row (cells 0, 3, 6 in tictactoe's column-major numbering) while
    player_2 plays 1 and 4: the 5th move ends the game, +1 to player_1, -1 to player_2, who is
    waiting and is reported terminated once."""
    from pettingzoo.classic import tictactoe_v3
    from marlkit.envs.pettingzoo import PettingZooEnv
    env = PettingZooEnv(tictactoe_v3.env())
    obs = env.reset(seed=0)
    for t, cell in enumerate([0, 1, 3, 4, 6]):
        mover = t % 2
        assert obs.agent_mask["agents"].tolist() == [mover == 0, mover == 1]
        obs, reward, terminated, truncated, over = env.step({"agents": np.array([cell, cell])})
        if t < 4:
            assert not over and not terminated["agents"].any() and not reward["agents"].any()
    assert over and reward["agents"].tolist() == [1.0, -1.0] and terminated["agents"].tolist() == [True, True]
    assert env.episode_stats() == {"won_player_1": 1.0, "won_player_2": 0.0}
    env.close()


def test_self_play_shares_one_policy_between_both_players(tmp_path, env_yaml):
    path = env_yaml("pettingzoo.classic.connect_four_v3:env")
    result = marlkit.run(agent="MAPPO", env=path, seed=1, logger="none", **{
        "runner.run_root": str(tmp_path / "runs"), "runner.progress": False, "runner.parallels": 4,
        "runner.horizon": 32, "runner.total_steps": 1024})
    assert result.steps == 1024 and list(result.episode_returns[0]) == ["agents"]
    assert "agents/policy_loss" in result.metrics
