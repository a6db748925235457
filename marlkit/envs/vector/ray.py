"""Env workers as Ray actors, anywhere in a Ray cluster; the learner stays in this process.

Each actor hosts a contiguous, node-local block of envs (a Doom match's players talk over loopback,
so a match never spans nodes) and reserves ``runner.ray_cpus_per_worker`` CPUs, so Ray spreads the
actors over nodes as it would processes. One call per actor per step carries the actions of all
its envs, ``[E_w, A_g, ...]`` per group, and brings back the step's arrays of all its envs, images
as the env's own dtype (uint8). The final observations travel only on steps where something ends.

Actors that the cluster's CPUs cannot hold are refused at the start, naming the settings to change.

Faults: every wait has a timeout (``runner.worker_timeout``, ``runner.worker_start_timeout``), so a
hung env becomes an :class:`EnvWorkerError`, never a hang. An actor that dies (its process, or its
whole node) is replaced on a live node with room, kept off the node it was lost with while any
other has room, at most ``runner.ray_max_restarts`` times per run; its envs start fresh episodes,
and the episode each of them was in is cut as truncated at the step that was lost. Where no node
has room, the run stops with one line naming the lost node. Game processes die with their actor:
each env's own clean-up watches its parent process.

Joining or starting Ray, and keeping its messages off the console, is ``marlkit/envs/ray_cluster.py``'s.
"""
from __future__ import annotations

import functools
import math
import os
import re
import time
from typing import Callable

import numpy as np

from marlkit.envs.core import EnvSpec, EnvWorkerError, MultiAgentEnv, Observation, StepResult
from marlkit.envs.ray_cluster import connect, first_line, import_ray
from marlkit.envs.sentinel import disarm
from marlkit.envs.vector.arrays import StepArrays, action_shapes
from marlkit.envs.vector.base import OPEN_VECTOR_ENVS, VectorEnv, env_seeds
from marlkit.envs.vector.episode_stats import EpisodeStatistics
from marlkit.envs.vector.state import dumps_state, loads_states
from marlkit.errors import ConfigError

# room for a lost actor's replacement: Ray frees a dead node's resources a few seconds after it goes
ROOM_WAIT_S = 30.0
# the whole restart of a lost actor, so that a run with no room left stops within a minute
RESTART_LIMIT_S = 55.0
NODE_ID_LABEL = "ray.io/node-id"   # every node carries it
_NODE_ID = re.compile(r"\b[0-9a-f]{56}\b")   # a node's id in Ray's messages


class EnvHost:
    """One actor's envs, rows ``0..E_w-1`` of its own step arrays."""

    def start(self, env_fns: list[Callable[[], MultiAgentEnv]]) -> tuple[EnvSpec, str, str, int]:
        import ray
        self.envs = []
        for fn in env_fns:
            self.envs.append(fn())
        self.spec = self.envs[0].spec
        self.arrays = StepArrays(self.spec, len(self.envs), action_shapes(self.spec))
        self.steady = [k for k in self.arrays.a if not k.startswith(("action.", "final."))]
        context = ray.get_runtime_context()
        return self.spec, context.get_node_id(), ray.util.get_node_ip_address(), os.getpid()

    def reset(self, seeds: list) -> dict:
        for j, (env, s) in enumerate(zip(self.envs, seeds)):
            self.arrays.write_obs("next", j, env.reset(seed=s))
        return {k: v for k, v in self.arrays.a.items() if k.startswith("next.")}

    def step(self, actions: dict[str, np.ndarray]) -> tuple[dict, dict]:
        """``actions[g]``: ``[E_w, A_g, ...]``. Returns the step's arrays and, per row whose episode
        ended, the env's ``episode_stats()``."""
        ended = {}
        for j, env in enumerate(self.envs):
            ob, reward, terminated, truncated, done = env.step({g: a[j] for g, a in actions.items()})
            if done:
                ended[j] = env.episode_stats()
            self.arrays.write_step(j, ob, reward, terminated, truncated, done, env.reset() if done else None)
        a = self.arrays.a
        keys = [k for k in a if not k.startswith("action.")] if a["any_end"].any() else self.steady
        return {k: a[k] for k in keys}, ended

    def render(self, row: int):
        return self.envs[row].render()

    def state_dict(self) -> list:
        return [dumps_state(env) for env in self.envs]

    def load_state_dict(self, blobs: list[bytes]) -> bool:
        self.envs, restored = loads_states(self.envs, blobs)
        return restored

    def close(self) -> None:
        for env in getattr(self, "envs", []):
            try:
                env.close()
            except Exception:
                pass
        self.envs = []


