"""ViZDoom co-op as a PettingZoo ``ParallelEnv``: N players in one lockstep network game.

Per player ``player_i``: observation ``[C, H, W]`` uint8 (C = 1 grayscale, 3 RGB), a Discrete
action indexing ``DoomConfig.action_table()``, a reward = per-player part + shared part (both also
in ``info``), and in ``info`` the player's game variables (health, armor, ammo, kills, deaths,
damage, hits, dead). With ``respawn`` (the default) every player stays in the game for the whole
episode (dead players come back) and the episode ends for all players on the same step; without
it a player that dies is terminated and out (its engine idles in lockstep) until the episode
ends, which it does when the last player dies or at the timeout.
"""
from __future__ import annotations

import logging

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from marlkit.config import build
from marlkit.envs.doom.config import DoomConfig
from marlkit.envs.doom import engine_wait
from marlkit.envs.doom.coop_starts import coop_scenario_wad
from marlkit.envs.doom.match import DoomMatch, DoomPlayerError
from marlkit.envs.doom.rewards import (STATE_FEATURES, bot_frags, died, player_stats, reward_parts,
                                       state_features)
from marlkit.envs.doom.worker import VARIABLES, PlayerSettings

log = logging.getLogger("marlkit.doom")

def screen_shape(resolution: str) -> tuple[int, int]:
    """(H, W) of a ``RES_<W>X<H>`` name."""
    w, h = resolution.removeprefix("RES_").split("X")
    return int(h), int(w)


