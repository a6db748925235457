"""mettagrid (the C++ gridworld of the PufferLib ecosystem) as a PettingZoo ``ParallelEnv`` whose
observations are dense images, for ``env.factory: marlkit.envs.mettagrid:parallel_env``.

mettagrid observes each agent as ``num_tokens`` tokens ``[coord, feature_id, value]`` (uint8): the
coordinate byte holds the row in its high nibble and the column in its low one, ``0xFF`` pads the
list and ``0xFE`` marks a global token (episode progress, last action, last reward), which belongs
to no cell and is drawn at the centre of the view, where the agent itself stands (as mettagrid's
own ``GridObsWrapper``). A CNN wants images, so every step the tokens of all agents become one
``[A, H, W, C]`` uint8 array in one vectorised scatter (:class:`TokenGrid`): channels last, the
memory layout the ``cnn`` model convolves in, so that the update moves no pixels before converting
them to floats (the env declares the layout, ``channels_last``: ``(13, 13, 19)`` would be guessed
wrong).

The map is built from mettagrid's own ``make_navigation`` game (moves and a no-op; each heart in an
agent's inventory pays 1), on its ``RandomMapBuilder``. mettagrid ships no object that hands out
hearts, so the ``forage`` map adds one: a heart lying on the floor, picked up (and gone) when an
agent walks into it. The episode's step limit is a truncation (bootstrapped), not mettagrid's
default termination.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np
from gymnasium import spaces

from marlkit.config import ConfigError
from marlkit.envs.array_env import ArrayParallelEnv

PADDING = 0xFF
GLOBAL = 0xFE
MAPS = ("forage",)


def _import_mettagrid():
    try:
        import mettagrid  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"env.factory: mettagrid is not installed ({exc}); pip install -e .[mettagrid]") from None


class TokenGrid:
    """``[A, T, 3]`` uint8 tokens -> ``[A, H, W, C]`` uint8 images.

    A token's value lands at (row, column, feature); a global token at the centre cell; padding,
    cells outside the view and unknown feature ids are dropped. Values are stored as
    ``value * 255 / normalisation`` (mettagrid's per-feature scale, at least 1), clipped to 255, so
    that the ``cnn`` model's 1/255 turns a cell into ``value / normalisation`` as ``GridObsWrapper``
    computes it, in a quarter of float32's bytes in every buffer and pipe. mettagrid writes at most
    one token per cell and feature, so tokens are assigned, not summed.

    ``categories`` (feature id -> how many values) adds, after those channels, one channel per value
    of each such feature, 255 where the cell holds that value: a category (an object's tag: agent,
    heart, wall) as its own plane, where its scaled value (0, 0.1, 0.2) would tell a heart from a
    wall by a tenth, and would leave a tag of 0 (another agent) unseen.
    """

    def __init__(self, height: int, width: int, normalisation: dict[int, float],
                 categories: dict[int, int] | None = None):
        categories = categories or {}
        features = max(normalisation, default=0) + 1
        c = features + sum(categories.values())
        self.shape = (height, width, c)
        self.size = c * height * width
        dropped = -self.size                                        # below any offset added to it
        # lookups indexed by one byte (the coordinate) or by two bytes read as one little-endian
        # uint16 straight from the token array (coordinate | feature << 8, feature | value << 8):
        # one fancy index per token instead of a chain of small array operations
        byte = np.arange(256)
        rows, cols = byte >> 4, byte & 0x0F
        rows[GLOBAL], cols[GLOBAL] = height // 2, width // 2
        inside = (rows < height) & (cols < width)
        inside[PADDING] = False
        self.cell = np.where(inside, (rows * width + cols) * c, dropped)  # coordinate -> its cell's offset
        channel = np.where(byte < features, byte, dropped)                 # feature -> its channel
        low, high = np.arange(65536) & 0xFF, np.arange(65536) >> 8
        where = self.cell[low] + channel[high]                      # coordinate | feature << 8 -> offset
        self.where = np.where(where >= 0, where, -1)
        scale = np.zeros(256, np.float32)                           # feature -> 255 / normalisation
        for fid, norm in normalisation.items():
            scale[fid] = 255.0 / max(float(norm), 1.0)
        # feature | value << 8 -> the stored byte
        self.stored = np.minimum(np.rint(high.astype(np.uint8) * scale[low]), 255).astype(np.uint8)
        # feature | value << 8 -> the channel of that value's plane, where the feature is a category
        first_plane = np.full(256, dropped)
        values = np.zeros(256, np.int64)
        first = features
        for fid, count in sorted(categories.items()):
            first_plane[fid], values[fid] = first, count
            first += count
        self.plane = np.where(high < values[low], first_plane[low] + high, 2 * dropped) if categories else None

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        """``tokens``: ``[A, T, 3]`` uint8 -> ``[A, H, W, C]`` uint8."""
        n, t = tokens.shape[:2]
        tokens = np.ascontiguousarray(tokens, np.uint8)
        coord_feature = np.ndarray((n * t,), "<u2", tokens, 0, (3,))
        feature_value = np.ndarray((n * t,), "<u2", tokens, 1, (3,))
        # a few dozen of the 500 tokens are real: select them first, then work on those alone
        real = np.flatnonzero(tokens.reshape(n * t, 3)[:, 0] != PADDING)
        first = real // t * self.size                               # each token's agent's image
        pair = feature_value[real]
        at = self.where[coord_feature[real]]
        keep = at >= 0
        out = np.zeros(n * self.size, np.uint8)
        out[at[keep] + first[keep]] = self.stored[pair[keep]]
        if self.plane is not None:
            at = self.cell[tokens.reshape(n * t, 3)[real, 0]] + self.plane[pair]
            keep = at >= 0
            out[at[keep] + first[keep]] = 255
        return out.reshape(n, *self.shape)


def forage_config(num_agents: int, width: int, height: int, hearts: int, walls: int, max_steps: int):
    """mettagrid's ``make_navigation`` game on a walled ``width x height`` room holding ``hearts``
    hearts and ``walls`` single walls at random cells, ``max_steps`` steps per episode."""
    _import_mettagrid()
    from mettagrid.builder.envs import make_navigation
    from mettagrid.config.handler_config import Handler
    from mettagrid.config.mettagrid_config import GridObjectConfig, InventoryConfig
    from mettagrid.config.mutation import withdraw
    from mettagrid.map_builder.random_map import RandomMapBuilder

    if hearts + walls + num_agents > (width - 2) * (height - 2):
        raise ConfigError(f"env.kwargs: {hearts} hearts, {walls} walls and {num_agents} agents do not fit "
                          f"inside a {width}x{height} room ({(width - 2) * (height - 2)} free cells)")
    cfg = make_navigation(num_agents)
    cfg.game.objects["heart"] = GridObjectConfig(
        name="heart", inventory=InventoryConfig(initial={"heart": 1}),
        on_use_handler=Handler(mutations=[withdraw({"heart": 1}, remove_when_empty=True)]))
    cfg.game.map_builder = RandomMapBuilder.Config(agents=num_agents, width=width, height=height, border_width=1,
                                                   objects={"heart": hearts, "wall": walls})
    cfg.game.max_steps = max_steps
    cfg.game.episode_truncates = True
    return cfg


class MettaGridEnv(ArrayParallelEnv):
    """A PettingZoo ``ParallelEnv`` in arrays (:class:`~marlkit.envs.array_env.ArrayParallelEnv`)
    over a mettagrid config: agents ``agent_0 ..``, observations ``[H, W, C]`` uint8 images
    (declared: ``channels_last``), ``Discrete`` actions.

    It builds mettagrid's C++ game itself, one per episode as mettagrid's own PettingZoo and PufferLib
    envs do through its ``Simulation``, and declares no ``state_space``: mettagrid's PettingZoo env
    declares one whose ``state()`` is all zeros, while marlkit's default state stacks the agents'
    views. Each episode's map and game take a seed drawn from the one given to ``reset``.
    """

    metadata: ClassVar[dict] = {"name": "mettagrid", "render_modes": []}
    channels_last: ClassVar[bool] = True   # the images' layout, read by the pettingzoo adapter

    def __init__(self, cfg, tag_planes: bool = False):
        _import_mettagrid()
        from mettagrid.policy.policy_env_interface import PolicyEnvInterface

        self.cfg = cfg
        info = PolicyEnvInterface.from_mg_cfg(cfg)
        tag = [int(f.id) for f in info.obs_features if f.name == "tag"]
        categories = {tag[0]: len(info.tags)} if tag_planes and tag else {}
        self.grid = TokenGrid(info.obs_height, info.obs_width, {int(f.id): f.normalization for f in info.obs_features},
                              categories)
        self.possible_agents = [f"agent_{i}" for i in range(cfg.game.num_agents)]
        self.agents: list[str] = []
        self._obs_space = spaces.Box(0, 255, self.grid.shape, np.uint8)
        self._act_space = spaces.Discrete(len(info.action_names))
        game_ids = {action.name: i for i, action in enumerate(cfg.game.actions.actions())}   # as Simulation's
        self._action_ids = np.array([game_ids[name] for name in info.action_names], np.int32)  # policy's -> game's
        # mettagrid's Simulation converts the whole config for C++ at every episode, a third of a new
        # game's time: a game that needs nothing of the Simulation (no event handler: a config's
        # end_episode_on_game_stats adds one; no talk, which nothing here sends) is built here from
        # one conversion, as the Simulation builds it. Its step is the C++ step alone: the
        # Simulation's own adds timers that cost as much Python per step as the game's C++ (docs/envs.md)
        self._cpp_config = self._agent_renames = None
        if not cfg.game.end_episode_on_game_stats:
            from mettagrid.config.mettagrid_c_config import convert_to_cpp_game_config
            # on a copy: the conversion fills in the config it is given
            self._cpp_config, self._agent_renames = convert_to_cpp_game_config(cfg.game.model_copy(deep=True))
        self._sim = None    # mettagrid's Simulation, for a game that needs it
        self._game = None   # the C++ game
        self._step = None
        self._rng = np.random.default_rng()

    def observation_space(self, agent: str) -> spaces.Box:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Discrete:
        return self._act_space

    def reset_arrays(self, seed: int | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.close()
        episode_seed = int(self._rng.integers(2**31))
        self.cfg.game.map_builder.seed = episode_seed
        if self._cpp_config is None:
            from mettagrid.simulator import Simulation
            # a Simulation of its own, not a Simulator's: that would add a count of past games to the map's seed
            self._sim = Simulation(self.cfg, seed=episode_seed)
            self._game, self._step = self._sim._c_sim, self._sim.step
        else:
            from mettagrid.config.mettagrid_c_config import rename_map_agents
            from mettagrid.mettagrid_c import MettaGrid

            grid = self.cfg.game.map_builder.create().build_for_num_agents(self.cfg.game.num_agents).grid.tolist()
            if self._agent_renames:
                grid = rename_map_agents(grid, self._agent_renames)
            self._game = MettaGrid(self._cpp_config, grid, episode_seed)
            self._step = self._game.step
        return self.grid(self._game.observations()), {}

    def step_arrays(self, actions: np.ndarray):
        game = self._game   # the game's own arrays, as mettagrid's PettingZoo and PufferLib envs read them
        game.actions()[:] = self._action_ids[actions]
        self._step()
        return (self.grid(game.observations()), game.rewards().astype(np.float32),
                game.terminals().astype(bool), game.truncations().astype(bool), {})

    def render(self):
        return None

    def close(self):
        if self._sim is not None:
            self._sim.close()
        self._sim = self._game = self._step = None


def parallel_env(map: str = "forage", num_agents: int = 4, width: int = 32, height: int = 32, hearts: int = 16,
                 walls: int = 40, max_steps: int = 128, tags: str = "scaled") -> MettaGridEnv:
    """``env.kwargs`` of ``marlkit/configs/mettagrid.yaml``. ``forage``: ``num_agents`` agents and
    ``hearts`` hearts (1 each when picked up) in a ``width x height`` room with ``walls`` walls.
    ``tags``: ``scaled``, the tag feature as one channel of ``tag / 10`` (``GridObsWrapper``'s); or
    ``planes``, a channel per tag besides (:class:`TokenGrid`'s ``categories``)."""
    if map not in MAPS:
        raise ConfigError(f"env.kwargs.map: {map!r} is not a mettagrid map marlkit builds; choose one of {list(MAPS)}")
    if tags not in ("scaled", "planes"):
        raise ConfigError(f"env.kwargs.tags: {tags!r} is not one of ['scaled', 'planes']")
    return MettaGridEnv(forage_config(num_agents, width, height, hearts, walls, max_steps), tag_planes=tags == "planes")
