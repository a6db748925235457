"""Any PettingZoo ``ParallelEnv`` (or turn-based ``AECEnv``, see ``marlkit.envs.aec``) as a
:class:`~marlkit.envs.core.MultiAgentEnv`.

Agents are assigned to groups (``env.groups`` patterns, or by default one group ``agents`` when all
spaces match or ``env.pad_spaces`` pads them to one, else one group per name prefix such as
``adversary``/``agent``). Action masks come
from an ``action_mask`` entry of a Dict observation or of the agent's info; the global state from
``env.state()`` when the env declares a ``state_space``, else a default built from the agents'
observations (:func:`default_state`), also when ``state()`` is an image: a screen holds nothing a
critic needs that the agents' own views (pooled, see ``marlkit.networks.pooled``) do not, at many
times the cost. ``state: env`` takes ``env.state()`` whatever its shape.
"""
from __future__ import annotations

import fnmatch
import importlib
import inspect
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import numpy as np
from gymnasium import spaces

from marlkit.config import ConfigError, EnvConfig
from marlkit.envs.aec import as_parallel
from marlkit.envs.array_env import AgentRows, ArrayParallelEnv, bad_action, env_actions
from marlkit.envs.core import EnvAPIError, EnvSpec, GroupSpec, MultiAgentEnv, Observation, empty_observation
from marlkit.registry import register_env
from marlkit.envs.wrappers import block_factors, resize_images
from marlkit.spec import is_channels_last

log = logging.getLogger("marlkit.pettingzoo")
_WARNED_BLANK: set[str] = set()
_STATE_FAILED: set[str] = set()   # envs whose state() failed (and was warned of) in this process


@dataclass
class PettingZooConfig(EnvConfig):
    factory: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    state: Literal["auto", "env", "concat"] = "auto"
    check_api: bool = True
    # step a ParallelEnv made from an AEC env without PettingZoo's order and action-bounds checks
    # (see without_check_wrappers)
    strip_checks: bool = True
    # a group may hold agents of different spaces (a team of unlike agents under one mixer or one
    # critic): flat observations zero-padded to the longest, Discrete actions to the most, each
    # agent's own actions alone allowed by its action mask (pad_group_spaces)
    pad_spaces: bool = False


