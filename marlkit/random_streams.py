"""The random streams acting draws from, one per env, and the noise sources distributions sample with.

Acting draws from :class:`EnvStreams`: one stream per env, so that what the agents of env ``e`` draw
depends on the seed, on ``e`` and on how much env ``e`` drew before, and not on which envs are
batched together. A run therefore draws alike whether its envs are acted on in this process, in
env worker processes or in Ray actors, and after a resume with another number of workers. A
stream is a counter: value ``k`` of env ``e`` is SplitMix64's output function applied to
``key(seed, e) + k * gamma``, so a whole batch is drawn by a few vectorised integer operations
(no generator object per env), and a stream's state is one integer.

Distributions take a noise source with ``uniform(shape)`` and ``normal(shape)``, returning float32
tensors: :class:`StreamNoise` over env streams, :class:`GeneratorNoise` over a torch generator
(for draws that belong to no env, such as a learner's).
"""
from __future__ import annotations

import math

import numpy as np
import torch

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_SEED_MIX = np.uint64(0xD1B54A32D192ED03)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 arrays (arithmetic wraps modulo 2**64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class EnvStreams:
    """Streams of the envs ``first_env, first_env + 1, ...``: row ``i`` of a batch is env
    ``first_env + i``. ``counters[i]`` counts the values env ``first_env + i`` has drawn."""

    def __init__(self, seed: int, first_env: int = 0):
        self.seed, self.first_env = int(seed), int(first_env)
        self.counters = np.zeros(0, np.uint64)
        self._keys = np.zeros(0, np.uint64)
        self._offsets: dict[int, np.ndarray] = {}

    def _bits(self, num_envs: int, per_env: int) -> np.ndarray:
        """``[num_envs, per_env]`` uint64 values, the next ``per_env`` of each env's stream."""
        # array arithmetic wraps modulo 2**64 silently (numpy warns of overflow for scalars only)
        if len(self._keys) < num_envs:
            envs = np.arange(self.first_env, self.first_env + num_envs, dtype=np.uint64)
            self._keys = _mix(np.full(num_envs, self.seed * int(_SEED_MIX) % 2 ** 64, np.uint64) + envs * _GAMMA)
        if len(self.counters) < num_envs:
            self.counters = np.concatenate([self.counters, np.zeros(num_envs - len(self.counters), np.uint64)])
        offsets = self._offsets.get(per_env)
        if offsets is None:
            offsets = self._offsets[per_env] = np.arange(1, per_env + 1, dtype=np.uint64) * _GAMMA
        start = self._keys[:num_envs] + self.counters[:num_envs] * _GAMMA
        bits = _mix(start[:, None] + offsets)
        self.counters[:num_envs] += np.uint64(per_env)
        return bits

    def _per_env(self, shape: tuple[int, ...], env_dim: int, per_value: int, make) -> np.ndarray:
        shape = tuple(shape)
        num_envs = shape[env_dim]
        rest = shape[:env_dim] + shape[env_dim + 1:]
        values = make(self._bits(num_envs, per_value * math.prod(rest))).reshape((num_envs,) + rest)
        return np.moveaxis(values, 0, env_dim) if env_dim else values

    def uniform(self, shape: tuple[int, ...], env_dim: int = 0) -> np.ndarray:
        """float32 values in (0, 1), never 0 or 1; ``shape[env_dim]`` is the number of envs."""
        return self._per_env(shape, env_dim, 1, _unit)

    def normal(self, shape: tuple[int, ...], env_dim: int = 0) -> np.ndarray:
        """Standard normal float32 values (Box-Muller, two values of the stream each)."""
        def make(bits):
            u = _unit(bits).astype(np.float64).reshape(len(bits), -1, 2)
            return (np.sqrt(-2.0 * np.log(u[..., 0])) * np.cos(2.0 * np.pi * u[..., 1])).astype(np.float32)
        return self._per_env(shape, env_dim, 2, make)

    def state_dict(self) -> dict:
        return {"seed": self.seed, "first_env": self.first_env, "counters": self.counters.copy()}

    def load_state_dict(self, state: dict) -> None:
        self.__init__(state["seed"], state["first_env"])
        self.counters = np.asarray(state["counters"], np.uint64).copy()

    def block(self, first: int, count: int) -> "EnvStreams":
        """The streams of rows ``first .. first + count - 1`` as streams of their own (a worker acting
        for those envs), where they stand now."""
        part = EnvStreams(self.seed, self.first_env + first)
        counters = np.zeros(count, np.uint64)
        have = self.counters[first:first + count]
        counters[:len(have)] = have
        part.counters = counters
        return part

    def absorb(self, part: "EnvStreams") -> None:
        """Take back where the streams of ``part`` (made by ``block``) stand."""
        first, count = part.first_env - self.first_env, len(part.counters)
        if len(self.counters) < first + count:
            self.counters = np.concatenate([self.counters, np.zeros(first + count - len(self.counters), np.uint64)])
        self.counters[first:first + count] = part.counters


def _unit(bits: np.ndarray) -> np.ndarray:
    # the top 23 bits, centred in their interval: (0.5 .. 2**23 - 0.5) / 2**23, exact in float32
    return ((bits >> np.uint64(41)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0 ** -23)


class StreamNoise:
    """Noise for a batch whose dimension ``env_dim`` runs over the envs of ``streams``."""

    def __init__(self, streams: EnvStreams, env_dim: int, device: torch.device | str = "cpu"):
        self.streams, self.env_dim, self.device = streams, env_dim, device

    def along(self, env_dim: int) -> "StreamNoise":
        """The same streams for tensors whose env dimension is ``env_dim``."""
        return StreamNoise(self.streams, env_dim, self.device)

    def uniform(self, shape) -> torch.Tensor:
        return torch.from_numpy(self.streams.uniform(tuple(shape), self.env_dim)).to(self.device)

    def normal(self, shape) -> torch.Tensor:
        return torch.from_numpy(self.streams.normal(tuple(shape), self.env_dim)).to(self.device)


class GeneratorNoise:
    """Noise from a torch generator, for draws that belong to no env."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def along(self, env_dim: int) -> "GeneratorNoise":
        return self

    def uniform(self, shape) -> torch.Tensor:
        u = torch.rand(tuple(shape), generator=self.generator, device=self.generator.device)
        # torch.rand may give 0 exactly; sampling needs (0, 1)
        return u.clamp_(min=torch.finfo(torch.float32).tiny)

    def normal(self, shape) -> torch.Tensor:
        return torch.randn(tuple(shape), generator=self.generator, device=self.generator.device)
