"""Observation wrappers applied to any env when it is built, configured by generic ``env:`` keys.

``env.resize: [H, W]`` resizes image observations (and an image ``state`` of the same height and
width); without it, images with a side over ``env.max_image_side`` (64) are shrunk by
whole-number block averages until none is (280x480 -> 56x60); ``env.frame_stack: K`` stacks each
agent's last K observations along the channel axis, ``[C, H, W] -> [K * C, H, W]`` (``[H, W, C]
-> [H, W, K * C]``). Images may be in either layout: the group's declared one
(``GroupSpec.channels_last``), else the one its shape suggests. All work on the single-env contract
(:class:`~marlkit.envs.core.MultiAgentEnv`), so they serve every env type and every vector env.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from gymnasium import spaces

from marlkit.config import ConfigError, EnvConfig
from marlkit.envs.core import EnvSpec, GroupSpec, MultiAgentEnv, Observation
from marlkit.spec import is_channels_last


class EnvWrapper(MultiAgentEnv):
    """Forwards everything to ``env``; subclasses change the spec and the observations."""

    def __init__(self, env: MultiAgentEnv):
        self.env = env
        self.spec = env.spec

    @property
    def exact_resume(self) -> bool:
        """The wrapped env's: a wrapper's own state (a frame stack) pickles with it."""
        return self.env.exact_resume

    def observe(self, ob: Observation, first: bool) -> Observation:
        return ob

    def reset(self, seed: int | None = None) -> Observation:
        return self.observe(self.env.reset(seed=seed), first=True)

    def step(self, actions):
        ob, reward, terminated, truncated, done = self.env.step(actions)
        return self.observe(ob, first=False), reward, terminated, truncated, done

    def render(self):
        return self.env.render()

    def episode_stats(self) -> dict[str, float]:
        return self.env.episode_stats()

    def close(self) -> None:
        self.env.close()

    def __getattr__(self, name):
        if name == "env":  # not yet set (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)


def _image_box(space: spaces.Space, key: str) -> spaces.Box:
    if not isinstance(space, spaces.Box) or len(space.shape) != 3:
        raise ConfigError(f"{key} needs image observations [C, H, W] or [H, W, C]; this env's are {space}")
    return space


def _channels_last(gs: GroupSpec) -> bool:
    """The layout of a group's images: declared, else guessed from their shape."""
    return gs.channels_last if gs.channels_last is not None else is_channels_last(gs.obs_shape)


def _with_obs_spaces(spec: EnvSpec, make) -> EnvSpec:
    """``make(box, channels_last)``: each group's new observation space. The layout is then declared,
    as the new shape might suggest the other one (four ``(13, 13, 5)`` frames: ``(13, 13, 20)``)."""
    layouts = {g: _channels_last(gs) for g, gs in spec.groups.items()}
    return replace(spec, groups={g: replace(gs, observation_space=make(gs.observation_space, layouts[g]),
                                            channels_last=layouts[g])
                                 for g, gs in spec.groups.items()})