def import_factory(path: str) -> Callable:
    """``"package.module:function"`` -> the function, with errors that say what is wrong."""
    if ":" not in path:
        raise ConfigError(f"env.factory: {path!r} must look like 'package.module:function', "
                          "e.g. 'mpe2.simple_spread_v3:parallel_env'")
    module_name, attr = path.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"env.factory: cannot import module {module_name!r} ({exc}); install it or "
                          "put it on PYTHONPATH") from None
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ConfigError(f"env.factory: module {module_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    return fn


def without_check_wrappers(env):
    """``env`` with PettingZoo's ``OrderEnforcingWrapper`` and ``AssertOutOfBoundsWrapper`` taken
    off the AEC env inside it, where it is a ParallelEnv made by ``aec_to_parallel`` (the
    ``parallel_env()`` of mpe2, sisl, butterfly); any other env, or a wrapper that changes what the
    env does (clipping actions, ending on illegal moves), is left as it is.

    The two wrappers only check what marlkit guarantees: a reset before the first step, and
    actions inside the action space (``PettingZooEnv._env_action`` checks them itself). Their
    attribute forwarding costs a good share of mpe2's step; without them simple_spread steps with
    the same dynamics, faster (docs/benchmarks.md)."""
    from pettingzoo.utils.conversions import aec_to_parallel_wrapper
    from pettingzoo.utils.wrappers import AssertOutOfBoundsWrapper, OrderEnforcingWrapper
    if type(env) is not aec_to_parallel_wrapper:
        return env
    inner = env.aec_env
    while isinstance(inner, (OrderEnforcingWrapper, AssertOutOfBoundsWrapper)):
        inner = inner.env
    return env if inner is env.aec_env else aec_to_parallel_wrapper(inner)


STATE_SIDE = 32   # the default image state shrinks each view to at most this many pixels a side


def state_factors(height: int, width: int) -> tuple[int, int]:
    """Whole-number block sizes that bring an image to at most ``STATE_SIDE`` a side (1: as is)."""
    return block_factors(height, width, STATE_SIDE)


def default_state(obs_spaces: list[spaces.Space], mode: str = "auto",
                  channels_last: bool | None = None) -> tuple[tuple[int, ...], np.dtype, bool]:
    """Shape, dtype and kind of the global state of an env without ``state()``, built from the
    observations of all agent slots (groups in order, slots in order) -> (shape, dtype, stacked).
    ``channels_last``: the images' layout as the env declares it; None: guessed from each shape.

    ``auto``: when every observation is an image of the same height and width, the images stacked
    along the channel axis, channels first (``A`` agents of ``(13, 13, 5)`` -> ``(5 * A, 13, 13)``),
    so a ``cnn`` critic can read them; views larger than ``STATE_SIDE`` pixels a side are
    shrunk by averaging whole blocks (20 agents of ``(120, 457, 3)`` -> ``(60, 30, 30)``, not 3.3
    million values a step). Otherwise (and with ``concat``) the observations flattened and
    concatenated. Either way uint8 when every observation is uint8 (a quarter of float32's bytes
    in every buffer; the model scales them), else float32.
    """
    dtype = np.dtype(np.uint8 if all(s.dtype == np.uint8 for s in obs_spaces) else np.float32)
    shapes = [tuple(s.shape) for s in obs_spaces]
    last = {shape: is_channels_last(shape) if channels_last is None else channels_last for shape in shapes}
    sides = {shape[:2] if last[shape] else shape[1:] for shape in shapes if len(shape) == 3}
    if mode == "auto" and all(len(shape) == 3 for shape in shapes) and len(set(last.values())) == 1 and len(sides) == 1:
        channels = sum(shape[2] if last[shape] else shape[0] for shape in shapes)
        (h, w), = sides
        fh, fw = state_factors(h, w)
        return (channels, h // fh, w // fw), dtype, True
    return (int(sum(np.prod(shape) for shape in shapes)),), dtype, False


def _channels_first(images: np.ndarray, channels_last: bool | None) -> np.ndarray:
    """A group's images ``[A, H, W, C]`` or ``[A, C, H, W]`` (``channels_last``; None: guessed from
    the shape) -> ``[A, C, h, w]`` (a view where nothing is shrunk), shrunk to at most
    ``STATE_SIDE`` a side by averaging whole blocks (the rows and columns left over are dropped)."""
    if is_channels_last(images.shape[1:]) if channels_last is None else channels_last:
        images = images.transpose(0, 3, 1, 2)
    fh, fw = state_factors(*images.shape[2:])
    if (fh, fw) == (1, 1):
        return images
    h, w = images.shape[2] // fh, images.shape[3] // fw
    return resize_images(images[..., :h * fh, :w * fw], (h, w))


def pad_group_spaces(group: str, names: list[str], obs_spaces: dict, act_spaces: dict) -> tuple[spaces.Box, spaces.Discrete]:
    """One observation and one action space for agents whose own differ (``env.pad_spaces``): a flat
    Box as long as the longest observation (each agent's in its first entries, zeros after) and a
    Discrete of the most choices (an agent's action mask allows its own). Other spaces are refused."""
    for name in names:
        obs, act = obs_spaces[name], act_spaces[name]
        if not isinstance(obs, spaces.Box) or len(obs.shape) > 2:
            raise ConfigError(f"env.pad_spaces: agent {name!r} of group {group!r} observes {obs}; only flat (or 2-D) "
                              "Box observations are padded: give agents with images a group of their own (env.groups)")
        if not isinstance(act, spaces.Discrete):
            raise ConfigError(f"env.pad_spaces: agent {name!r} of group {group!r} acts in {act}; only Discrete actions "
                              "are padded: give it a group of its own (env.groups)")
    width = max(int(np.prod(obs_spaces[n].shape)) for n in names)
    low, high = np.zeros(width, np.float32), np.zeros(width, np.float32)
    for n in names:
        size = int(np.prod(obs_spaces[n].shape))
        low[:size] = np.minimum(low[:size], obs_spaces[n].low.reshape(-1))
        high[:size] = np.maximum(high[:size], obs_spaces[n].high.reshape(-1))
    return spaces.Box(low, high, dtype=np.float32), spaces.Discrete(max(int(act_spaces[n].n) for n in names))


def _prefix(agent: str) -> str:
    return re.sub(r"_?\d+$", "", agent) or agent


def assign_groups(agents: list[str], patterns: dict[str, list[str]] | None, same_spaces) -> dict[str, list[str]]:
    if patterns:
        groups: dict[str, list[str]] = {g: [] for g in patterns}
        for agent in agents:
            hits = [g for g, pats in patterns.items() if any(fnmatch.fnmatchcase(agent, p) for p in pats)]
            if len(hits) != 1:
                where = "no group" if not hits else f"several groups ({', '.join(hits)})"
                raise ConfigError(f"env.groups: agent {agent!r} matches {where}; every agent of "
                                  f"{agents} must match exactly one group's patterns")
            groups[hits[0]].append(agent)
        empty = [g for g, members in groups.items() if not members]
        if empty:
            raise ConfigError(f"env.groups: group(s) {empty} match no agent; agents are {agents}")
        return groups
    if same_spaces(agents):
        return {"agents": list(agents)}
    groups = {}
    for agent in agents:
        groups.setdefault(_prefix(agent), []).append(agent)
    return groups


@register_env("pettingzoo")
class PettingZooEnv(MultiAgentEnv):
    config_cls = PettingZooConfig

    @classmethod
    def from_config(cls, cfg: PettingZooConfig, render: bool = False, index: int = 0) -> "PettingZooEnv":
        if not cfg.factory:
            raise ConfigError("env.factory is empty; set it to 'package.module:function' returning a "
                              "PettingZoo ParallelEnv")
        kwargs = dict(cfg.kwargs)
        if render or cfg.render_mode:
            kwargs["render_mode"] = cfg.render_mode or "rgb_array"
        factory = import_factory(cfg.factory)
        if "env_index" in inspect.signature(factory).parameters:
            kwargs["env_index"] = index
        try:
            env = factory(**kwargs)
        except TypeError as exc:
            if "keyword argument" not in str(exc):
                raise
            raise ConfigError(f"env.kwargs: the env factory {cfg.factory!r} refused them ({exc}); "
                              f"env.kwargs was {dict(cfg.kwargs)!r}") from None
        if cfg.strip_checks:
            env = without_check_wrappers(env)
        adapter = cls(env, groups=cfg.groups, state=cfg.state, max_episode_steps=cfg.max_episode_steps,
                      check_api=cfg.check_api, pad_spaces=cfg.pad_spaces)
        adapter.exact_resume = cfg.exact_resume
        return adapter

    def __init__(self, env, groups: dict[str, list[str]] | None = None, state: str = "auto",
                 max_episode_steps: int | None = None, check_api: bool = True, pad_spaces: bool = False):
        if not hasattr(env, "possible_agents") or not hasattr(env, "step"):
            raise ConfigError(f"env factory returned {type(env).__name__}, not a PettingZoo ParallelEnv or AECEnv "
                              "(it needs possible_agents, reset, step)")
        env = as_parallel(env)
        self.env = env
        self.max_episode_steps = max_episode_steps
        self.check_api = check_api
        agents = list(env.possible_agents)
        self._raw_obs_space = {a: env.observation_space(a) for a in agents}
        self._obs_space = {a: self._strip_mask_space(s) for a, s in self._raw_obs_space.items()}
        # a Discrete observation (rock paper scissors: the other's last move) is seen one-hot
        self._one_hot = {a: int(s.n) for a, s in self._obs_space.items() if isinstance(s, spaces.Discrete)}
        self._obs_space.update({a: spaces.Box(0.0, 1.0, (n,), np.float32) for a, n in self._one_hot.items()})
        act_space = {a: env.action_space(a) for a in agents}
        self._act_space = act_space
        # an env may declare its images' layout; else each shape's layout is guessed (is_channels_last)
        channels_last = getattr(env, "channels_last", None)
        if channels_last not in (None, True, False):
            raise ConfigError(f"env.factory: {type(env).__name__}.channels_last is {channels_last!r}; it declares "
                              "the layout of the env's image observations: True ([H, W, C]), False ([C, H, W]) or None")

        def same_spaces(members):
            return all(self._obs_space[m] == self._obs_space[members[0]] and act_space[m] == act_space[members[0]]
                       for m in members)

        members = assign_groups(agents, groups, (lambda _: True) if pad_spaces else same_spaces)
        self.groups, self._padded = {}, {}   # _padded: agent -> its flat observation's length
        for g, names in members.items():
            if same_spaces(names):
                self.groups[g] = GroupSpec(g, names, self._obs_space[names[0]], act_space[names[0]],
                                           channels_last=channels_last)
            elif pad_spaces:
                self.groups[g] = GroupSpec(g, names, *pad_group_spaces(g, names, self._obs_space, act_space))
                self._padded.update({a: int(np.prod(self._obs_space[a].shape)) for a in names})
            else:
                raise ConfigError(f"env.groups: agents of group {g!r} ({names}) have different spaces; "
                                  "split them with env.groups, one group per space, or set env.pad_spaces: true "
                                  "to pad them to one")
        self._slot = {a: (g, i) for g, gs in self.groups.items() for i, a in enumerate(gs.agents)}
        # an env in arrays (ArrayParallelEnv) is read one index per group, never agent by agent
        self._rows = self._array_rows(env, agents) if isinstance(env, ArrayParallelEnv) else None
        self._order = agents   # the rows of an env in arrays
        self._live = np.zeros(len(agents), bool)

        state_space = getattr(env, "state_space", None)
        self._env_state = state_space is not None and (state == "env" or (state == "auto"
                                                                          and len(state_space.shape) < 3))
        self._stacked_state = False
        if self._env_state:
            state_shape, state_dtype = tuple(env.state_space.shape), np.dtype(np.float32)
        else:
            slots = [gs.observation_space for gs in self.groups.values() for _ in gs.agents]
            mode = "concat" if state == "concat" else "auto"   # state: env without a state(): as auto
            state_shape, state_dtype, self._stacked_state = default_state(slots, mode, channels_last)
        fps = int(getattr(env, "metadata", {}).get("render_fps", 10) or 10)
        # the env's own limit (MPE's, butterfly's and sisl's max_cycles), or the one marlkit imposes
        own = getattr(getattr(env, "unwrapped", env), "max_cycles", None)
        limits = [n for n in (max_episode_steps, own) if isinstance(n, int)]
        self.spec = EnvSpec(self.groups, state_shape, render_fps=fps, state_dtype=state_dtype,
                            state_channels_last=False if self._stacked_state else None,
                            state_from_obs=not self._env_state, episode_limit=min(limits) if limits else None)
        self._t = 0
        self._checked_first_episode = False
        # agents whose image observations have all been one value so far in the first episode
        self._blank_images = {a for a, s in self._obs_space.items() if len(s.shape) == 3} if check_api else set()
        self._last_state = np.zeros(state_shape, np.float32)

    @staticmethod
    def _strip_mask_space(space):
        if isinstance(space, spaces.Dict) and "observation" in space.spaces:
            return space["observation"]
        return space

    def _array_rows(self, env, agents: list[str]) -> AgentRows:
        """The groups' rows in the env's ``[A, ...]`` arrays, once the env is seen to keep the
        array form's rules (``marlkit/envs/array_env.py``)."""
        obs_space, act_space = self._obs_space[agents[0]], self._act_space[agents[0]]
        unlike = [a for a in agents if self._obs_space[a] != obs_space or self._act_space[a] != act_space]
        name = type(env).__name__
        if unlike:
            raise ConfigError(f"env.factory: {name} is an ArrayParallelEnv, but agent(s) {unlike} have other spaces "
                              f"than {agents[0]!r}; in arrays every agent has the same observation and action space")
        if not isinstance(obs_space, spaces.Box) or self._raw_obs_space[agents[0]] != obs_space or self._padded:
            raise ConfigError(f"env.factory: {name} is an ArrayParallelEnv observing {self._raw_obs_space[agents[0]]}; "
                              "in arrays observations are a Box (action masks go in info['action_mask'])"
                              + (", and env.pad_spaces does not apply" if self._padded else ""))
        return AgentRows(agents, {g: gs.agents for g, gs in self.groups.items()})

    # ------------------------------------------------------------------ conversion

    def _observe(self, obs: dict, infos: dict) -> Observation:
        live = set(self.env.agents)
        out = empty_observation(self.spec)
        for agent in live:
            if agent not in obs:
                raise EnvAPIError(f"step {self._t}: the env returned no observation for agent {agent!r}, "
                                  "which is still in env.agents")
        for agent, value in obs.items():
            if agent not in self._slot:
                raise EnvAPIError(f"step {self._t}: the env returned an observation for {agent!r}, "
                                  f"which is not in possible_agents {list(self._slot)}")
            g, i = self._slot[agent]
            mask = None
            if isinstance(value, dict) and "observation" in value:
                mask = value.get("action_mask")
                value = value["observation"]
            elif isinstance(infos.get(agent), dict):
                mask = infos[agent].get("action_mask")
            value = np.asarray(value)
            if agent in self._one_hot:
                value = np.eye(self._one_hot[agent], dtype=np.float32)[int(value)]
            space = self._obs_space[agent]
            if value.shape != space.shape:
                raise EnvAPIError(f"step {self._t}: observation of agent {agent!r} has shape {value.shape}, "
                                  f"but its observation_space says {space.shape}")
            if agent in self._blank_images and value.min() != value.max():
                self._blank_images.discard(agent)
            if self.check_api and not self._checked_first_episode and not space.contains(value.astype(space.dtype)):
                raise EnvAPIError(f"step {self._t}: observation of agent {agent!r} lies outside its "
                                  f"observation_space {space} (set env.check_api: false to skip this check)")
            out.agent_mask[g][i] = agent in live
            n_actions = self.groups[g].n_actions
            if agent in self._padded:
                out.obs[g][i, :self._padded[agent]] = value.reshape(-1)
                n_actions = int(self._act_space[agent].n)
                out.action_mask[g][i, n_actions:] = False
            else:
                out.obs[g][i] = value
            if mask is not None and n_actions:
                mask = np.asarray(mask, dtype=bool)
                if mask.shape != (n_actions,):
                    raise EnvAPIError(f"step {self._t}: action_mask of agent {agent!r} has shape {mask.shape}, "
                                      f"expected ({n_actions},)")
                if agent in live and not mask.any():
                    raise EnvAPIError(f"step {self._t}: action_mask of agent {agent!r} allows no action")
                if mask.any():   # a waiting player of a turn-based game has no legal move: nothing to mask
                    out.action_mask[g][i, :n_actions] = mask
        self._fill_state(out)
        return out

    def _observe_arrays(self, obs: np.ndarray, info: dict) -> Observation:
        """:meth:`_observe` for an env in arrays: ``obs`` ``[A, *obs_shape]``, ``info['action_mask']``
        ``[A, n_actions]``; the same checks, on whole arrays."""
        rows, names = self._rows, self._order
        space = self._obs_space[names[0]]
        obs = np.asarray(obs)
        if obs.shape != (rows.n, *space.shape):
            raise EnvAPIError(f"step {self._t}: the env returned observations of shape {obs.shape}; its "
                              f"{rows.n} agents of observation_space {space} make {(rows.n, *space.shape)}")
        if self._blank_images:
            flat = obs.reshape(rows.n, -1)
            self._blank_images -= {names[i] for i in np.flatnonzero(flat.min(1) != flat.max(1))}
        if self.check_api and not self._checked_first_episode:
            value = obs.astype(space.dtype).reshape(rows.n, -1)
            inside = ((value >= space.low.reshape(-1)) & (value <= space.high.reshape(-1))).all(1)
            if not inside.all():
                raise EnvAPIError(f"step {self._t}: observation of agent {names[int(np.argmin(inside))]!r} lies "
                                  f"outside its observation_space {space} (set env.check_api: false to skip this check)")
        mask = info.get("action_mask")
        n_actions = self.groups[next(iter(self.groups))].n_actions
        if mask is not None:
            mask = np.asarray(mask, dtype=bool)
            if mask.shape != (rows.n, n_actions):
                raise EnvAPIError(f"step {self._t}: info['action_mask'] has shape {mask.shape}, "
                                  f"expected {(rows.n, n_actions)}")
            stuck = self._live & ~mask.any(1)
            if stuck.any():
                raise EnvAPIError(f"step {self._t}: action_mask of agent {names[int(np.argmax(stuck))]!r} allows no action")
            mask = mask | ~self._live[:, None]
        # each array built once from the env's (copies: an env may hand out buffers it refills)
        live = self._live
        out = Observation(
            obs={g: np.array(obs[r], dtype=space.dtype) for g, r in rows.rows.items()},
            state=np.empty(self.spec.state_shape, self.spec.state_dtype),   # _fill_state writes all of it
            agent_mask={g: np.array(live[r]) for g, r in rows.rows.items()},
            action_mask={g: np.array(mask[r]) if mask is not None else np.ones((len(live[r]), n_actions), bool)
                         for g, r in rows.rows.items()})
        self._fill_state(out)
        return out

    def _fill_state(self, out: Observation) -> None:
        if self._env_state:
            out.state[:] = self._env_state_now()
        elif self._stacked_state:   # each group's images written into their channels of the state, one copy
            at = 0
            for g, o in out.obs.items():
                images = _channels_first(o, self.groups[g].channels_last)
                channels = images.shape[0] * images.shape[1]
                out.state[at:at + channels].reshape(images.shape)[...] = images
                at += channels
        else:
            out.state[:] = np.concatenate([o.reshape(-1) for o in out.obs.values()]) if self.groups else 0

    def _env_state_now(self) -> np.ndarray:
        """``env.state()``, or where it raises or returns another shape (sisl multiwalker's state()
        fails on the step a walker falls), the last state it gave, with one warning per env name
        and process (every copy of a vector env fails alike)."""
        try:
            state = np.asarray(self.env.state(), np.float32)
            if state.shape == self.spec.state_shape:
                self._last_state = state
                return state
            problem = f"returned shape {state.shape}, not its state_space's {self.spec.state_shape}"
        except Exception as exc:
            problem = f"raised {type(exc).__name__}: {exc}"
        name = getattr(self.env, "metadata", {}).get("name", type(self.env).__name__)
        if name not in _STATE_FAILED:
            _STATE_FAILED.add(name)
            log.warning("%s: env.state() %s at step %d; such steps keep the last state it gave (set env.state: "
                        "concat to build the global state from the agents' observations instead)", name, problem, self._t)
        return self._last_state

    def _env_action(self, agent: str, action: np.ndarray):
        space = self._act_space[agent]
        if isinstance(space, spaces.Discrete):
            index = int(action)
            if not 0 <= index < space.n:
                raise bad_action(agent, index, space, self._t)
            return index + int(space.start)
        if isinstance(space, spaces.Box):
            return np.clip(action, space.low, space.high).astype(space.dtype)
        if isinstance(space, spaces.MultiDiscrete):
            index = np.asarray(action, dtype=np.int64)
            if not ((index >= 0) & (index < space.nvec)).all():
                raise bad_action(agent, index, space, self._t)
            return index + space.start
        return action

    # ------------------------------------------------------------------ contract

    def reset(self, seed: int | None = None) -> Observation:
        self._t = 0
        if self._rows is not None:
            obs, info = self.env.reset_arrays(seed=seed)
            self._live[:] = True
            return self._observe_arrays(obs, info or {})
        obs, infos = self.env.reset(seed=seed)
        return self._observe(obs, infos or {})

    def step(self, actions: dict[str, np.ndarray]):
        self._t += 1
        if self._rows is not None:
            return self._step_arrays(actions)
        acting = list(self.env.agents)
        joint = {a: self._env_action(a, actions[self._slot[a][0]][self._slot[a][1]]) for a in acting}
        obs, rewards, terminations, truncations, infos = self.env.step(joint)
        for name, table in (("reward", rewards), ("termination", terminations), ("truncation", truncations)):
            missing = [a for a in acting if a not in table]
            if missing:
                raise EnvAPIError(f"step {self._t}: the env returned no {name} for agent(s) {missing}, "
                                  "which acted this step")
        observation = self._observe(obs, infos or {})
        reward = {g: np.zeros(gs.n_agents, np.float32) for g, gs in self.groups.items()}
        terminated = {g: np.zeros(gs.n_agents, bool) for g, gs in self.groups.items()}
        truncated = {g: np.zeros(gs.n_agents, bool) for g, gs in self.groups.items()}
        # also for agents that did not act this step: a turn-based game pays and ends the waiting
        # player's game with the mover's move
        for array, table in ((reward, rewards), (terminated, terminations), (truncated, truncations)):
            for agent, value in table.items():
                if agent in self._slot:
                    g, i = self._slot[agent]
                    array[g][i] = value
        time_up = self.max_episode_steps is not None and self._t >= self.max_episode_steps
        episode_over = not self.env.agents or time_up
        if time_up:
            for agent in acting:
                g, i = self._slot[agent]
                truncated[g][i] |= not terminated[g][i]
        self._end_of_step(episode_over)
        return observation, reward, terminated, truncated, episode_over

    def _step_arrays(self, actions: dict[str, np.ndarray]):
        rows = self._rows
        first = self.groups[next(iter(self.groups))]
        joint = rows.join(actions, np.zeros((rows.n, *actions[first.name].shape[1:]), actions[first.name].dtype))
        acting = self._live.copy()
        joint = env_actions(joint, acting, self._act_space[self._order[0]], self._order, self._t)
        obs, reward, terminated, truncated, info = self.env.step_arrays(joint)
        reward = np.asarray(reward, np.float32)
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        for name, array in (("rewards", reward), ("terminations", terminated), ("truncations", truncated)):
            if array.shape != (rows.n,):
                raise EnvAPIError(f"step {self._t}: the env returned {name} of shape {array.shape}, not one per "
                                  f"agent ({rows.n},)")
        terminated, truncated = terminated & acting, truncated & acting   # an agent's episode ends once
        self._live &= ~(terminated | truncated)
        observation = self._observe_arrays(obs, info or {})
        time_up = self.max_episode_steps is not None and self._t >= self.max_episode_steps
        if time_up:
            truncated = truncated | (acting & ~terminated)
        episode_over = not self._live.any() or time_up
        self._end_of_step(episode_over)
        return observation, rows.split(reward), rows.split(terminated), rows.split(truncated), episode_over

    def _end_of_step(self, episode_over: bool) -> None:
        if episode_over and not self._checked_first_episode:
            self._checked_first_episode = True
            self._warn_of_blank_images()

    def _warn_of_blank_images(self) -> None:
        """Some PettingZoo envs draw their screen only for a render mode (butterfly's cooperative_pong
        observes a black screen without one): agents that see one value for a whole episode learn
        nothing, and nothing else would say so."""
        name = type(getattr(self.env, "unwrapped", self.env)).__name__
        if self._blank_images and name not in _WARNED_BLANK:
            _WARNED_BLANK.add(name)   # once per env class and process, not once per env of a vector env
            log.warning("marlkit: the image observations of agent(s) %s were one value for all %d steps of "
                        "the first episode: they see nothing. Some PettingZoo envs draw their screen only when "
                        "a render mode is set; set env.render_mode: rgb_array (or env.check_api: false to skip "
                        "this check)", sorted(self._blank_images), self._t)
        self._blank_images = set()

    def render(self):
        return self.env.render()

    def episode_stats(self) -> dict[str, float]:
        """The ParallelEnv's own ``episode_stats()``, where it has one."""
        stats = getattr(self.env, "episode_stats", None)
        return dict(stats()) if callable(stats) else {}

    def close(self) -> None:
        self.env.close()
