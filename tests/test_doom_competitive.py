"""Doom matches between rivals, with real engines over loopback: a deathmatch's frags, the winner of a
duel, ZDoom's built-in bots, and self-play on a duel."""
import numpy as np
import pytest
import torch

import marlkit
from marlkit.config import ConfigError
from marlkit.envs.doom import DoomConfig, DoomCoopEnv, RewardWeights

BUTTONS = ["ATTACK", "MOVE_FORWARD", "TURN_LEFT", "TURN_RIGHT"]


def _play_episode(env, seed: int) -> dict[str, float]:
    """One episode of random buttons -> each player's summed reward."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    total = {a: 0.0 for a in env.possible_agents}
    while env.agents:
        _, rewards, _, _, _ = env.step({a: int(rng.integers(len(BUTTONS) + 1)) for a in env.agents})
        for a, r in rewards.items():
            total[a] += r
    return total


def test_a_duel_counts_each_players_frags_and_names_the_winner():
    # frags alone are rewarded: a player's return is its frags over the episode
    env = DoomCoopEnv(DoomConfig(players=2, scenario="multi_duel.cfg", deathmatch=True, respawn=True, buttons=BUTTONS,
                                 episode_timeout=700, reward=RewardWeights(kills=0, frags=1.0, damage=0, deaths=0)))
    try:
        for seed in (0, 1):
            returns = _play_episode(env, seed)
            stats = env.episode_stats()
            frags = [stats["frags_player_0"], stats["frags_player_1"]]
            assert [returns["player_0"], returns["player_1"]] == pytest.approx(frags)
            assert stats["frags"] == sum(frags) and stats["bots_present"] == 0
            # random players on the duel map kill themselves more often than each other
            assert stats["deaths"] > 0 and min(frags) < 0
            assert stats["won_player_0"] == float(frags[0] > frags[1])
            assert stats["won_player_1"] == float(frags[1] > frags[0])
    finally:
        env.close()


def test_the_host_brings_the_bots_in_at_every_episode_and_their_frags_are_counted():
    env = DoomCoopEnv(DoomConfig(players=2, scenario="cig.cfg", deathmatch=True, bots=2, respawn=True, add_starts=False,
                                 buttons=BUTTONS, episode_timeout=400))
    try:
        for seed in (0, 1):
            _play_episode(env, seed)
            stats = env.episode_stats()
            assert stats["bots_present"] == 2      # removed and added again: never 4
            own = max(stats["frags_player_0"], stats["frags_player_1"])
            # the winner has more frags than the other player and each bot (their total is a bound)
            assert stats["won_player_0"] + stats["won_player_1"] <= 1
            if stats["won_player_0"] or stats["won_player_1"]:
                assert own > min(stats["frags_player_0"], stats["frags_player_1"])
            assert np.isfinite(stats["bot_frags"])
    finally:
        env.close()


def test_bots_need_a_deathmatch_and_a_match_holds_16():
    with pytest.raises(ConfigError, match="env.bots: 2 bots fight the players, which a co-op match does not allow"):
        DoomConfig(bots=2)
    with pytest.raises(ConfigError, match="make 18 slots; a match holds 16 at most"):
        DoomConfig(players=4, bots=14, deathmatch=True)


@pytest.mark.slow
def test_self_play_on_a_duel_rates_every_episode_by_its_winner(tmp_path):
    """One policy in both seats (the frozen one a past self), each finished duel a match rated by
    who fragged more (the env's won_player_<i>)."""
    run = marlkit.run(agent="MAPPO", env="doom_duel", seed=2, logger="none", **{
        "runner.run_root": str(tmp_path / "runs"), "runner.progress": False, "runner.parallels": 2,
        "runner.workers": 2, "runner.horizon": 64, "runner.total_steps": 1024, "env.episode_timeout": 280,
        "self_play.save_steps": 256, "self_play.swap_steps": 128, "self_play.team_change": 512,
        "agents.MAPPO.epochs": 1})
    league = run.self_play
    # 70 steps an episode, 2 envs: 1024 env steps (512 each) finish 7 episodes per env
    assert league["matches"] == 14
    assert league["learning_team"] == "player_0" and league["symmetric"]
    ckpt = torch.load(run.run_dir / "latest.pt", weights_only=False)
    assert set(ckpt["groups"]) == {"player_0", "player_1"}
