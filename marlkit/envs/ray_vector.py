"""Env workers as Ray actors, anywhere in a Ray cluster; the learner stays in this process.

Each actor hosts a contiguous, node-local block of envs (a Doom match's players talk over loopback,
so a match never spans nodes) and reserves ``runner.ray_cpus_per_worker`` CPUs, so Ray spreads the
actors over nodes as it would processes. One call per actor per step carries the actions of all
its envs, ``[E_w, A_g, ...]`` per group, and brings back the step's arrays of all its envs, images
as the env's own dtype (uint8). The final observations travel only on steps where something ends.

Faults: every wait has a timeout (``runner.worker_timeout``, ``runner.worker_start_timeout``), so a
hung env becomes an :class:`EnvWorkerError`, never a hang. An actor that dies (its process, or its
whole node) is replaced on a live node with room, at most ``runner.ray_max_restarts`` times per
run; its envs start fresh episodes, and the episode each of them was in is cut as truncated at the
step that was lost. Where no node has room, the run stops with one line naming the lost node.
Game processes die with their actor: each env's own clean-up watches its parent process.

Ray is imported lazily: ``--help`` and the other backends never pay for it.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import socket
import time
from typing import Callable

import numpy as np

from marlkit.envs.core import EnvSpec, EnvWorkerError, MultiAgentEnv, Observation, StepResult
from marlkit.envs.sentinel import disarm, kill_when_gone
from marlkit.envs.vector import _LIVE, VectorEnv, _Arrays, _seeds, action_shapes, dumps_state
from marlkit.errors import ConfigError

RAY_PIN = "ray==2.60.0"
LOOPBACK = "127.0.0.1"
# room for a lost actor's replacement: Ray frees a dead node's resources a few seconds after it goes
ROOM_WAIT_S = 30.0
# the whole restart of a lost actor, so that a run with no room left stops within a minute
RESTART_LIMIT_S = 55.0


def import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(f"runner.vectorize: ray needs Ray, which is not installed; install it with "
                          f"`pip install {RAY_PIN}` (make install does) or choose another runner.vectorize") from None
    return ray


def _probe(address: str) -> None:
    """A clear error at once for an address nothing answers at (``ray.init`` would retry for long)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"runner.ray_address: {address!r} is not 'auto' or host:port of a Ray head "
                          "(e.g. 10.0.0.5:6379, printed by `ray start --head`); null starts a local Ray")
    try:
        socket.create_connection((host, int(port)), timeout=3.0).close()
    except OSError as exc:
        raise ConfigError(f"runner.ray_address: no Ray head answers at {address} ({exc.strerror or exc}); "
                          "start one with `ray start --head` there, or set runner.ray_address: null "
                          "for a local Ray") from None


@contextlib.contextmanager
def _loopback_node_ip():
    """Ray takes a node's IP from the machine's route outwards, and maps 127.0.0.1 given to it onto
    that IP too; answering loopback here binds the nodes started meanwhile to 127.0.0.1."""
    from ray._private import services
    detect = services.get_node_ip_address
    services.get_node_ip_address = lambda address=None: LOOPBACK
    try:
        yield
    finally:
        services.get_node_ip_address = detect


