"""One player's ViZDoom game in its own process.

The worker owns one ``DoomGame``, whose engine is a child process of the worker. Both live in a
process group of their own (the worker calls ``setpgid`` before the engine starts), so that one
``killpg`` removes the pair. Engines never notice that their controller died and ignore SIGTERM,
so the worker makes sure they go with it:

- SIGTERM (a parent's ``terminate()``, multiprocessing's exit handler) kills the group;
- a watchdog thread kills the group as soon as the parent process is gone, even while the main
  thread is blocked inside ``make_action`` waiting on a peer that will never answer;
- the parent kills the group in ``close()`` after a short grace period;
- a worker killed with SIGKILL runs none of the above (Ray kills an actor's child processes that
  way), so a sentinel of its own, outside the group, kills the group once the worker is gone.

Lockstep: in a network game every engine needs every peer's input for each tic, and more than
2 tics per barrier hangs the engines (measured: ``make_action(a, 3 or 4)`` deadlocked within a few
dozen steps, 1 or 2 tics ran thousands cleanly). A step of ``k`` tics is therefore played in chunks
of at most 2 tics, with a barrier shared by the players of one match between chunks.

The engine starts through a launcher (``keeper.py``) that records its instance id, whose shared
memory files are released with the match's folder, and where the match has a network of its own,
puts it there, so that its UDP socket is reachable from the match's players alone.

This module imports neither torch nor marlkit beyond its sentinel, kill credit and keeper (a spawned
worker still imports the ``marlkit.envs`` package on the way here, but not torch or the agents).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from marlkit.envs.doom import keeper
from marlkit.envs.doom.kill_credit import kills_variable
from marlkit.envs.sentinel import kill_when_gone

TICS_PER_BARRIER = 2
MAX_SLOTS = 16   # players and bots in one match, ZDoom's most
VARIABLES = ["KILLCOUNT", "KILLS", "HEALTH", "ARMOR", "SELECTED_WEAPON_AMMO", "DAMAGECOUNT", "HITCOUNT", "DEATHCOUNT",
             "DAMAGE_TAKEN", "DEAD", "POSITION_X", "POSITION_Y", "ANGLE",
             *(f"AMMO{i}" for i in range(10)), "FRAGCOUNT", "PLAYER_COUNT",
             *(f"PLAYER{k}_FRAGCOUNT" for k in range(1, MAX_SLOTS + 1))]
"""Game variables every player reports, in this order (rewards, info and the global state use them).
``KILLCOUNT`` is the level's count of dead monsters, the same for every player; ``KILLS`` the
player's own kills (``kill_credit.py``; the level's count again where the WAD does not count them);
``FRAGCOUNT`` its frags in a deathmatch (another player killed: +1, itself: -1), ``PLAYER_COUNT``
the players in the match (bots included), and
``PLAYER<k>_FRAGCOUNT`` those of the match's k-th slot, the same for every player: the learners
hold the first slots, the built-in bots the ones after."""


@dataclass
class PlayerSettings:
    """Everything one player's worker needs; picklable, so it crosses the process boundary."""

    player: int
    players: int
    port: int
    config: str                       # absolute path of the scenario .cfg
    work_dir: str                     # ViZDoom writes _vizdoom.ini, _vizdoom/ and crash logs here
    wad: str | None = None            # a WAD replacing the cfg's (the map with a start per player)
    resolution: str = "RES_160X120"
    grayscale: bool = True
    buttons: list[str] = field(default_factory=list)
    doom_map: str | None = None
    skill: int | None = None
    episode_timeout: int | None = None
    episode_start_time: int = 70      # tics played before an episode's first observation
    respawn: bool = True              # dead players come back (after 2 tics) or stay out of the episode
    deathmatch: bool = False          # players fight each other (and the bots) instead of co-operating
    bots: int = 0                     # ZDoom's built-in bots the host adds at every episode's start
    own_kills: bool = True            # the WAD counts each player's kills (kill_credit.py)
    host_args: list[str] = field(default_factory=list)
    join_args: list[str] = field(default_factory=list)
    connect_timeout: int = 10
    barrier_timeout: float = 10.0
    network: tuple[int, int] | None = None   # (keeper pid, namespace inode) the engine joins; None: the host's
    preload: str | None = None        # a library the engine preloads (engine_wait.py); None: none


