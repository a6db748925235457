"""The ``env:`` settings of a Doom co-op env (``env.type: doom``); every key is documented in
docs/envs.md."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

from marlkit.config import ConfigError, EnvConfig, value_range
from marlkit.envs.doom.rewards import RewardWeights
from marlkit.registry import closest

DEFAULT_BUTTONS = ["ATTACK", "MOVE_FORWARD", "MOVE_BACKWARD", "MOVE_LEFT", "MOVE_RIGHT", "TURN_LEFT", "TURN_RIGHT"]


@dataclass
class DoomConfig(EnvConfig):
    type: str = "doom"
    scenario: str = "deathmatch.cfg"          # a .cfg shipped with vizdoom, or a path to your own
    doom_map: Optional[str] = None            # e.g. map02; None keeps the scenario's
    skill: Optional[int] = field(default=None, metadata=value_range(1, 5))
    # a co-op match: a host and at least one player joining it; ZDoom's network game takes up to 8
    players: int = field(default=2, metadata=value_range(2, 8))
    resolution: str = "RES_160X120"           # a vizdoom.ScreenResolution name
    grayscale: bool = True
    frame_skip: int = field(default=4, metadata=value_range(1))    # tics per step, played 2 per barrier
    episode_timeout: Optional[int] = field(default=2100, metadata=value_range(1))  # tics (35 per second)
    episode_start_time: int = field(default=70, metadata=value_range(0))  # tics before the first observation: a
                                              # network game opens each episode with ZDoom's screen wipe
    respawn: bool = True                      # false: a dead player is out until the episode ends, which
                                              # it does when every player is dead (or at the timeout)
    deathmatch: bool = False                  # players fight each other (and the bots): frags, a winner
    bots: int = field(default=0, metadata=value_range(0, 14))   # ZDoom's built-in bots in the match (deathmatch)
    buttons: list[str] = field(default_factory=lambda: list(DEFAULT_BUTTONS))
    actions: Optional[list[list[str]]] = None  # the discrete action table; None: no-op + each button alone
    reward: RewardWeights = field(default_factory=RewardWeights)
    state: Literal["variables", "screens"] = "variables"
    port: Optional[int] = field(default=None, metadata=value_range(1, 65535))  # base port (env i: port + i); None: free ports
    player_timeout: float = field(default=10.0, metadata=value_range(0.1))     # s before a silent player is an error
    start_timeout: float = field(default=30.0, metadata=value_range(1.0))
    restart_on_failure: bool = False          # restart a failed match (counted, logged) instead of raising
    host_args: list[str] = field(default_factory=list)   # extra engine arguments for the host, e.g. +timelimit 1
    add_starts: bool = True                   # give single-player maps a start per player (coop_starts.py)
    fresh_inventory: bool = True              # every episode starts with the map's inventory and health (coop_starts.py)
    own_kills: bool = True                    # count each player's own kills (kill_credit.py); false: every
                                              # player's kills are the level's count (infighting included)
    start_spacing: float = field(default=64.0, metadata=value_range(16.0))   # map units between added starts
    engine_wait: Literal["yield", "spin"] = "yield"   # an engine waiting for its peers gives its core away
                                              # (engine_wait.c, preloaded) or spins as ViZDoom does

    def __post_init__(self):
        if self.bots and not self.deathmatch:
            raise ConfigError(f"env.bots: {self.bots} bots fight the players, which a co-op match does not allow; "
                              "set env.deathmatch: true")
        if self.players + self.bots > 16:
            raise ConfigError(f"env.players: {self.players} and env.bots: {self.bots} make {self.players + self.bots} "
                              "slots; a match holds 16 at most")
        if not self.buttons:
            raise ConfigError("env.buttons is empty; list vizdoom Button names, e.g. [ATTACK, TURN_LEFT, TURN_RIGHT]")
        if len(set(self.buttons)) != len(self.buttons):
            raise ConfigError(f"env.buttons: {self.buttons} lists a button twice")
        for i, combo in enumerate(self.actions or []):
            unknown = [b for b in combo if b not in self.buttons]
            if unknown:
                raise ConfigError(f"env.actions[{i}]: {unknown} not in env.buttons {self.buttons}; add them there")

    def action_table(self) -> list[list[float]]:
        """Per discrete action, the value of every button (1 pressed, 0 not)."""
        combos = self.actions if self.actions is not None else [[]] + [[b] for b in self.buttons]
        return [[1.0 if b in combo else 0.0 for b in self.buttons] for combo in combos]

    def scenario_path(self) -> str:
        """The scenario .cfg as an absolute path (the workers run in a directory of their own)."""
        vzd = import_vizdoom()
        path = Path(self.scenario).expanduser()
        if not path.is_file():
            path = Path(vzd.scenarios_path) / self.scenario
        if not path.is_file():
            shipped = sorted(p.name for p in Path(vzd.scenarios_path).glob("*.cfg"))
            raise ConfigError(f"env.scenario: {self.scenario!r} is neither a file nor a scenario shipped with "
                              f"vizdoom ({', '.join(shipped)})")
        return str(path.resolve())

    def check_names(self) -> None:
        """Button and resolution names, checked against the installed vizdoom."""
        vzd = import_vizdoom()
        for b in self.buttons:
            if not hasattr(vzd.Button, b):
                valid = [n for n in dir(vzd.Button) if n.isupper()]
                raise ConfigError(f"env.buttons: unknown button {b!r}{closest(b, valid)}")
        if not hasattr(vzd.ScreenResolution, self.resolution):
            valid = [n for n in dir(vzd.ScreenResolution) if n.startswith("RES_")]
            raise ConfigError(f"env.resolution: unknown {self.resolution!r}{closest(self.resolution, valid)}; "
                              "e.g. RES_160X120, RES_320X240")


def import_vizdoom():
    try:
        import vizdoom
    except ImportError:
        raise ConfigError("the doom env needs ViZDoom: pip install 'marlkit[doom]' (make install does)") from None
    return vizdoom