def _reap_with_this_process(ray):
    """Ray's servers die with this process, but their agents linger for a minute or more after a
    SIGKILL of it: the servers and agents of the local Ray go with this process, however it ends.
    Workers are left out (they come and go, and their pids may be reused); they die with their
    raylet."""
    node = ray._private.worker._global_node
    roots = {info.process.pid for infos in node.all_processes.values() for info in infos if info.process}
    agents = {p for p in _descendants(roots) if _cmdline(p).startswith(("ray::DashboardAgent", "ray::RuntimeEnvAgent"))}
    return kill_when_gone(sorted(roots | agents))


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _descendants(pids: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    out, todo = set(), list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def connect(address: str | None) -> tuple[bool, object]:
    """Join or start Ray for this run: (connected here, the sentinel of a Ray started here or
    None). A Ray the caller already initialised is used as it is; a cluster joined is left
    running at the end."""
    ray = import_ray()
    if ray.is_initialized():
        return False, None
    if address is None:
        address = os.environ.get("RAY_ADDRESS") or None
    quiet = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address is None:
        # a Ray of this run only ("local": never one that `ray start` left on this machine), and
        # nothing of it listens beyond this machine
        with _loopback_node_ip():
            ray.init(address="local", _node_ip_address=LOOPBACK, **quiet)
        return True, _reap_with_this_process(ray)
    if address != "auto":
        _probe(address)
    # a head on this machine's loopback (a cluster of this machine only) is joined as a node of it:
    # found by the machine's outward IP, the driver would wait for a node of its own there
    on_loopback = address.rpartition(":")[0] in (LOOPBACK, "localhost")
    try:
        with _loopback_node_ip() if on_loopback else contextlib.nullcontext():
            ray.init(address=address, **({"_node_ip_address": LOOPBACK} if on_loopback else {}), **quiet)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"runner.ray_address: cannot join a Ray cluster at {address!r} ({first}); start one "
                          "with `ray start --head`, or set runner.ray_address: null for a local Ray") from None
    return True, None


@contextlib.contextmanager
def loopback_cluster(nodes: int = 2, cpus_per_node: float = 1):
    """A Ray cluster of several nodes on this machine, every node and this driver bound to
    127.0.0.1 (a head with no CPUs, so that work lands on the worker nodes): for trying the
    cluster paths (placement, node loss) without a network. Yields ``ray.cluster_utils.Cluster``;
    ``cluster.remove_node`` takes a node away."""
    ray = import_ray()
    from ray.cluster_utils import Cluster
    with _loopback_node_ip():
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": LOOPBACK,
                                                                "include_dashboard": False})
        try:
            for _ in range(nodes):
                cluster.add_node(num_cpus=cpus_per_node, node_ip_address=LOOPBACK)
            ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
            cluster.wait_for_nodes()
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()