class RayVectorEnv(VectorEnv):
    """Envs spread over ``num_workers`` Ray actors (default: as many as the cluster has room for)."""

    def __init__(self, env_fns: list[Callable[[], MultiAgentEnv]], num_workers: int | None = None,
                 cpus_per_worker: float = 1.0, address: str | None = None, timeout: float = 60.0,
                 start_timeout: float = 120.0, max_restarts: int = 3):
        ray = self.ray = import_ray()
        self.env_fns = env_fns
        self.num_envs = len(env_fns)
        self.cpus, self.timeout, self.start_timeout = cpus_per_worker, timeout, start_timeout
        self.max_restarts, self.restarts = max_restarts, 0
        self.bytes_sent = self.bytes_received = 0
        self.closed = False
        self.actors: list = []
        self._lost: dict[int, Exception] = {}   # actors found dead between steps, replaced at the next one
        self.connected, self.reaper, self.ray_log = connect(address)
        OPEN_VECTOR_ENVS.add(self)
        try:
            num_workers = self._fitting(num_workers)
            chunks = np.array_split(np.arange(self.num_envs), num_workers)
            self.blocks = [slice(int(c[0]), int(c[-1]) + 1) for c in chunks]
            self.actor_cls = ray.remote(EnvHost)
            self.actors = [self._spawn(w) for w in range(len(self.blocks))]
            started = self._get([a.start.remote(self._fns(w)) for w, a in enumerate(self.actors)],
                                "creating the env", start_timeout)
            self.spec = started[0][0]
            self.nodes = [(node, ip, pid) for _, node, ip, pid in started]
            self.arrays = StepArrays(self.spec, self.num_envs, action_shapes(self.spec))
            self._seed: int | None = None
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ actors

    def _fitting(self, num_workers: int | None) -> int:
        """The number of actors, refused at once where the cluster's CPUs cannot hold them: Ray
        would leave the actors that do not fit pending, and the run would stop only when
        ``runner.worker_start_timeout`` ran out. The number asked for is not shrunk to fit: it
        decides how the envs are grouped on nodes (a Doom match's engines share their actor's CPUs),
        so a run does what its config says or says why not; null asks for the cluster's size."""
        total = self.ray.cluster_resources().get("CPU", 0.0)
        room = int(total / self.cpus + 1e-9)
        if num_workers is None:
            if room < 1:
                raise ConfigError(f"runner.ray_cpus_per_worker: an env actor reserves {self.cpus:g} CPU, but the Ray "
                                  f"cluster has {total:g}; lower runner.ray_cpus_per_worker or add a node "
                                  "(ray start --address=<head> --num-cpus=N)")
            num_workers = room
        actors = min(num_workers, self.num_envs)
        if actors > room:
            share = math.floor(total / actors * 100) / 100
            fixes = ([f"set runner.workers={room} (or null: as many as the cluster holds)"] if room else []) + \
                ([f"share CPUs with runner.ray_cpus_per_worker={share:g}"] if share >= 0.01 else [])
            raise ConfigError(f"runner.workers: {actors} env actors of runner.ray_cpus_per_worker={self.cpus:g} CPU "
                              f"need {actors * self.cpus:g} CPUs, but the Ray cluster has {total:g}; "
                              + ", ".join([*fixes, "or add nodes (ray start --address=<head>)"]))
        return actors

    def _fns(self, w: int) -> list:
        return self.env_fns[self.blocks[w]]

    def _spawn(self, w: int, label_selector: dict | None = None):
        # restarts are this class's own: a replacement must also reset its envs and cut their episodes
        options = {"num_cpus": self.cpus, "max_restarts": 0, "max_task_retries": 0}
        if label_selector:
            options["label_selector"] = label_selector
        return self.actor_cls.options(**options).remote()

    def _describe(self, w: int) -> str:
        b = self.blocks[w]
        return f"env {b.start}" if b.stop - b.start == 1 else f"envs {b.start}-{b.stop - 1}"

    def _where(self, w: int) -> str:
        if not getattr(self, "nodes", None):
            return f"the actor of {self._describe(w)}"
        node, ip, pid = self.nodes[w]
        return f"the actor of {self._describe(w)} (node {node[:12]} at {ip}, pid {pid})"

    def _get(self, refs: list, what: str, timeout: float | None = None, workers=None) -> list:
        """Results in order, or a named error: every wait ends within ``timeout`` seconds."""
        ray = self.ray
        workers = list(range(len(refs))) if workers is None else workers
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        out = []
        for w, ref in zip(workers, refs):
            try:
                out.append(ray.get(ref, timeout=max(0.0, deadline - time.monotonic())))
            except ray.exceptions.GetTimeoutError:
                setting = "runner.worker_start_timeout" if what == "creating the env" else "runner.worker_timeout"
                raise EnvWorkerError(f"{self._where(w)} did not answer within {timeout:g} s "
                                     f"while {what} ({setting})") from None
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause
                if isinstance(cause, ConfigError):
                    raise cause from None
                raise EnvWorkerError(f"{self._where(w)} raised while {what}: {type(cause).__name__}: {cause}\n\n"
                                     f"actor traceback:\n{exc}") from None
        return out

    def _step_refs(self, actions: dict[str, np.ndarray]) -> list:
        refs = []
        for w, (actor, b) in enumerate(zip(self.actors, self.blocks)):
            if w in self._lost:
                refs.append(None)
                continue
            part = {g: a[b] for g, a in actions.items()}
            self.bytes_sent += sum(a.nbytes for a in part.values())
            refs.append(actor.step.remote(part))
        return refs

    def _room(self, avoid: set[str]) -> dict | None:
        """Where a replacement may go: a label selector that keeps it off the nodes in ``avoid``
        while another live node has room, {} (anywhere) where only those have room, None while no
        live node has. A node that went down without a word stays listed as alive, with its dead
        actors' CPUs free, until its heartbeats have been missed for a while: Ray would place the
        replacement there first, the least loaded node, and the replacement would die with it."""
        from ray._private.state import available_resources_per_node
        alive = {n["NodeID"] for n in self.ray.nodes() if n["Alive"]}
        room = {node for node, free in available_resources_per_node().items()
                if node in alive and free.get("CPU", 0.0) >= self.cpus - 1e-9}
        if room - avoid:
            return {NODE_ID_LABEL: f"!in({','.join(sorted(avoid))})"}
        return {} if room else None

    def _restart(self, w: int, cause: Exception) -> dict:
        """A new actor for worker ``w``'s envs on a live node with room; the first observations
        of its reset envs. A replacement that dies before it has reset its envs (its node was going
        down too) is replaced in turn, within the same minute."""
        ray = self.ray
        lost = self._where(w)
        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise EnvWorkerError(f"{lost} was lost ({type(cause).__name__}); that is restart {self.restarts}, "
                                 f"beyond runner.ray_max_restarts={self.max_restarts}: check the node, raise "
                                 "the setting, and continue with --resume")
        ray.kill(self.actors[w], no_restart=True)
        avoid, began = {self.nodes[w][0]}, time.monotonic()
        while True:
            while (selector := self._room(avoid)) is None:
                if time.monotonic() - began > ROOM_WAIT_S:
                    raise EnvWorkerError(f"{lost} was lost and no live node has {self.cpus:g} free CPU for its envs; "
                                         "add a node (ray start --address=<head>) or lower runner.parallels, "
                                         "and continue with --resume")
                time.sleep(0.5)
            self.actors[w] = self._spawn(w, selector)
            limit = min(self.start_timeout, max(1.0, RESTART_LIMIT_S - (time.monotonic() - began)))
            b = self.blocks[w]
            try:
                (spec, node, ip, pid), = self._get([self.actors[w].start.remote(self._fns(w))], "creating the env",
                                                   limit, [w])
                seeds = env_seeds(self._seed, b.stop - b.start, b.start + self.restarts * self.num_envs)
                fresh = self._get([self.actors[w].reset.remote(seeds)], "resetting", workers=[w])[0]
            except ray.exceptions.RayActorError as exc:
                ray.kill(self.actors[w], no_restart=True)
                avoid |= set(_NODE_ID.findall(str(exc)))
                if time.monotonic() - began > RESTART_LIMIT_S:
                    raise EnvWorkerError(f"{lost} was lost, and so was its replacement ({first_line(exc)}); check "
                                         "the cluster's nodes (ray status) and continue with --resume") from None
                continue
            self.nodes[w] = (node, ip, pid)
            return fresh

    # ------------------------------------------------------------------ vector env

    def _put(self, w: int, arrays: dict) -> None:
        b = self.blocks[w]
        for k, v in arrays.items():
            self.arrays.a[k][b] = v
            self.bytes_received += v.nbytes

    def reset(self, seed: int | None = None) -> Observation:
        self._seed = seed
        refs = [actor.reset.remote(env_seeds(seed, b.stop - b.start, b.start)) for actor, b in zip(self.actors, self.blocks)]
        for w, ref in enumerate(refs):
            try:
                arrays = self._get([ref], "resetting", workers=[w])[0]
            except self.ray.exceptions.RayActorError as exc:
                arrays = self._restart(w, exc)
            self._put(w, arrays)
        self._lost.clear()
        return self.arrays.observation("next")

    def step(self, actions: dict[str, np.ndarray]) -> StepResult:
        ray = self.ray
        refs = self._step_refs(actions)
        ended, lost = {}, dict(self._lost)
        self._lost.clear()
        a = self.arrays.a
        for w, ref in enumerate(refs):
            if ref is None:
                continue
            try:
                (arrays, stats), = self._get([ref], "stepping", workers=[w])
            except ray.exceptions.RayActorError as exc:
                lost[w] = exc
                continue
            if not arrays["any_end"].any():
                for k in list(a):   # nothing ended in this block: its final observation is the next one
                    if k.startswith("final."):
                        a[k][self.blocks[w]] = arrays["next." + k[len("final."):]]
            self._put(w, arrays)
            ended.update({self.blocks[w].start + j: s for j, s in stats.items()})
        for w, exc in lost.items():
            self._cut(w, self._restart(w, exc))
        result = self._finish(self.arrays, ended)
        if lost:
            result.lost = np.zeros(self.num_envs, bool)
        for w in lost:
            result.lost[self.blocks[w]] = True
        return result

    def _cut(self, w: int, fresh: dict) -> None:
        """The lost step of worker ``w``'s envs: their episodes end truncated at the last observation
        the runner saw, with no reward, and fresh episodes follow (``StepResult.lost``: the runner
        stores the step with no agent present, so the step before it bootstraps from that
        observation and nothing is learned from the action that was lost)."""
        b, a = self.blocks[w], self.arrays.a
        for k in list(a):
            if k.startswith("final."):
                a[k][b] = a["next." + k[len("final."):]][b]
        for k, v in fresh.items():
            a[k][b] = v
        for k in a:
            if k.startswith(("reward.", "terminated.", "agent_end.")):
                a[k][b] = 0
            elif k.startswith("truncated."):
                a[k][b] = True
        a["episode_end"][b] = True
        a["any_end"][b] = True

    def render(self, index: int = 0):
        w = next(w for w, b in enumerate(self.blocks) if b.start <= index < b.stop)
        return self._get([self.actors[w].render.remote(index - self.blocks[w].start)], "rendering", workers=[w])[0]

    def state_dict(self) -> list[bytes | None]:
        """Every env's state; an actor lost meanwhile has none to give (the checkpoint then resumes
        with fresh episodes), and is replaced at the next step, which cuts its envs' episodes."""
        refs, out = [actor.state_dict.remote() for actor in self.actors], []
        for w, ref in enumerate(refs):
            try:
                out += self._get([ref], "saving env state", workers=[w])[0]
            except self.ray.exceptions.RayActorError as exc:
                self._lost[w] = exc
                out += [None] * (self.blocks[w].stop - self.blocks[w].start)
        return out

    def load_state_dict(self, blobs: list[bytes]) -> bool:
        return all(self._get([actor.load_state_dict.remote(blobs[b]) for actor, b in zip(self.actors, self.blocks)],
                             "restoring env state"))

    def close(self, grace: float | None = None) -> None:
        """Ask the actors to close their envs (at most ``grace`` s, default the step timeout capped
        at 30 s), then kill them; a Ray started for this run stops, a cluster joined stays."""
        if self.closed:
            return
        self.closed = True
        OPEN_VECTOR_ENVS.discard(self)
        ray = self.ray
        if self.actors and ray.is_initialized():
            refs = [actor.close.remote() for actor in self.actors]
            ray.wait(refs, num_returns=len(refs), timeout=grace if grace is not None else min(self.timeout, 30.0))
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
        self.actors = []
        if self.connected:
            ray.shutdown()
        if self.reaper is not None:
            disarm(self.reaper)
        if self.ray_log is not None:
            self.ray_log.close()

    def log_to(self, directory) -> None:
        """Ray's messages to this run go on in ``directory``/ray.log (the run directory, once there
        is one), with those written before; no-op where the caller initialised Ray."""
        if self.ray_log is not None:
            self.ray_log.move_to(directory)


def make_ray_vector_env(env_fn: Callable[[int], MultiAgentEnv], num_envs: int, num_workers: int | None,
                        cpus_per_worker: float, address: str | None, timeout: float, start_timeout: float,
                        max_restarts: int, first_index: int = 0) -> EpisodeStatistics:
    """``env_fn(first_index + i)`` builds env ``i`` on whichever node its actor lands; it must be
    picklable, and the env's package installed on every node. Wrapped in ``EpisodeStatistics``."""
    fns = [functools.partial(env_fn, first_index + i) for i in range(num_envs)]
    return EpisodeStatistics(RayVectorEnv(fns, num_workers, cpus_per_worker, address, timeout, start_timeout,
                                          max_restarts))
