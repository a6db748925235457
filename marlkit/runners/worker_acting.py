"""Collection with the acting done in the env workers (``runner.act_in_workers``).

Each env worker process runs an :class:`ActingJob` on its own block of envs: acting copies of the
agents (``Agent.acting_copy``) act on those envs and store their transitions for a whole rollout,
which comes back in one message, instead of one round trip of actions and observations per step.
This process then only merges the blocks and updates; with ``runner.overlap`` the workers collect
the next rollout while it does.

The result is the one acting here gives: every env draws from its own random stream
(``marlkit/networks/noise.py``) wherever it is acted on, the rollout blocks are joined in env
order, and finished episodes are counted in the order (step, env) they would have ended in here.
Log-probs and values agree to float rounding (torch rounds a worker's smaller batch otherwise than
the whole one), and bit for bit with ``runner.act_batch``, whose blocks are the same here and there.
"""
from __future__ import annotations

import numpy as np
import torch

from marlkit.agents.base import Agent
from marlkit.envs.core import Observation
from marlkit.runners.collector import Collector, count_episodes


class ActingJob:
    """Runs in an env worker: ``actors`` (acting copies, one per group, for this worker's envs
    ``first_env ..``) collect one rollout of ``horizon`` steps per ``run``."""

    def __init__(self, actors: dict[str, Agent], learners: list[str], horizon: int, first_env: int,
                 act_batch: int | None):
        self.actors, self.learners, self.horizon, self.first_env = actors, learners, horizon, first_env
        self.act_batch = act_batch   # the worker's first env begins a block: its blocks are the runner's
        self.threads = torch.get_num_threads()   # runner.torch_threads, as the runner's process has it

    def install(self, venv) -> None:
        # a spawned worker's torch would start with a thread per core, and the workers and the
        # learner would fight over the cores (acting took 4x as long)
        torch.set_num_threads(self.threads)
        self.collector = Collector(venv, self.actors, self.learners, self.horizon, overlap=False,
                                   act_batch=self.act_batch)

    def run(self, arg: tuple) -> dict:
        """``arg``: (this block's observation and hidden state to start from, new acting states of
        the groups that changed) -> the block's rollouts, where its streams stand, its finished
        episodes ``(t, env, episode)`` and where the rollout ended."""
        obs, hidden, updates = arg
        for g, update in updates.items():
            self.actors[g].load_acting_state(_unpacked(update))
        for g in self.learners:
            self.actors[g].buffer.reset()
        state = {"obs": obs, "hidden": hidden, "recent": [], "recent_stats": [], "episodes": 0}
        finished = self.collector.collect(state)
        return {"rollouts": {g: self.actors[g].buffer for g in self.learners},
                "streams": {g: actor.streams for g, actor in self.actors.items()},
                "episodes": [(t, self.first_env + e, episode) for t, e, episode in finished],
                "obs": state["obs"], "hidden": state["hidden"]}


class WorkerCollector(Collector):
    """The collector of this process when the env workers act: ``collect`` has every worker
    collect its block of the rollout and joins the blocks into the behaviours' storage, so that
    handing over, syncing and checkpoints work as with acting here."""

    def __init__(self, venv, agents: dict[str, Agent], learners: list[str], horizon: int, overlap: bool,
                 act_batch: int | None = None):
        super().__init__(venv, agents, learners, horizon, overlap, act_batch)
        self.installed = False
        self.changed: set[str] = set()   # learning groups whose weights the workers have not got yet

    def _install(self) -> None:
        """Acting copies to the workers, made now: after a resume has restored the behaviours."""
        self.venv.install_jobs([
            ActingJob({g: b.acting_copy(first, count) for g, b in self.behaviours.items()}, self.learners,
                      self.horizon, first, self.act_batch)
            for first, count in self.venv.blocks])
        self.installed = True
        self.changed.clear()

    def collect(self, state: dict) -> list[tuple[int, int, dict]]:
        if not self.installed:
            self._install()
        obs, hidden = state["obs"], state["hidden"]
        updates = {g: _packed(self.behaviours[g].acting_state()) for g in self.changed}
        self.changed.clear()
        args = [(obs.rows(first, count), {g: h[first:first + count] if h is not None else None
                                          for g, h in hidden.items()}, updates)
                for first, count in self.venv.blocks]
        replies = self.venv.run_jobs(args, "collecting a rollout")
        for g in self.learners:
            self.behaviours[g].buffer.fill_from([r["rollouts"][g] for r in replies])
        for g, behaviour in self.behaviours.items():
            for reply in replies:
                behaviour.streams.absorb(reply["streams"][g])
        state["obs"] = Observation.join([r["obs"] for r in replies])
        state["hidden"] = {g: _join([r["hidden"][g] for r in replies]) for g in hidden}
        finished = sorted((e for r in replies for e in r["episodes"]), key=lambda ended: ended[:2])
        count_episodes(state, (episode for _, _, episode in finished))
        return finished

    def sync(self) -> None:
        super().sync()
        self.changed.update(self.learners)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.installed = False   # the behaviours' streams may have moved: the workers get them anew


def _join(blocks: list[np.ndarray | None]) -> np.ndarray | None:
    return None if blocks[0] is None else np.concatenate(blocks)


class _TensorData:
    """A tensor's values as a numpy array: a small tensor pickles through torch's own serialiser
    (an acting state of 27 tensors: 3.4 ms to pickle and 4.7 ms to unpickle, against 0.1 and 0.15
    ms as arrays), once per worker and update."""

    def __init__(self, tensor: torch.Tensor):
        self.array = tensor.detach().cpu().numpy()


def _packed(tree):
    """``tree`` (an acting state: tensors in dicts and lists) with its tensors as ``_TensorData``."""
    if isinstance(tree, torch.Tensor):
        return _TensorData(tree)
    if isinstance(tree, dict):
        return type(tree)((k, _packed(v)) for k, v in tree.items())
    if isinstance(tree, (list, tuple)):
        return type(tree)(_packed(v) for v in tree)
    return tree


def _unpacked(tree):
    if isinstance(tree, _TensorData):
        return torch.from_numpy(tree.array)
    if isinstance(tree, dict):
        return type(tree)((k, _unpacked(v)) for k, v in tree.items())
    if isinstance(tree, (list, tuple)):
        return type(tree)(_unpacked(v) for v in tree)
    return tree
