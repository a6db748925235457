"""Ray for a run: joining a cluster or starting a Ray of the run's own, keeping Ray's messages off
marlkit's console, and a cluster of several nodes on this machine's loopback for trying the
cluster paths (``python -m marlkit.envs.ray_cluster``).

A Ray started for a run is local to it and listens on 127.0.0.1 only; its servers go with the run
however it ends. A cluster joined stays up. A head that nothing answers at, or that needs an auth
token this process lacks, is named in one line before ``ray.init`` (which would retry for long).

Ray is imported lazily: ``--help`` and the other backends never pay for it.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import sys
import tempfile
import threading
from pathlib import Path

from marlkit.envs.sentinel import kill_when_gone
from marlkit.errors import ConfigError

RAY_PIN = "ray==2.60.0"
LOOPBACK = "127.0.0.1"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
def loopback_node_ip():
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
    agents = {p for p in _descendants(roots) if cmdline(p).startswith(("ray::DashboardAgent", "ray::RuntimeEnvAgent"))}
    return kill_when_gone(sorted(roots | agents))


def cmdline(pid: int) -> str:
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


def _check_token(address: str) -> None:
    """One call to the head with the auth token this process would send, so that a missing or
    wrong token is named at once: ``ray.init`` retries for 20 s, writing a warning a second to the
    console, then reports only that it could not connect."""
    import grpc
    from ray._private.authentication.grpc_authentication_client_interceptor import (
        _get_authentication_metadata_tuple)
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    from ray.exceptions import AuthenticationError
    try:
        sent = _get_authentication_metadata_tuple()
    except AuthenticationError:   # RAY_AUTH_MODE=token, and no token to be found
        sent = ()
    with grpc.insecure_channel(address) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=10, metadata=sent)
            return
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
                return   # for ray.init to report
    _token_error(address, sent)


def _token_error(address: str, sent: tuple) -> None:
    if sent:
        why = "refused the auth token that this process sent"
    elif os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        why = "needs its auth token, and this process has none (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)"
    else:
        why = "needs its auth token, and this process sent none (RAY_AUTH_MODE is not token)"
    raise ConfigError(f"runner.ray_address: the Ray cluster at {address} {why}; set RAY_AUTH_MODE=token and "
                      "RAY_AUTH_TOKEN to the cluster's token (`ray get-auth-token` on its head prints it)")


class RayLog:
    """Ray's own messages to this process, kept off marlkit's console: the errors the cluster
    pushes to its drivers (when a node dies, the last 20 lines of its raylet's log, most of them
    ``[state-dump]``) and the log of Ray's Python side. They are held in memory until
    :meth:`move_to` gives them a directory (the run's), where they go to ``ray.log``; a warning or
    an error before that puts them in a temp file, which is kept and named in one line at the end.
    Nothing else leaves a file behind, however the run ends."""

    def __init__(self, ray):
        self._worker = ray._private.worker
        self.path: Path | None = None
        self.temporary = True
        self._file = io.StringIO()
        self._lock = threading.RLock()
        self._printer = self._worker.print_to_stdstream
        self._worker.print_to_stdstream = self._write
        self._logger = logging.getLogger("ray")
        self._handlers, self._propagate = self._logger.handlers[:], self._logger.propagate
        self._handler = logging.StreamHandler(self._file)
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._handler.addFilter(self._note)
        self._logger.handlers, self._logger.propagate = [self._handler], False

    def _note(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            self._keep()
        return True

    def _keep(self) -> None:
        with self._lock:
            if self.path is None:
                fd, name = tempfile.mkstemp(prefix="marlkit-ray-", suffix=".log")
                self._switch(os.fdopen(fd, "a", buffering=1, encoding="utf-8", errors="replace"))
                self.path = Path(name)

    def _switch(self, file) -> None:
        """Go on writing to ``file``, after what was written so far."""
        old = self._file
        old.flush()
        file.write(old.getvalue() if self.path is None else self.path.read_text(encoding="utf-8", errors="replace"))
        self._file = file
        self._handler.setStream(file)
        old.close()
        if self.path is not None and self.temporary:
            self.path.unlink()

    def _write(self, data: dict, ignore_prefix: bool = False) -> None:
        with self._lock:
            self._keep()
            for line in data.get("lines", []):
                self._file.write(f"({data.get('pid', 'ray')}) {line}\n")

    def move_to(self, directory) -> Path:
        """Go on in ``directory``/ray.log, with what was written so far."""
        target = Path(directory) / "ray.log"
        with self._lock:
            if target != self.path:
                self._switch(open(target, "a", buffering=1, encoding="utf-8", errors="replace"))
                self.path, self.temporary = target, False
        return target

    def close(self) -> None:
        self._worker.print_to_stdstream = self._printer
        self._logger.handlers, self._logger.propagate = self._handlers, self._propagate
        with self._lock:
            self._file.close()
        if self.path is None:
            return
        if self.temporary:
            print(f"marlkit: Ray's messages of this run are in {self.path}", file=sys.stderr)
        elif self.path.stat().st_size == 0:
            self.path.unlink()


def connect(address: str | None) -> tuple[bool, object, RayLog | None]:
    """Join or start Ray for this run: (connected here, the sentinel of a Ray started here or
    None, where Ray's messages go). A Ray the caller already initialised is used as it is, its
    messages included; a cluster joined is left running at the end."""
    ray = import_ray()
    if ray.is_initialized():
        return False, None, None
    if address is None:
        address = os.environ.get("RAY_ADDRESS") or None
    quiet = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address is None:
        # a Ray of this run only ("local": never one that `ray start` left on this machine), and
        # nothing of it listens beyond this machine
        log = RayLog(ray)
        try:
            with loopback_node_ip():
                ray.init(address="local", _node_ip_address=LOOPBACK, **quiet)
        except BaseException:
            log.close()
            raise
        return True, _reap_with_this_process(ray), log
    if address != "auto":
        _probe(address)
        _check_token(address)
    # a head on this machine's loopback (a cluster of this machine only) is joined as a node of it:
    # found by the machine's outward IP, the driver would wait for a node of its own there
    on_loopback = address.rpartition(":")[0] in (LOOPBACK, "localhost")
    log = RayLog(ray)
    try:
        with loopback_node_ip() if on_loopback else contextlib.nullcontext():
            ray.init(address=address, **({"_node_ip_address": LOOPBACK} if on_loopback else {}), **quiet)
    except ray.exceptions.AuthenticationError:
        log.close()
        _token_error(address, ())
    except (ConnectionError, ValueError, RuntimeError) as exc:
        log.close()
        raise ConfigError(f"runner.ray_address: cannot join a Ray cluster at {address!r} ({first_line(exc)}); "
                          "start one with `ray start --head`, or set runner.ray_address: null for a local Ray") from None
    except BaseException:
        log.close()
        raise
    return True, None, log


@contextlib.contextmanager
def loopback_cluster(nodes: int = 2, cpus_per_node: float = 1):
    """A Ray cluster of several nodes on this machine, every node and this driver bound to
    127.0.0.1 (a head with no CPUs, so that work lands on the worker nodes): for trying the
    cluster paths (placement, node loss) without a network. Yields ``ray.cluster_utils.Cluster``;
    ``cluster.remove_node`` takes a node away."""
    ray = import_ray()
    from ray.cluster_utils import Cluster
    with loopback_node_ip():
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


def main(argv: list[str] | None = None) -> None:
    """``python -m marlkit.envs.ray_cluster``: a Ray cluster of several nodes on this machine's
    loopback until Ctrl+C, for trying ``runner.vectorize: ray`` and node loss without a network.
    ``ray start`` cannot do this: it maps 127.0.0.1 onto the machine's outward address, so that
    other machines can join."""
    import argparse
    import signal
    parser = argparse.ArgumentParser(prog="python -m marlkit.envs.ray_cluster",
                                     description="A Ray cluster of several nodes on 127.0.0.1 alone, until Ctrl+C.")
    parser.add_argument("--nodes", type=int, default=2, help="worker nodes (the head has no CPUs)")
    parser.add_argument("--cpus-per-node", type=float, default=2)
    args = parser.parse_args(argv)
    # both unwind, so that the nodes stop (SIGINT too where a shell started this in the background)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with loopback_cluster(args.nodes, args.cpus_per_node) as cluster:
        print(f"a Ray cluster of {args.nodes} nodes of {args.cpus_per_node:g} CPUs on {LOOPBACK}; join it with "
              f"--set runner.vectorize=ray runner.ray_address={cluster.address}; Ctrl+C stops it", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