class EnvHost:
    """One actor's envs, rows ``0..E_w-1`` of its own step arrays."""

    def start(self, env_fns: list[Callable[[], MultiAgentEnv]]) -> tuple[EnvSpec, str, str, int]:
        import ray
        self.envs = []
        for fn in env_fns:
            self.envs.append(fn())
        self.spec = self.envs[0].spec
        self.arrays = _Arrays(self.spec, len(self.envs), action_shapes(self.spec))
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

    def get_state(self) -> list:
        return [dumps_state(env) for env in self.envs]

    def set_state(self, blobs: list[bytes]) -> None:
        for env in self.envs:
            env.close()
        self.envs = [pickle.loads(blob) for blob in blobs]

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
        super().__init__()
        ray = self.ray = import_ray()
        self.env_fns = env_fns
        self.num_envs = len(env_fns)
        self.cpus, self.timeout, self.start_timeout = cpus_per_worker, timeout, start_timeout
        self.max_restarts, self.restarts = max_restarts, 0
        self.bytes_sent = self.bytes_received = 0
        self.closed = False
        self.actors: list = []
        self.connected, self.reaper = connect(address)
        _LIVE.add(self)
        try:
            if num_workers is None:
                num_workers = max(1, int(ray.cluster_resources().get("CPU", 1) // cpus_per_worker))
            chunks = np.array_split(np.arange(self.num_envs), min(num_workers, self.num_envs))
            self.blocks = [slice(int(c[0]), int(c[-1]) + 1) for c in chunks]
            self.actor_cls = ray.remote(EnvHost)
            self.actors = [self._spawn(w) for w in range(len(self.blocks))]
            started = self._get([a.start.remote(self._fns(w)) for w, a in enumerate(self.actors)],
                                "creating the env", start_timeout)
            self.spec = started[0][0]
            self.nodes = [(node, ip, pid) for _, node, ip, pid in started]
            self.arrays = _Arrays(self.spec, self.num_envs, action_shapes(self.spec))
            self._seed: int | None = None
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ actors

    def _fns(self, w: int) -> list:
        return self.env_fns[self.blocks[w]]

    def _spawn(self, w: int):
        # restarts are this class's own: a replacement must also reset its envs and cut their episodes
        return self.actor_cls.options(num_cpus=self.cpus, max_restarts=0, max_task_retries=0).remote()

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
        for actor, b in zip(self.actors, self.blocks):
            part = {g: a[b] for g, a in actions.items()}
            self.bytes_sent += sum(a.nbytes for a in part.values())
            refs.append(actor.step.remote(part))
        return refs

    def _restart(self, w: int, cause: Exception) -> dict:
        """A new actor for worker ``w``'s envs on a live node with room; the first observations
        of its reset envs."""
        ray = self.ray
        lost = self._where(w)
        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise EnvWorkerError(f"{lost} was lost ({type(cause).__name__}); that is restart {self.restarts}, "
                                 f"beyond runner.ray_max_restarts={self.max_restarts}: check the node, raise "
                                 "the setting, and continue with --resume")
        ray.kill(self.actors[w], no_restart=True)
        began = time.monotonic()
        while ray.available_resources().get("CPU", 0.0) < self.cpus:
            if time.monotonic() - began > ROOM_WAIT_S:
                raise EnvWorkerError(f"{lost} was lost and no live node has {self.cpus:g} free CPU for its envs; "
                                     "add a node (ray start --address=<head>) or lower runner.parallels, "
                                     "and continue with --resume")
            time.sleep(0.5)
        self.actors[w] = self._spawn(w)
        limit = min(self.start_timeout, max(1.0, RESTART_LIMIT_S - (time.monotonic() - began)))
        (spec, node, ip, pid), = self._get([self.actors[w].start.remote(self._fns(w))], "creating the env",
                                           limit, [w])
        self.nodes[w] = (node, ip, pid)
        b = self.blocks[w]
        seeds = _seeds(self._seed, b.stop - b.start, b.start + self.restarts * self.num_envs)
        return self._get([self.actors[w].reset.remote(seeds)], "resetting", workers=[w])[0]

    # ------------------------------------------------------------------ vector env

    def _put(self, w: int, arrays: dict) -> None:
        b = self.blocks[w]
        for k, v in arrays.items():
            self.arrays.a[k][b] = v
            self.bytes_received += v.nbytes

    def reset(self, seed: int | None = None) -> Observation:
        self._seed = seed
        refs = [actor.reset.remote(_seeds(seed, b.stop - b.start, b.start)) for actor, b in zip(self.actors, self.blocks)]
        for w, arrays in enumerate(self._get(refs, "resetting")):
            self._put(w, arrays)
        return self._start(self.arrays.observation("next"))

    def step(self, actions: dict[str, np.ndarray]) -> StepResult:
        ray = self.ray
        refs = self._step_refs(actions)
        ended, lost = {}, {}
        a = self.arrays.a
        for w, ref in enumerate(refs):
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
        for w in lost:   # a cut episode is no episode: its return would be partial
            result.lost[self.blocks[w]] = True
            for e in range(self.blocks[w].start, self.blocks[w].stop):
                result.infos[e].pop("episode", None)
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

    def _env_states(self) -> list[bytes | None]:
        per_worker = self._get([actor.get_state.remote() for actor in self.actors], "saving env state")
        return [blob for blobs in per_worker for blob in blobs]

    def _load_env_states(self, blobs: list[bytes]) -> None:
        self._get([actor.set_state.remote(blobs[b]) for actor, b in zip(self.actors, self.blocks)],
                  "restoring env state")

    def close(self, grace: float | None = None) -> None:
        """Ask the actors to close their envs (at most ``grace`` s, default the step timeout capped
        at 30 s), then kill them; a Ray started for this run stops, a cluster joined stays."""
        if self.closed:
            return
        self.closed = True
        _LIVE.discard(self)
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


def make_ray_vector_env(env_fn: Callable[[int], MultiAgentEnv], num_envs: int, num_workers: int | None,
                        cpus_per_worker: float, address: str | None, timeout: float, start_timeout: float,
                        max_restarts: int, first_index: int = 0) -> RayVectorEnv:
    """``env_fn(first_index + i)`` builds env ``i`` on whichever node its actor lands; it must be
    picklable, and the env's package installed on every node."""
    import functools
    fns = [functools.partial(env_fn, first_index + i) for i in range(num_envs)]
    return RayVectorEnv(fns, num_workers, cpus_per_worker, address, timeout, start_timeout, max_restarts)
