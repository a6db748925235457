"""One Unity scene behind mlagents' ``UnityEnvironment``, whose player marlkit launches and stops.

Left to itself, ``UnityEnvironment`` launches a build inside its constructor, so an interrupt while
it waits for the player to connect leaves the player running (the constructor never hands the
process over); on a timeout or close it kills the build's own process but not the children a
launcher script started; and its gRPC server thread, blocked in an exchange, keeps the
interpreter from exiting when a script ends without ``close()`` (its atexit hook runs only after
that thread is joined). Here ``UnityEnvironment`` serves the port alone, as it does for the
Editor; the build is launched through :mod:`marlkit.envs.processes` (its own process group,
watched from the moment it exists) right before the handshake, and every exit path kills that
group. Live scenes are closed before the interpreter joins its threads.

ML-Agents' gRPC server listens on every interface (``[::]``, so that a player in a Docker container
can connect); here it listens on 127.0.0.1 alone, since marlkit launches its players on this
machine and the protocol has no authentication. Its waits are bounded by ``timeout_wait`` (its
handshake waited without limit for the player's second message) and given up when the process
that started this one is gone (:func:`marlkit.envs.processes.lifeline`).

Imported only when a unity env is built (it imports mlagents-envs).
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import wait

import grpc
from mlagents_envs import env_utils
from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto
from mlagents_envs.communicator_objects.unity_to_external_pb2_grpc import add_UnityToExternalProtoServicer_to_server
from mlagents_envs.environment import UnityEnvironment
from mlagents_envs.exception import UnityTimeOutException, UnityWorkerInUseException
from mlagents_envs.rpc_communicator import RpcCommunicator, UnityToExternalServicerImplementation

from marlkit.envs import processes
from marlkit.errors import ConfigError

EXIT_GRACE = 5.0   # seconds a scene gets to quit on its own at interpreter exit
POLL_S = 1.0       # how often a wait for the scene checks that its process still runs
# The first bytes of a file the launch wrapper may exec: a native executable or a script naming its
# interpreter. Anything else (a text file with the run bit) would be run by /bin/sh as commands.
_LAUNCHABLE = (b"\x7fELF", b"#!") + ((b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xca\xfe\xba\xbe")
                                     if sys.platform == "darwin" else ())   # Mach-O, inside a .app


def launch_path(file_name: str) -> str:
    """The executable of the build ``file_name`` (ML-Agents' own lookup, which also tries the
    platform's extensions), or a :class:`ConfigError` naming ``env.file_name`` and the fix."""
    launch = env_utils.validate_environment_path(file_name)
    if launch is None:
        raise ConfigError(f"env.file_name={file_name!r}: no Unity build there (also tried with .x86_64 and "
                          ".x86); point it at the build's executable, or set it to null to train in the Editor")
    if not os.access(launch, os.X_OK):
        raise ConfigError(f"env.file_name={file_name!r}: {launch} is not executable; chmod +x it")
    header = b""
    if os.path.isfile(launch):
        with open(launch, "rb") as file:
            header = file.read(4)
    if not header.startswith(_LAUNCHABLE):
        raise ConfigError(f"env.file_name={file_name!r}: {launch} is not a build (neither an executable program "
                          "nor a script starting with #!); point it at the build's executable, e.g. "
                          "builds/SoccerTwos.x86_64")
    return launch


class _Communicator(RpcCommunicator):
    """ML-Agents' server on 127.0.0.1, whose every wait ends within ``timeout_wait`` seconds, sooner
    when the player's process exits, and with :class:`SystemExit` when this process's lifeline
    says that the process that started it is gone."""

    def create_server(self):
        self.check_port(self.port)
        try:
            self.server = grpc.server(thread_pool=ThreadPoolExecutor(max_workers=10),
                                      options=(("grpc.so_reuseport", 1),))
            self.unity_to_external = UnityToExternalServicerImplementation()
            add_UnityToExternalProtoServicer_to_server(self.unity_to_external, self.server)
            self.server.add_insecure_port(f"127.0.0.1:{self.port}")
            self.server.start()
            self.is_open = True
        except Exception:
            raise UnityWorkerInUseException(self.worker_id) from None

    def _wait(self, deadline: float, poll_callback) -> None:
        conn = self.unity_to_external.parent_conn
        lifeline = processes.lifeline()
        watched = [conn] if lifeline is None else [conn, lifeline]
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise UnityTimeOutException(f"no message from the player within {self.timeout_wait} s")
            ready = wait(watched, min(remaining, POLL_S))
            if conn in ready:
                return
            if ready:
                raise SystemExit("the process that started this one is gone, so nothing waits for its Unity scene")
            if poll_callback is not None:
                poll_callback()

    def poll_for_timeout(self, poll_callback=None) -> None:
        self._wait(time.monotonic() + self.timeout_wait, poll_callback)

    def initialize(self, inputs, poll_callback=None):
        # the player's initialization message, our answer, then its first message: one handshake,
        # one timeout_wait
        deadline = time.monotonic() + self.timeout_wait
        conn = self.unity_to_external.parent_conn
        self._wait(deadline, poll_callback)
        academy = conn.recv().unity_output
        message = UnityMessageProto()
        message.header.status = 200
        message.unity_input.CopyFrom(inputs)
        conn.send(message)
        self._wait(deadline, poll_callback)
        conn.recv()
        return academy


class Player(UnityEnvironment):
    """``UnityEnvironment`` for the build ``file_name`` (None: the Editor, nothing is launched),
    listening on ``port`` (None: ML-Agents' Editor port)."""

    def __init__(self, file_name: str | None, port: int | None, **kwargs):
        self._build = file_name
        self._process = None
        try:
            super().__init__(file_name=None, worker_id=0, base_port=port, **kwargs)
        except BaseException:
            self._close(0)
            raise
        # closed by _close_live, before the server threads are joined; mlagents' own hook would
        # also keep every scene ever opened alive
        atexit.unregister(self._close)
        _LIVE.add(self)

    @staticmethod
    def _get_communicator(worker_id, base_port, timeout_wait):
        return _Communicator(worker_id, base_port, timeout_wait)

    def _send_academy_parameters(self, init_parameters):
        # the server listens by now: the player may connect as soon as it runs; the build is checked
        # again here, for a file that changed since the config was checked or was never checked
        # (an env built directly, or on a Ray node)
        if self._build is not None:
            self._process = processes.launch([launch_path(self._build), *self._executable_args()])
        return super()._send_academy_parameters(init_parameters)

    def _close(self, timeout: float | None = None) -> None:
        """Status 400 to the scene, then ``timeout`` seconds (default ``timeout_wait``) for its
        player to quit before its process group is killed; safe to call more than once, and on a
        half-built instance."""
        atexit.unregister(self._close)
        _LIVE.discard(self)
        self._loaded = False
        communicator = getattr(self, "_communicator", None)
        if communicator is not None:
            communicator.close()
        process, self._process = self._process, None
        if process is not None:
            processes.stop(process, self._timeout_wait if timeout is None else timeout)


_LIVE: "weakref.WeakSet[Player]" = weakref.WeakSet()


def _close_live() -> None:
    for player in list(_LIVE):
        player._close(EXIT_GRACE)


# Run at interpreter exit before non-daemon threads are joined (atexit runs after), and before
# concurrent.futures joins the server's thread pool (registered earlier, run later).
threading._register_atexit(_close_live)
