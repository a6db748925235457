"""Rewards from changes in game variables, split into a per-player and a shared part.

Per player: its own kills (``KILLS``, counted by the co-op WAD copy: ``kill_credit.py``), damage
dealt (``DAMAGECOUNT``), deaths (``DEATHCOUNT``), health and ammo. Shared by the team: the kills of
every player (``team_kills``). ``KILLCOUNT``, the level's count of dead monsters, reads the same
for every player and counts monsters killed by monsters too: it is reported (``level_kills``),
never rewarded. ViZDoom's own reward settings are not used: its death penalty is charged on every
tic a player is dead, and its kill reward and the scenarios' script rewards are shared the same way.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from marlkit.envs.doom.worker import MAX_SLOTS, VARIABLES

_I = {name: i for i, name in enumerate(VARIABLES)}
# AMMOk is the ammo of weapon slot k; slots sharing an ammo type read the same pool (pistol 2 and
# chaingun 4: bullets; plasma 6 and BFG 7: cells), so only one slot per type is counted.
AMMO = [_I[f"AMMO{k}"] for k in (2, 3, 5, 6)]


@dataclass
class RewardWeights:
    """Reward per unit change of a game variable over one step."""

    kills: float = 1.0      # per player: each monster it killed
    team_kills: float = 0.0  # shared: each monster killed by any player of the team
    damage: float = 0.01    # per player: damage dealt, per hit point
    deaths: float = -1.0    # per player: each death
    health: float = 0.0     # per player: health gained (lost when negative), while alive
    ammo: float = 0.0       # per player: bullets + shells + rockets + cells gained (spent: negative), alive
    frags: float = 0.0      # per player: each frag in a deathmatch (a rival killed; -1 for killing itself)


def player_stats(v: np.ndarray, start: np.ndarray) -> dict[str, float]:
    """One player's numbers for ``info``, from its game variables now (``v``) and at the episode's
    start (``start``). The counters (kills, level_kills, deaths, damage, hits) are episode totals:
    in a network game DEATHCOUNT, DAMAGECOUNT, HITCOUNT and the kill credit run on over the whole
    match (measured), KILLCOUNT restarts with each episode."""
    count = lambda name: float(v[_I[name]] - start[_I[name]])  # noqa: E731
    return {"health": float(v[_I["HEALTH"]]), "armor": float(v[_I["ARMOR"]]),
            "ammo": float(v[_I["SELECTED_WEAPON_AMMO"]]), "kills": count("KILLS"),
            "level_kills": count("KILLCOUNT"), "deaths": count("DEATHCOUNT"), "damage": count("DAMAGECOUNT"),
            "hits": count("HITCOUNT"), "frags": count("FRAGCOUNT"), "dead": bool(v[_I["DEAD"]])}


def bot_frags(v: np.ndarray, start: np.ndarray, players: int) -> np.ndarray:
    """Per slot after the ``players`` learners' (the bots'), its frags since the episode's start,
    from one player's game variables (every player reads the same slots)."""
    slots = [_I[f"PLAYER{k}_FRAGCOUNT"] for k in range(players + 1, MAX_SLOTS + 1)]
    return v[slots] - start[slots]


def died(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Whether players (their game variables ``[..., len(VARIABLES)]`` around one step) died in
    that step, ``[...]`` bool."""
    return ((after[..., _I["DEATHCOUNT"]] > before[..., _I["DEATHCOUNT"]])
            | ((after[..., _I["DEAD"]] != 0) & (before[..., _I["DEAD"]] == 0)))


def reward_parts(before: np.ndarray, after: np.ndarray, w: RewardWeights,
                 own_kills: bool = True) -> tuple[np.ndarray, float]:
    """``before``/``after``: ``[N, len(VARIABLES)]`` game variables of the N players around one
    step. Returns (per-player part ``[N]``, shared part). Health and ammo jump back to their start
    values on respawn, so their changes count only while the player stays alive through the step.
    Without ``own_kills`` every player's ``KILLS`` is the level's count, which the team's counts once."""
    d = after - before
    alive = (before[:, _I["DEAD"]] == 0) & (after[:, _I["DEAD"]] == 0) & ~died(before, after)
    # HEALTH has been seen to read -999900 for a dead player; clip before taking the change.
    health = np.clip(after[:, _I["HEALTH"]], 0, 200) - np.clip(before[:, _I["HEALTH"]], 0, 200)
    ammo = after[:, AMMO].sum(1) - before[:, AMMO].sum(1)
    player = (w.kills * d[:, _I["KILLS"]] + w.frags * d[:, _I["FRAGCOUNT"]] + w.damage * d[:, _I["DAMAGECOUNT"]] + w.deaths * d[:, _I["DEATHCOUNT"]]
              + np.where(alive, w.health * health + w.ammo * ammo, 0.0))
    shared = w.team_kills * float(d[:, _I["KILLS"]].sum() if own_kills else d[0, _I["KILLCOUNT"]])
    return player.astype(np.float32), shared


def state_features(v: np.ndarray) -> np.ndarray:
    """``[N, len(VARIABLES)]`` -> ``[N, 8]`` float32 features of each player for the ``variables``
    global state: health, armor, ammo, dead, position, heading (as cos/sin), roughly in [-1, 1]."""
    angle = np.deg2rad(v[:, _I["ANGLE"]])
    return np.stack([np.clip(v[:, _I["HEALTH"]], 0, 200) / 100.0, v[:, _I["ARMOR"]] / 100.0,
                     v[:, AMMO].sum(1) / 200.0, v[:, _I["DEAD"]],
                     v[:, _I["POSITION_X"]] / 2000.0, v[:, _I["POSITION_Y"]] / 2000.0,
                     np.cos(angle), np.sin(angle)], 1).astype(np.float32)


STATE_FEATURES = 8
