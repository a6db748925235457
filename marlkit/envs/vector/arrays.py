"""The arrays of one vector step ``[E, A_g, ...]``, in this process or in shared memory."""
from __future__ import annotations

from multiprocessing import shared_memory

import numpy as np

from marlkit.envs.core import EnvSpec, Observation, action_layout, empty_observation, group_arrays


class StepArrays:
    """The arrays of one vector step, optionally living in shared memory."""

    def __init__(self, spec: EnvSpec, num_envs: int, action_shapes: dict, buffers: dict | None = None):
        batch = (num_envs,)
        templates = {
            "next": empty_observation(spec, batch),
            "final": empty_observation(spec, batch),
        }
        layout = {}
        for which, ob in templates.items():
            for g in spec.groups:
                layout[f"{which}.obs.{g}"] = ob.obs[g]
                layout[f"{which}.agent_mask.{g}"] = ob.agent_mask[g]
                layout[f"{which}.action_mask.{g}"] = ob.action_mask[g]
            layout[f"{which}.state"] = ob.state
        for name, dtype in (("reward", np.float32), ("terminated", bool), ("truncated", bool), ("agent_end", bool)):
            for g, arr in group_arrays(spec, dtype, batch).items():
                layout[f"{name}.{g}"] = arr
        for g, (shape, dtype) in action_shapes.items():
            layout[f"action.{g}"] = np.zeros(batch + shape, dtype)
        layout["episode_end"] = np.zeros(batch, bool)
        layout["any_end"] = np.zeros(batch, bool)   # the env's episode or an agent's ended
        self.spec = spec
        self.meta = {k: (v.shape, v.dtype.str) for k, v in layout.items()}
        self.shm: list[shared_memory.SharedMemory] = []
        if buffers is None:
            self.a = layout
        else:
            self.a = {k: np.ndarray(self.meta[k][0], np.dtype(self.meta[k][1]), buffer=buffers[k].buf)
                      for k in layout}

    @classmethod
    def shared(cls, spec: EnvSpec, num_envs: int, action_shapes: dict) -> "StepArrays":
        plain = cls(spec, num_envs, action_shapes)
        blocks = {k: shared_memory.SharedMemory(create=True, size=max(1, v.nbytes)) for k, v in plain.a.items()}
        arrays = cls(spec, num_envs, action_shapes, blocks)
        arrays.shm = list(blocks.values())
        arrays.names = {k: b.name for k, b in blocks.items()}
        for k, v in plain.a.items():
            arrays.a[k][...] = v
        return arrays

    def write_obs(self, which: str, e: int, ob: Observation) -> None:
        a = self.a
        for g in self.spec.groups:
            a[f"{which}.obs.{g}"][e] = ob.obs[g]
            a[f"{which}.agent_mask.{g}"][e] = ob.agent_mask[g]
            a[f"{which}.action_mask.{g}"][e] = ob.action_mask[g]
        a[f"{which}.state"][e] = ob.state

    def write_step(self, e: int, final: Observation, reward, terminated, truncated, done: bool,
                   next_ob: Observation | None) -> None:
        a = self.a
        restart = final.final if not done else None   # agents that start a new episode, env going on
        self.write_obs("final", e, restart if restart is not None else final)
        self.write_obs("next", e, next_ob if next_ob is not None else final)
        for g in self.spec.groups:
            a[f"reward.{g}"][e] = reward[g]
            a[f"terminated.{g}"][e] = terminated[g]
            a[f"truncated.{g}"][e] = truncated[g]
            a[f"agent_end.{g}"][e] = (terminated[g] | truncated[g]) if restart is not None else False
        a["episode_end"][e] = done
        a["any_end"][e] = done or restart is not None

    def actions(self, e: int) -> dict[str, np.ndarray]:
        return {g: self.a[f"action.{g}"][e] for g in self.spec.groups}

    def observation(self, which: str, rows: slice = slice(None)) -> Observation:
        """Copies of the ``rows`` envs' observation ``which`` (all envs by default)."""
        a, gs = self.a, self.spec.groups
        return Observation({g: a[f"{which}.obs.{g}"][rows].copy() for g in gs}, a[f"{which}.state"][rows].copy(),
                           {g: a[f"{which}.agent_mask.{g}"][rows].copy() for g in gs},
                           {g: a[f"{which}.action_mask.{g}"][rows].copy() for g in gs})

    def group(self, name: str, rows: slice = slice(None)) -> dict[str, np.ndarray]:
        return {g: self.a[f"{name}.{g}"][rows].copy() for g in self.spec.groups}

    def release(self, unlink: bool) -> None:
        self.a = {}
        for block in self.shm:
            try:
                block.close()
            except BufferError:  # a view is still alive; unlinking below frees it at exit
                pass
            if unlink:
                try:
                    block.unlink()
                except FileNotFoundError:
                    pass
        self.shm = []


def action_shapes(spec: EnvSpec) -> dict:
    """Per group: (``[A_g, *action_shape]``, dtype) of the actions the runner passes in."""
    out = {}
    for g, gs in spec.groups.items():
        shape, dtype = action_layout(gs.action_space)
        out[g] = ((gs.n_agents,) + shape, dtype)
    return out
