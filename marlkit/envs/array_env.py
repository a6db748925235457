"""A PettingZoo-style ``ParallelEnv`` that holds its agents' data as arrays, and says so.

Some envs keep every agent's observation, reward and end in one array (mettagrid's C++ game, most
gridworlds): turning those into per-agent dicts each step and back into ``[A_g, ...]`` arrays in
the adapter costs a Python loop over agents both ways. An env that subclasses
:class:`ArrayParallelEnv` declares that it speaks in ``[A, ...]`` arrays over ``possible_agents``,
in that fixed order, and writes ``reset_arrays`` and ``step_arrays``; marlkit's ``pettingzoo``
adapter then reads the arrays, one fancy index per group, and never builds a dict. The dict API of
PettingZoo (``reset``/``step``/``agents``) comes with the class, built from the arrays, so the same
env still works wherever a ParallelEnv is expected.

Rules of the array form, which the adapter relies on:
- every agent has the same observation space and the same action space;
- all of ``possible_agents`` are present after ``reset``; an agent leaves for the rest of the
  episode when it terminates or is truncated, and its later entries are ignored;
- ``info`` may hold ``"action_mask"``: ``[A, n_actions]`` bool, True = allowed; it counts for the
  agents still playing (an absent agent's mask is all True, as marlkit's contract has it).
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces


class ArrayParallelEnv:
    """Subclass it and write :meth:`reset_arrays`, :meth:`step_arrays`, ``possible_agents``,
    ``observation_space(agent)`` and ``action_space(agent)``."""

    possible_agents: list[str]
    agents: list[str] = []

    def reset_arrays(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        """-> (obs ``[A, *obs_shape]``, info)."""
        raise NotImplementedError

    def step_arrays(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """``actions``: ``[A, *action_shape]`` in the action space's own values (entries of agents
        that left are ignored) -> (obs ``[A, ...]``, reward ``[A]``, terminated ``[A]`` bool,
        truncated ``[A]`` bool, info)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- PettingZoo's dict API

    def reset(self, seed: int | None = None, options=None):
        obs, info = self.reset_arrays(seed)
        self.agents = list(self.possible_agents)
        return dict(zip(self.possible_agents, obs)), self._agent_infos(info, self.agents)

    def step(self, actions: dict):
        live, order = self.agents, self.possible_agents
        shape = self.action_space(order[0]).shape
        joint = np.stack([np.asarray(actions.get(a, np.zeros(shape)), dtype=self.action_space(a).dtype)
                          for a in order])
        obs, reward, terminated, truncated, info = self.step_arrays(joint)
        self.agents = [a for a, te, tr in zip(order, terminated, truncated) if a in live and not (te or tr)]
        per_agent = lambda values: dict(zip(order, np.asarray(values).tolist()))   # noqa: E731
        return (dict(zip(order, obs)), per_agent(reward), per_agent(terminated), per_agent(truncated),
                self._agent_infos(info, live))

    def _agent_infos(self, info: dict, agents: list[str]) -> dict:
        """Per agent of ``agents`` its info, with its action mask while it still plays."""
        mask = info.get("action_mask")
        index = {a: i for i, a in enumerate(self.possible_agents)}
        return {a: ({"action_mask": mask[index[a]]} if mask is not None and a in self.agents else {})
                for a in agents}


class DictsOnly:
    """An env in arrays seen through PettingZoo's per-agent dicts alone, as any ParallelEnv is read
    (agent by agent): to tell the array path from the dict path, or to read an env's refusals in
    the per-agent checks' words."""

    def __init__(self, env: ArrayParallelEnv):
        self.env = env
        self.possible_agents = env.possible_agents
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self.metadata = getattr(env, "metadata", {})
        self.channels_last = getattr(env, "channels_last", None)   # the images' layout, as declared

    @property
    def agents(self) -> list[str]:
        return self.env.agents

    def reset(self, seed: int | None = None, options=None):
        return self.env.reset(seed=seed)

    def step(self, actions: dict):
        return self.env.step(actions)

    def render(self):
        return None

    def close(self) -> None:
        self.env.close()


class AgentRows:
    """Where each group's agents lie in an ``[A, ...]`` array over a fixed agent order: a slice
    where they are consecutive and in order (views, no copy), else an index array."""

    def __init__(self, order: list[str], groups: dict[str, list[str]]):
        at = {a: i for i, a in enumerate(order)}
        self.n = len(order)
        self.rows: dict[str, slice | np.ndarray] = {}
        for g, agents in groups.items():
            index = np.array([at[a] for a in agents])
            consecutive = len(index) == 1 or bool((np.diff(index) == 1).all())
            self.rows[g] = slice(int(index[0]), int(index[-1]) + 1) if consecutive else index

    def split(self, array: np.ndarray) -> dict[str, np.ndarray]:
        """``[A, ...]`` -> per group ``[A_g, ...]``."""
        return {g: array[r] for g, r in self.rows.items()}

    def join(self, per_group: dict[str, np.ndarray], out: np.ndarray) -> np.ndarray:
        """Per group ``[A_g, ...]`` -> ``out`` ``[A, ...]``."""
        for g, r in self.rows.items():
            out[r] = per_group[g]
        return out


def env_actions(joint: np.ndarray, acting: np.ndarray, space: spaces.Space, names: list[str], t: int) -> np.ndarray:
    """Actions ``[A, ...]`` as marlkit's agents give them (indices from 0) -> the env's own values,
    for agents that all act in ``space``: Box actions clipped into it, indices shifted by its
    ``start``; an index outside the space, of an ``acting`` agent, is refused naming the agent."""
    if isinstance(space, spaces.Box):
        return np.clip(joint, space.low, space.high).astype(space.dtype)
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
        index = joint.astype(np.int64)
        high = space.n if isinstance(space, spaces.Discrete) else space.nvec
        outside = (index < 0) | (index >= high)
        if outside.any():   # an absent agent's entry is ignored, whatever it holds
            bad = acting & outside.reshape(len(index), -1).any(1)
            if bad.any():
                i = int(np.argmax(bad))
                raise bad_action(names[i], index[i], space, t)
        return index + space.start
    return joint


def bad_action(agent: str, index, space: spaces.Space, t: int) -> ValueError:
    return ValueError(f"step {t}: agent {agent!r} was given action index {index}, outside its action "
                      f"space {space} (indices count from 0); check the acting agent's output")