class DoomCoopEnv(ParallelEnv):
    metadata = {"render_modes": ["rgb_array"], "name": "doom_coop_v0", "is_parallelizable": True}

    def __init__(self, config: DoomConfig | None = None, index: int = 0, render_mode: str | None = None, **options):
        """``config`` or the same settings as keyword arguments (``players=4, frame_skip=2``);
        ``index`` is the env's place in a vector env, used in error messages and for fixed ports."""
        cfg = config if config is not None else build(DoomConfig, options, "env")
        cfg.check_names()
        self.cfg, self.index, self.render_mode = cfg, index, render_mode
        self.metadata = {**self.metadata, "render_fps": max(1, round(35 / cfg.frame_skip))}
        self.table = cfg.action_table()
        self.possible_agents = [f"player_{i}" for i in range(cfg.players)]
        self._index = {a: i for i, a in enumerate(self.possible_agents)}
        self.agents: list[str] = []
        h, w = screen_shape(cfg.resolution)
        self._channels = 1 if cfg.grayscale else 3
        obs_space = spaces.Box(0, 255, (self._channels, h, w), np.uint8)
        act_space = spaces.Discrete(len(self.table))
        self.observation_spaces = {a: obs_space for a in self.possible_agents}
        self.action_spaces = {a: act_space for a in self.possible_agents}
        if cfg.state == "screens":
            self.state_space = spaces.Box(0, 255, (cfg.players * self._channels, h, w), np.uint8)
        else:
            self.state_space = spaces.Box(-np.inf, np.inf, (cfg.players * STATE_FEATURES + 1,), np.float32)
        scenario = cfg.scenario_path()
        wad = coop_scenario_wad(scenario, cfg.doom_map, cfg.players, cfg.start_spacing, cfg.add_starts and cfg.players > 1,
                                cfg.fresh_inventory and cfg.players > 1, cfg.own_kills)
        settings = PlayerSettings(player=0, players=cfg.players, port=0, config=scenario, wad=wad, work_dir="",
                                  resolution=cfg.resolution, grayscale=cfg.grayscale, buttons=list(cfg.buttons),
                                  doom_map=cfg.doom_map, skill=cfg.skill, episode_timeout=cfg.episode_timeout,
                                  episode_start_time=cfg.episode_start_time, respawn=cfg.respawn,
                                  deathmatch=cfg.deathmatch, bots=cfg.bots,
                                  own_kills=cfg.own_kills, host_args=list(cfg.host_args),
                                  preload=engine_wait.library() if cfg.engine_wait == "yield" else None)
        self.match = DoomMatch(settings, name=f"env {index}",
                               port=None if cfg.port is None else cfg.port + index,
                               timeout=cfg.player_timeout, start_timeout=cfg.start_timeout)
        self.restarts = 0
        self._screens = np.zeros((cfg.players, self._channels, h, w), np.uint8)
        self._vars = self._start = None   # game variables [N, V]: now, and at the episode's start
        self._tics = 0
        self.last_episode: dict[str, dict] = {}   # per player, the game stats of the last finished episode
        self.last_bots: list[float] = []          # per bot, its frags in the last finished episode
        self.match.start()

    def observation_space(self, agent):
        return self.observation_spaces[agent]

    def action_space(self, agent):
        return self.action_spaces[agent]

    # ------------------------------------------------------------------ engine answers -> arrays

    def _take(self, answers: list) -> tuple[np.ndarray, bool, bool]:
        """Store screens and variables; returns (variables ``[N, V]``, finished, time limit)."""
        for i, (screen, _, _, _) in enumerate(answers):
            self._screens[i] = screen.reshape(self._screens.shape[1:])
        variables = np.stack([a[1] for a in answers])
        finished = [a[2] for a in answers]
        if any(finished) and not all(finished):
            # Never seen: the engines agree on the tic an episode ends. Should a scenario differ,
            # the players who go on would wait for the ones who stopped, so it is an error.
            raise DoomPlayerError(f"env {self.index}: the episode ended for players "
                                  f"{[i for i, f in enumerate(finished) if f]} only")
        return variables, all(finished), any(a[3] for a in answers)

    def _observations(self, agents: list[str]) -> dict:
        return {a: self._screens[self._index[a]].copy() for a in agents}

    def _infos(self, agents: list[str], player: np.ndarray | None = None, shared: float = 0.0) -> dict:
        out = {}
        for a in agents:
            i = self._index[a]
            out[a] = {**player_stats(self._vars[i], self._start[i]),
                      "reward_player": float(player[i]) if player is not None else 0.0,
                      "reward_shared": shared, "restarts": self.restarts}
        return out

    def state(self) -> np.ndarray:
        if self.cfg.state == "screens":
            return self._screens.reshape(self.state_space.shape).copy()
        timeout = self.cfg.episode_timeout
        progress = min(self._tics / timeout, 1.0) if timeout else 0.0
        return np.append(state_features(self._vars).reshape(-1), np.float32(progress)).astype(np.float32)

    # ------------------------------------------------------------------ ParallelEnv

    def reset(self, seed: int | None = None, options: dict | None = None):
        try:
            answers = self.match.reset(seed)
        except DoomPlayerError as exc:
            self._restart_or_raise(exc)
            answers = self.match.reset(seed)
        self._vars, _, _ = self._take(answers)
        self._start = self._vars.copy()
        self._tics = 0
        self.agents = list(self.possible_agents)
        return self._observations(self.agents), self._infos(self.agents)

    def step(self, actions: dict):
        if not self.agents:
            raise RuntimeError("step() after the episode ended; call reset()")
        acting = list(self.agents)
        idle = [0.0] * len(self.cfg.buttons)   # a player out of the episode presses nothing (USE would respawn it)
        buttons = [self.table[int(actions.get(a, 0))] if a in self.agents else idle for a in self.possible_agents]
        before = self._vars
        try:
            variables, finished, time_up = self._take(self.match.step(buttons, self.cfg.frame_skip))
        except DoomPlayerError as exc:
            self._restart_or_raise(exc)
            # The interrupted episode is cut here: it ends truncated, with its last observation.
            self.agents = []
            self.last_episode, self.last_bots = self._stats_now(), self._bots_now()
            return (self._observations(acting), {a: 0.0 for a in acting}, {a: False for a in acting},
                    {a: True for a in acting}, self._infos(acting))
        self._vars = variables
        self._tics += self.cfg.frame_skip
        player, shared = reward_parts(before, variables, self.cfg.reward, self.cfg.own_kills)
        dead_now = died(before, variables)
        out = set() if self.cfg.respawn else {a for a in acting if dead_now[self._index[a]]}
        rewards = {a: float(player[self._index[a]] + shared) for a in acting}
        terminations = {a: (finished and not time_up) or a in out for a in acting}
        truncations = {a: finished and time_up and a not in out for a in acting}
        infos = self._infos(acting, player, shared)
        self.agents = [] if finished else [a for a in acting if a not in out]
        if not self.agents:
            self.last_episode, self.last_bots = self._stats_now(), self._bots_now()
        return self._observations(acting), rewards, terminations, truncations, infos

    def _stats_now(self) -> dict[str, dict]:
        return {a: player_stats(self._vars[i], self._start[i]) for i, a in enumerate(self.possible_agents)}

    def _bots_now(self) -> list[float]:
        """Per bot, its frags since the episode's start (every player reads the bots' slots alike)."""
        return [float(f) for f in bot_frags(self._vars[0], self._start[0], self.cfg.players)[:self.cfg.bots]]

    def episode_stats(self) -> dict[str, float]:
        """The team's numbers for the episode that just ended: ``kills``, deaths, damage dealt and
        hits summed over the players, each player's own kills (``kills_player_<i>``), the level's
        count of dead monsters (``level_kills``: monsters killed by monsters too), and the match
        restarts of this env so far. An episode cut from outside (a wrapper's step limit) ends
        while players are still in it: its numbers are the ones so far. Without ``env.own_kills``
        every player's kills are the level's count, and so are the team's."""
        last = self._stats_now() if self.agents else self.last_episode
        players = last.values()
        team = {k: float(sum(p[k] for p in players)) for k in ("kills", "deaths", "damage", "hits")}
        if not self.cfg.own_kills:
            team["kills"] = float(last["player_0"]["kills"])
        if self.cfg.deathmatch:
            team.update(self._deathmatch_stats(last, self._bots_now() if self.agents else self.last_bots))
        return {**team,
                **{f"kills_{a}": float(p["kills"]) for a, p in last.items()},
                "level_kills": float(last["player_0"]["level_kills"]), "restarts": float(self.restarts)}

    def _deathmatch_stats(self, last: dict[str, dict], bots: list[float]) -> dict[str, float]:
        """``frags`` of the players together and each one's (``frags_player_<i>``), the bots' together
        (``bot_frags``), the bots in the match (``bots_present``), and who won (``won_player_<i>``: more frags than every other player and bot)."""
        frags = {a: p["frags"] for a, p in last.items()}
        out = {"frags": float(sum(frags.values())), "bot_frags": float(sum(bots)),
               "bots_present": float(self._vars[0][VARIABLES.index("PLAYER_COUNT")] - self.cfg.players),
               **{f"frags_{a}": f for a, f in frags.items()}}
        for a, f in frags.items():
            rivals = [v for b, v in frags.items() if b != a] + bots
            out[f"won_{a}"] = float(f > max(rivals))
        return out

    def _restart_or_raise(self, exc: DoomPlayerError) -> None:
        if not self.cfg.restart_on_failure:
            raise exc
        self.restarts += 1
        log.warning("%s; restarting the match (restart %d of this env)", exc, self.restarts)
        self.match.close(grace=0.0)
        self.match.start()

    def render(self) -> np.ndarray:
        """Every player's screen side by side, ``[H, N * W, 3]`` uint8 RGB."""
        rgb = np.repeat(self._screens, 3, axis=1) if self._channels == 1 else self._screens
        return np.concatenate(list(rgb.transpose(0, 2, 3, 1)), axis=1)

    def close(self) -> None:
        self.match.close()

    def __reduce__(self):
        # The game lives in engine processes, not in this object; an unpicklable env makes a resume
        # start fresh episodes instead of continuing a desynchronised copy.
        raise TypeError("a DoomCoopEnv cannot be pickled: its state lives in the game engines")