def resize_images(x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize ``[..., H, W]`` to ``[..., h, w]``: area averaging when both factors are whole
    numbers (e.g. 120x160 -> 60x80), nearest pixel otherwise. Keeps the dtype."""
    H, W = x.shape[-2:]
    h, w = size
    if (H, W) == (h, w):
        return x
    if H % h == 0 and W % w == 0:
        fh, fw = H // h, W // w
        if np.issubdtype(x.dtype, np.unsignedinteger):
            # the block mean rounded half up, in integers: faster than a float mean, and it runs on
            # every frame of every player of a Doom step
            n = fh * fw
            total = x.reshape(*x.shape[:-2], h, fh, W).sum(axis=-2, dtype=np.uint32 if x.itemsize == 1 else np.uint64)
            total = total.reshape(*x.shape[:-2], h, w, fw).sum(axis=-1)
            return ((2 * total + n) // (2 * n)).astype(x.dtype)
        mean = x.reshape(*x.shape[:-2], h, fh, w, fw).mean(axis=(-3, -1), dtype=np.float32)
        return (mean + 0.5).astype(x.dtype) if np.issubdtype(x.dtype, np.integer) else mean.astype(x.dtype)
    rows = (np.arange(h) * H // h)
    cols = (np.arange(w) * W // w)
    return x[..., rows[:, None], cols]


def resize_in_layout(x: np.ndarray, size: tuple[int, int], channels_last: bool) -> np.ndarray:
    """:func:`resize_images` of ``[..., H, W]`` or, channels last, of ``[..., H, W, C]``."""
    if not channels_last:
        return resize_images(x, size)
    return np.moveaxis(resize_images(np.moveaxis(x, -1, -3), size), -3, -1)


class ResizeObservation(EnvWrapper):
    def __init__(self, env: MultiAgentEnv, size: tuple[int, int]):
        super().__init__(env)
        self.size = (int(size[0]), int(size[1]))
        if min(self.size) < 1:
            raise ConfigError(f"env.resize: {list(size)} must be two positive numbers [H, W]")

        def resized(space, channels_last):
            box = _image_box(space, "env.resize")
            shape = (*self.size, box.shape[2]) if channels_last else (box.shape[0], *self.size)
            return spaces.Box(box.low.min(), box.high.max(), shape, box.dtype)

        self.channels_last = {g: _channels_last(gs) for g, gs in env.spec.groups.items()}
        self.spec = _with_obs_spaces(env.spec, resized)
        first = next(iter(env.spec.groups.values()))
        side = first.obs_shape[:2] if self.channels_last[first.name] else first.obs_shape[1:]
        state = env.spec.state_shape   # an image state as the default one stacks views: channels first
        self.resize_state = len(state) == 3 and state[1:] == side
        if self.resize_state:
            self.spec.state_shape = (state[0], *self.size)

    def observe(self, ob: Observation, first: bool) -> Observation:
        obs = {g: resize_in_layout(o, self.size, self.channels_last[g]) for g, o in ob.obs.items()}
        state = resize_images(ob.state, self.size) if self.resize_state else ob.state
        final = getattr(ob, "final", None)
        return replace(ob, obs=obs, state=state, **({"final": self.observe(final, first)} if final is not None else {}))


def block_factors(height: int, width: int, side: int) -> tuple[int, int]:
    """Whole-number block sizes that bring an image to at most ``side`` a side (1: as is)."""
    return -(-height // side), -(-width // side)


class ShrinkImages(EnvWrapper):
    """Image observations ``[C, H, W]`` or ``[H, W, C]`` with a side over ``side`` pixels, shrunk by
    averaging whole blocks (the rows and columns left over are dropped), per group: a frame of
    280x480 pixels costs an ``mlp``'s first layer 100x what one of 56x60 does, and a ``cnn`` does
    not need it. The state is left as it is (the default one is already shrunk)."""

    def __init__(self, env: MultiAgentEnv, side: int):
        super().__init__(env)
        self.plan: dict[str, tuple[bool, tuple[int, int], tuple[int, int]]] = {}   # layout, crop, size
        groups = {}
        for g, gs in env.spec.groups.items():
            shape = gs.obs_shape
            if len(shape) == 3:
                last = _channels_last(gs)
                H, W = shape[:2] if last else shape[1:]
                fh, fw = block_factors(H, W, side)
                if (fh, fw) != (1, 1):
                    size = (H // fh, W // fw)
                    self.plan[g] = (last, (size[0] * fh, size[1] * fw), size)
                    box = gs.observation_space
                    new = (*size, shape[2]) if last else (shape[0], *size)
                    gs = replace(gs, observation_space=spaces.Box(box.low.min(), box.high.max(), new, box.dtype),
                                 channels_last=last)
            groups[g] = gs
        self.spec = replace(env.spec, groups=groups)

    def _shrink(self, g: str, o: np.ndarray) -> np.ndarray:
        last, (h, w), size = self.plan[g]
        return resize_in_layout(o[..., :h, :w, :] if last else o[..., :h, :w], size, last)

    def observe(self, ob: Observation, first: bool) -> Observation:
        obs = {g: self._shrink(g, o) if g in self.plan else o for g, o in ob.obs.items()}
        final = getattr(ob, "final", None)
        return replace(ob, obs=obs, **({"final": self.observe(final, first)} if final is not None else {}))


class FrameStack(EnvWrapper):
    """Each agent sees its last ``k`` observations, oldest first; the first observation of an
    episode fills the whole stack."""

    def __init__(self, env: MultiAgentEnv, k: int):
        super().__init__(env)
        self.k = k

        def stacked(space, channels_last):
            box = _image_box(space, "env.frame_stack")
            shape = (*box.shape[:2], box.shape[2] * k) if channels_last else (box.shape[0] * k, *box.shape[1:])
            return spaces.Box(box.low.min(), box.high.max(), shape, box.dtype)

        self.spec = _with_obs_spaces(env.spec, stacked)
        # the channel axis of a group's [A, C, H, W] or [A, H, W, C] observations
        self.axis = {g: 3 if _channels_last(gs) else 1 for g, gs in env.spec.groups.items()}
        self.frames: dict[str, np.ndarray] = {}

    def observe(self, ob: Observation, first: bool) -> Observation:
        out = {}
        for g, o in ob.obs.items():
            axis = self.axis[g]
            c = o.shape[axis]
            if first or g not in self.frames:
                self.frames[g] = np.concatenate([o] * self.k, axis=axis)
            else:
                stack = np.moveaxis(self.frames[g], axis, 1)   # a view: writes land in the stack
                stack[:, :-c] = stack[:, c:]
                stack[:, -c:] = np.moveaxis(o, axis, 1)
            out[g] = self.frames[g].copy()
        if getattr(ob, "final", None) is not None:
            raise ConfigError("env.frame_stack: this env restarts single agents within an episode, "
                              "which frame stacking does not support yet; set env.frame_stack: 1")
        return replace(ob, obs=out)


def wrap(env: MultiAgentEnv, cfg: EnvConfig) -> MultiAgentEnv:
    """The wrappers an env config asks for, in a fixed order: resize (or shrink), then frame stack."""
    if cfg.resize is not None:
        if len(cfg.resize) != 2:
            raise ConfigError(f"env.resize: {cfg.resize} must be [H, W], e.g. [60, 80]")
        env = ResizeObservation(env, tuple(cfg.resize))
    elif cfg.max_image_side is not None:
        shrink = ShrinkImages(env, cfg.max_image_side)
        if shrink.plan:
            env = shrink
    if cfg.frame_stack > 1:
        env = FrameStack(env, cfg.frame_stack)
    return env


class FlattenMultiDiscrete(EnvWrapper):
    """MultiDiscrete actions as one Discrete over every joint choice (SoccerTwos: ``[3, 3, 3]`` ->
    ``Discrete(27)``), for each group that has them. Joint action ``k`` is the mixed-radix number of
    the branch choices (first branch most significant). It is allowed exactly when every one of its
    branch choices is, so ``action_mask`` ``[A, sum(nvec)]`` becomes ``[A, prod(nvec)]`` with no
    information lost (branch masks are independent by construction)."""

    def __init__(self, env: MultiAgentEnv):
        super().__init__(env)
        self.table, self.columns = {}, {}
        groups = {}
        for g, gs in env.spec.groups.items():
            if isinstance(gs.action_space, spaces.MultiDiscrete):
                nvec = np.asarray(gs.action_space.nvec).reshape(-1)
                self.table[g] = np.stack(np.unravel_index(np.arange(int(np.prod(nvec))), nvec), -1)   # [K, B]
                self.columns[g] = self.table[g] + np.concatenate([[0], np.cumsum(nvec)[:-1]])        # into the mask
                gs = replace(gs, action_space=spaces.Discrete(len(self.table[g])))
            groups[g] = gs
        self.spec = replace(env.spec, groups=groups)

    def _masks(self, masks: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {g: m[..., self.columns[g]].all(-1) if g in self.columns else m for g, m in masks.items()}

    def observe(self, ob: Observation, first: bool) -> Observation:
        final = replace(ob.final, action_mask=self._masks(ob.final.action_mask)) if ob.final is not None else None
        return replace(ob, action_mask=self._masks(ob.action_mask), final=final)

    def step(self, actions):
        return super().step({g: self.table[g][np.asarray(a)] if g in self.table else a for g, a in actions.items()})
