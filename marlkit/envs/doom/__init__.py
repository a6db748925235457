"""ViZDoom multiplayer co-op: N players, one engine process each, in a lockstep network game."""
from marlkit.envs.doom.adapter import DoomEnv
from marlkit.envs.doom.config import DoomConfig
from marlkit.envs.doom.match import DoomMatch, DoomPlayerError
from marlkit.envs.doom.parallel_env import DoomCoopEnv
from marlkit.envs.doom.rewards import RewardWeights

__all__ = ["DoomConfig", "DoomCoopEnv", "DoomEnv", "DoomMatch", "DoomPlayerError", "RewardWeights"]