def log_path(work_dir: str, player: int) -> str:
    return os.path.join(work_dir, f"player_{player}.log")


def player_dir(work_dir: str, player: int) -> str:
    """A directory per player: engines starting side by side in one directory race to create
    ``_vizdoom/`` there, and the loser crashes ("Failed to create ./_vizdoom/ directory: File exists")."""
    return os.path.join(work_dir, f"player_{player}")


def _kill_group(*_):
    os.killpg(0, signal.SIGKILL)


def _watch_parent(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            _kill_group()
        time.sleep(0.2)


def build_game(s: PlayerSettings):
    import vizdoom as vzd
    game = vzd.DoomGame()
    game.load_config(s.config)
    if s.wad:
        game.set_doom_scenario_path(s.wad)
    if s.doom_map:
        game.set_doom_map(s.doom_map)
    if s.skill is not None:
        game.set_doom_skill(s.skill)
    game.set_doom_config_path(os.path.join(player_dir(s.work_dir, s.player), "_vizdoom.ini"))
    engine = os.path.join(os.path.dirname(vzd.__file__), "vizdoom")
    game.set_vizdoom_path(keeper.launcher(os.path.join(player_dir(s.work_dir, s.player), "engine"), s.network,
                                          engine))
    game.set_mode(vzd.Mode.PLAYER)   # some scenario files (cig, multi) set ASYNC_PLAYER
    game.set_window_visible(False)
    game.set_sound_enabled(False)
    game.set_screen_resolution(getattr(vzd.ScreenResolution, s.resolution))
    game.set_screen_format(vzd.ScreenFormat.GRAY8 if s.grayscale else vzd.ScreenFormat.CRCGCB)
    if s.buttons:
        game.set_available_buttons([getattr(vzd.Button, b) for b in s.buttons])
    game.set_available_game_variables(game_variables(vzd, s.player if s.own_kills else None))
    if s.episode_timeout is not None:
        game.set_episode_timeout(s.episode_timeout)
    game.set_episode_start_time(s.episode_start_time)
    if s.player == 0:
        # Respawning through the engine: respawn_player() loops tics until the player is alive,
        # and those tics need the peers, who are waiting on us -> deadlock in lockstep.
        # Maps with one co-op start place the other players on deathmatch starts; picked at random,
        # a spot blocked by a monster ends the game with "No player 2 start" (seen on deathmatch.cfg),
        # while the farthest spot is always taken.
        # Without forced respawn a dead co-op player comes back only when it presses USE or ATTACK,
        # which the env never does for it: it stays dead until the next episode.
        respawn = ["+sv_forcerespawn 1", "+viz_respawn_delay 0"] if s.respawn else ["+sv_forcerespawn 0"]
        args = [f"-host {s.players}", "-netmode 0", f"-port {s.port}", *respawn, "+sv_spawnfarthest 1",
                f"+viz_connect_timeout {s.connect_timeout}", *(["-deathmatch"] if s.deathmatch else []),
                *s.host_args]
    else:
        args = [f"-join 127.0.0.1 -port {s.port}", *s.join_args]
    if s.bots:   # every engine of the match reads the bots' definitions, the joiners' too (one without crashes)
        args.append(f"+viz_bots_path {os.path.join(os.path.dirname(vzd.__file__), 'bots.cfg')}")
    game.add_game_args(" ".join([*args, f"+name P{s.player}", f"+colorset {s.player % 8}"]))
    return game


def game_variables(vzd, player: int | None = None) -> list:
    """The ``vizdoom.GameVariable`` of each name in ``VARIABLES``, in that order; ``KILLS`` is
    ``player``'s own kills (None: the level's count)."""
    own = kills_variable(player) if player is not None else "KILLCOUNT"
    return [getattr(vzd.GameVariable, own if v == "KILLS" else v) for v in VARIABLES]


class _Player:
    def __init__(self, game, s: PlayerSettings, barrier):
        self.game, self.s, self.barrier = game, s, barrier
        shape = (game.get_screen_height(), game.get_screen_width())
        self.screen = np.zeros(shape if s.grayscale else (3, *shape), np.uint8)
        self.variables = np.zeros(len(VARIABLES), np.float64)
        self.n_buttons = game.get_available_buttons_size()
        import vizdoom as vzd
        self.game_variables = game_variables(vzd, s.player if s.own_kills else None)

    def observe(self) -> tuple:
        """(screen ``[H, W]`` gray or ``[3, H, W]`` RGB, variables, episode finished, time limit
        reached). A finished episode has no state any more: its last screen is repeated, but the
        variables are read one by one, which still gives their final values (the kill that ended
        the episode, measured on basic.cfg, would otherwise be lost)."""
        state = self.game.get_state()
        if state is not None:
            self.screen = state.screen_buffer
            self.variables = np.asarray(state.game_variables, np.float64)
        else:
            self.variables = np.array([self.game.get_game_variable(v) for v in self.game_variables], np.float64)
        finished = self.game.is_episode_finished()
        return self.screen, self.variables, finished, finished and self.game.is_episode_timeout_reached()

    def step(self, buttons: list, tics: int) -> tuple:
        """Play ``tics`` tics of ``buttons``. Every chunk updates the state, though only the last
        one's screen is used: the engine writes kills, damage, hits and the USER variables out only
        on an updating tic, and once the level has ended no tic is possible any more, so a level
        that ends inside a chunk played without an update loses its last kill (measured on
        basic.cfg: in about half of the episodes that its one kill ends). Playing the first chunks
        without an update saves the engine little next to that."""
        self.game.set_action(buttons)
        for done_tics in range(0, tics, TICS_PER_BARRIER):
            if done_tics:
                self.barrier.wait(self.s.barrier_timeout)
            if not self.game.is_episode_finished():
                chunk = min(TICS_PER_BARRIER, tics - done_tics)
                self.game.advance_action(chunk)
        return self.observe()

    def reset(self, seed: int | None) -> tuple:
        if seed is not None:
            self.game.set_seed(int(seed) % (2 ** 31))
        self.game.new_episode()   # every player must call it; it returns once all have
        self.add_bots()
        return self.observe()

    def add_bots(self) -> None:
        """The host brings the match's bots in afresh (ZDoom drops them at a new episode, and a bot
        kept over would keep its frags); the engine runs them, reading ``bots.cfg`` beside it."""
        if self.s.player == 0 and self.s.bots:
            self.game.send_game_command("removebots")
            for _ in range(self.s.bots):
                self.game.send_game_command("addbot")


def run(conn, settings: PlayerSettings, barrier, parent_pid: int) -> None:
    """Worker entry point: serve ``reset``/``step``/``close`` commands from the parent."""
    os.setpgid(0, 0)
    kill_when_gone([-os.getpid()])   # this group, engine included
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # the parent owns Ctrl+C and stops us in order
    signal.signal(signal.SIGTERM, _kill_group)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    own_dir = player_dir(settings.work_dir, settings.player)
    os.makedirs(own_dir, exist_ok=True)
    os.chdir(own_dir)    # crash logs land in the current directory whatever the config says
    # The engine (our child) inherits these: its chatter goes to a log the parent quotes on failure.
    log = os.open(log_path(settings.work_dir, settings.player), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    if settings.preload:   # for the engine, our only child; this process has long been loaded
        os.environ["LD_PRELOAD"] = " ".join(filter(None, [settings.preload, os.environ.get("LD_PRELOAD")]))
    game = None
    try:
        game = build_game(settings)
        game.init()
        player = _Player(game, settings, barrier)
        conn.send(("ready", {"buttons": player.n_buttons, "screen": player.screen.shape}))
        while True:
            try:
                cmd, arg = conn.recv()
            except (EOFError, OSError):
                break
            if cmd == "step":
                action, tics = arg
                conn.send(("ok", player.step(action, tics)))
            elif cmd == "reset":
                conn.send(("ok", player.reset(arg)))
            elif cmd == "close":
                break
    except Exception as exc:   # reported to the parent, which names the env and the player
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
    finally:
        if game is not None:
            game.close()
        conn.close()
