"""A rollout: one collect of one group, ``[T, E, A, ...]``, the unit every storage is filled with."""
from __future__ import annotations

import copy

import numpy as np

from marlkit.spec import action_layout
from marlkit.storage.layout import Transition


class Rollout:
    """One collect of one group: every field is ``[T, E, A, ...]`` or ``[T, E, ...]``.

    ``state_shape=None`` is for agents that never read the global state: ``state`` is then an
    empty ``[T, E, 0]`` array and the states handed in are not kept. ``finals`` lists, for each
    step where an agent's episode was cut by a time limit, ``(t, e, final obs, final state, next
    hidden, final action mask)``: what its truncated episode bootstraps from.
    """

    def __init__(self, horizon: int, num_envs: int, n_agents: int, obs_shape: tuple, obs_dtype,
                 state_shape: tuple | None, action_shape: tuple, action_dtype, n_actions: int,
                 hidden_shape: tuple | None = None, state_dtype=np.float32):
        T, E, A = horizon, num_envs, n_agents
        self.horizon, self.num_envs, self.n_agents = T, E, A
        self.obs = np.zeros((T, E, A) + tuple(obs_shape), obs_dtype)
        self.stores_state = state_shape is not None
        self.state = np.zeros((T, E) + (tuple(state_shape) if self.stores_state else (0,)), state_dtype)
        self.agent_mask = np.zeros((T, E, A), bool)
        self.action_mask = np.ones((T, E, A, n_actions), bool)
        self.actions = np.zeros((T, E, A) + tuple(action_shape), action_dtype)
        self.log_prob = np.zeros((T, E, A), np.float32)
        self.value = np.zeros((T, E, A), np.float32)
        self.reward = np.zeros((T, E, A), np.float32)
        self.terminated = np.zeros((T, E, A), bool)
        self.truncated = np.zeros((T, E, A), bool)
        self.episode_end = np.zeros((T, E), bool)
        self.agent_end = np.zeros((T, E, A), bool)
        self.hidden = np.zeros((T, E, A) + tuple(hidden_shape), np.float32) if hidden_shape else None
        self.extras: dict[str, np.ndarray] = {}
        self.finals: list[tuple] = []
        self.has_values = False
        self.step = 0

    @classmethod
    def of(cls, layout, stores_state: bool, hidden_shape: tuple | None = None) -> "Rollout":
        """An empty rollout of a ``StorageLayout``: its group's spaces, ``layout.num_envs`` envs and
        ``layout.horizon`` steps, with the global state where ``stores_state``."""
        group = layout.group
        action_shape, action_dtype = action_layout(group.action_space)
        return cls(layout.horizon, layout.num_envs, group.n_agents, group.obs_shape,
                   group.observation_space.dtype or np.float32, layout.env.state_shape if stores_state else None,
                   action_shape, action_dtype, group.n_actions, hidden_shape, layout.env.state_dtype)

    def for_envs(self, num_envs: int) -> "Rollout":
        """An empty rollout of this one's layout for ``num_envs`` envs (an env worker's share of them,
        ``runner.act_in_workers``)."""
        twin = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, np.ndarray):
                setattr(twin, name, np.zeros((self.horizon, num_envs) + value.shape[2:], value.dtype))
        twin.action_mask = np.ones_like(twin.action_mask)
        twin.extras = {k: np.zeros((self.horizon, num_envs) + v.shape[2:], v.dtype) for k, v in self.extras.items()}
        twin.num_envs = num_envs
        twin.reset()
        return twin

    def fill_from(self, parts: list["Rollout"]) -> None:
        """Hold the full rollouts of ``parts``, those of consecutive blocks of this rollout's envs in
        env order (what the env workers collected), written into this rollout's arrays."""
        self._check_parts(parts, "partial rollouts")
        for name, value in vars(self).items():
            if isinstance(value, np.ndarray):
                np.concatenate([getattr(p, name) for p in parts], axis=1, out=value)
        self._adopt(parts)

    def columns(self, first: int, count: int) -> "Rollout":
        """An empty rollout of envs ``first .. first + count - 1`` of this one, its arrays views of
        this one's (one part of double-buffered collection): filling it fills this rollout's
        columns, and ``adopt_columns`` then takes over its finals and extras."""
        part = slice(first, first + count)
        twin = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, np.ndarray):
                setattr(twin, name, value[:, part])
        twin.extras = {k: v[:, part] for k, v in self.extras.items()}
        twin.num_envs = count
        twin.reset()
        return twin

    def adopt_columns(self, parts: list["Rollout"]) -> None:
        """Hold what ``parts``, full ``columns`` of consecutive blocks of this rollout's envs in env
        order, were filled with: their arrays are this rollout's already; their finals and the
        extras a part made on its first step (this rollout had none yet) come over here."""
        self._check_parts(parts, "columns")
        self._adopt(parts)

    def _check_parts(self, parts: list["Rollout"], what: str) -> None:
        if sum(p.num_envs for p in parts) != self.num_envs or not all(p.full for p in parts):
            raise ValueError(f"{len(parts)} {what} of {[p.num_envs for p in parts]} envs and "
                             f"{[p.step for p in parts]} steps do not make one of {self.num_envs} envs")

    def _adopt(self, parts: list["Rollout"]) -> None:
        """The finals, extras and flags of ``parts`` (consecutive blocks of envs) as this rollout's."""
        self.has_values = all(p.has_values for p in parts)
        self.step = self.horizon
        offsets = np.cumsum([0] + [p.num_envs for p in parts])
        for key, some in parts[0].extras.items():
            if key not in self.extras:
                self.extras[key] = np.zeros((self.horizon, self.num_envs) + some.shape[2:], some.dtype)
            for p, offset in zip(parts, offsets):
                self.extras[key][:, offset:offset + p.num_envs] = p.extras[key]
        self.finals = [(t, e + offset, *rest) for p, offset in zip(parts, offsets) for t, e, *rest in p.finals]
        self.finals.sort(key=lambda final: final[:2])   # in the order one buffer would have stored them

    @property
    def full(self) -> bool:
        return self.step >= self.horizon

    def add(self, tr: Transition) -> None:
        if self.full:
            raise RuntimeError(f"the rollout is full ({self.horizon} steps); start the next one before storing more")
        t = self.step
        self.obs[t] = tr.obs
        if self.stores_state:
            self.state[t] = tr.state
        self.agent_mask[t] = tr.agent_mask
        if self.action_mask.shape[-1]:
            self.action_mask[t] = tr.action_mask
        self.actions[t] = tr.actions
        self.log_prob[t] = tr.log_prob
        self.has_values = tr.value is not None
        if tr.value is not None:
            self.value[t] = tr.value
        self.reward[t] = tr.reward
        self.terminated[t] = tr.terminated
        self.truncated[t] = tr.truncated
        self.episode_end[t] = tr.episode_end
        self.agent_end[t] = tr.agent_end if tr.agent_end is not None else False
        if self.hidden is not None:
            self.hidden[t] = tr.hidden
        for key, value in tr.extras.items():
            if key not in self.extras:
                self.extras[key] = np.zeros((self.horizon,) + value.shape, value.dtype)
            self.extras[key][t] = value
        cut = tr.truncated & ~tr.terminated   # present or not: an absent agent may be cut too (per-agent episodes)
        for e in np.flatnonzero(cut.any(-1)):
            hidden = tr.next_hidden[e].copy() if tr.next_hidden is not None else None
            state = tr.final_state[e].copy() if self.stores_state else self.state[t, e]
            mask = (tr.final_action_mask[e].copy() if tr.final_action_mask is not None
                    else np.ones(self.action_mask.shape[2:], bool))
            self.finals.append((t, e, tr.final_obs[e].copy(), state, hidden, mask))
        self.step += 1

    def reset(self) -> None:
        self.step = 0
        self.finals = []
        self.has_values = False

    def ends(self) -> np.ndarray:
        """``[T, E, A]``: the agent's episode ended at step t, with its env's or on its own."""
        return self.episode_end[:, :, None] | self.agent_end

    def episode_start(self, first: np.ndarray) -> np.ndarray:
        """``[T, E, A]``: step t opens the agent's episode (its env was reset, or its own episode
        ended, after step t-1), where acting reset its memory; ``first`` ``[E, A]`` is the flag for
        t=0, carried over from the previous rollout."""
        return np.concatenate([first[None], self.ends()[:-1]], 0)
