"""Collection with the acting done in the env workers (``runner.act_in_workers``).

Each env worker process runs an :class:`ActingJob` on its own block of envs: snapshots of the
agents (``Agent.snapshot``) act on those envs and store their transitions for a whole rollout,
which comes back in one message, instead of one round trip of actions and observations per step.
This process then only merges the blocks and updates; with ``runner.overlap`` the workers collect
the next rollout while it does.

The result is the one acting here gives: every env draws from its own random stream
(``marlkit/random_streams.py``) wherever it is acted on, the rollout blocks are joined in env
order, and finished episodes are counted in the order (step, env) they would have ended in here.
Log-probs and values agree to float rounding (torch rounds a worker's smaller batch otherwise than
the whole one), and bit for bit with ``runner.act_batch``, whose blocks are the same here and there.
"""
from __future__ import annotations

import numpy as np
import torch

from marlkit.agents.base import Agent, Progress
from marlkit.envs.core import Observation
from marlkit.runners.collector import Collector, bootstrap_of, fill_rollouts
from marlkit.storage import Collected, Rollout


class ActingJob:
    """Runs in an env worker: ``policies`` (snapshots, one per group, for this worker's envs
    ``first_env ..``) collect one rollout of ``horizon`` steps per ``run`` into ``rollouts`` (the
    learning groups', empty ones of this block's size)."""

    def __init__(self, policies: dict[str, Agent], rollouts: dict[str, Rollout], horizon: int, first_env: int,
                 act_batch: int | None):
        self.policies, self.rollouts, self.horizon, self.first_env = policies, rollouts, horizon, first_env
        self.act_batch = act_batch   # the worker's first env begins a block: its blocks are the runner's
        self.threads = torch.get_num_threads()   # runner.torch_threads, as the runner's process has it

    def install(self, venv) -> None:
        # a spawned worker's torch would start with a thread per core, and the workers and the
        # learner would fight over the cores
        torch.set_num_threads(self.threads)
        self.venv = venv

    def run(self, arg: tuple) -> dict:
        """``arg``: (this block's observation and hidden state to start from, new policy states of
        the groups that changed, the run's progress) -> the block's rollouts, where its streams
        stand, its finished episodes ``(t, env, episode)`` and where the rollout ended."""
        obs, hidden, updates, progress = arg
        for g, update in updates.items():
            self.policies[g].load_policy_state_dict(_unpacked(update))
        for rollout in self.rollouts.values():
            rollout.reset()
        obs, hidden, finished = fill_rollouts(self.venv, self.policies, self.rollouts, obs, hidden, self.horizon,
                                              self.act_batch, progress)
        return {"rollouts": self.rollouts, "streams": {g: policy.streams for g, policy in self.policies.items()},
                "episodes": [(t, self.first_env + e, episode) for t, e, episode in finished],
                "obs": obs, "hidden": hidden}


class WorkerCollector(Collector):
    """The collector of this process when the env workers act: ``collect`` has every worker
    collect its block of the rollout and joins the blocks into this process's storage, so that
    batches, syncing and checkpoints work as with acting here."""

    def __init__(self, venv, agents: dict[str, Agent], learning_groups: list[str], horizon: int, overlap: bool,
                 act_batch: int | None = None):
        super().__init__(venv, agents, learning_groups, horizon, overlap, act_batch)
        self.installed = False
        self.changed: set[str] = set()   # learning groups whose weights the workers have not got yet

    def _install(self) -> None:
        """Snapshots to the workers, made now: after a resume has restored the policies' streams."""
        self.venv.install_jobs([
            ActingJob({g: p.snapshot(first, count, device="cpu") for g, p in self.policies.items()},
                      {g: self.storages[g].new_rollout(count) for g in self.learning_groups}, self.horizon, first,
                      self.act_batch)
            for first, count in self.venv.blocks])
        self.installed = True
        self.changed.clear()

    def collect(self, state, progress: Progress | None = None) -> dict[str, Collected]:
        if not self.installed:
            self._install()
        obs, hidden = state.obs, state.hidden
        updates = {g: _packed(self.policies[g].policy_state_dict()) for g in self.changed}
        self.changed.clear()
        args = [(obs.rows(first, count), {g: h[first:first + count] if h is not None else None
                                          for g, h in hidden.items()}, updates, progress)
                for first, count in self.venv.blocks]
        replies = self.venv.run_jobs(args, "collecting a rollout")
        rollouts = {g: self.storages[g].next_rollout() for g in self.learning_groups}
        for g in self.learning_groups:
            rollouts[g].fill_from([r["rollouts"][g] for r in replies])
        for g, policy in self.policies.items():
            for reply in replies:
                policy.streams.absorb(reply["streams"][g])
        state.obs = Observation.join([r["obs"] for r in replies])
        state.hidden = {g: _join([r["hidden"][g] for r in replies]) for g in hidden}
        finished = sorted((e for r in replies for e in r["episodes"]), key=lambda ended: ended[:2])
        state.count_episodes(episode for _, _, episode in finished)
        return {g: Collected(rollouts[g], bootstrap_of(state.obs, state.hidden, g)) for g in self.learning_groups}

    def set_policy(self, group: str, policy_state) -> None:
        super().set_policy(group, policy_state)
        self.changed.add(group)

    def load_state_dict(self, policy_streams: dict, storage: dict) -> None:
        super().load_state_dict(policy_streams, storage)
        self.installed = False   # the policies' streams may have moved: the workers get them anew


def _join(blocks: list[np.ndarray | None]) -> np.ndarray | None:
    return None if blocks[0] is None else np.concatenate(blocks)


class _TensorData:
    """A tensor's values as a numpy array: a small tensor pickles through torch's own serialiser,
    many times slower than an array does, and an acting state goes to every worker after every
    update."""

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
