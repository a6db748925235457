"""The keeper of one Doom match: a small process that holds the match's network and work folder,
and releases them however the process that owns the match ends.

Network. ViZDoom's engine binds its UDP socket to every interface (``INADDR_ANY`` in ZDoom's
``BindToLocalPort``, with no option to choose the address), so a host engine in the machine's own
network can be reached, and joined, from anywhere that reaches the machine. The keeper therefore
makes a network namespace with nothing in it but loopback, and every engine of the match joins it
before it starts: the engines still bind ``0.0.0.0``, but that is the loopback of the match alone.
A privileged process makes the namespace directly; any other one inside a user namespace of its
own (which maps its own user only), where the system allows user namespaces.

Work folder. The owner removes the folder when it closes the match; when the owner dies without
closing (SIGKILL included) the keeper's stdin closes, and the keeper removes the folder.

Shared memory. Each engine and its controller talk through three files in ``/dev/shm`` named after
the engine's ``+viz_instance_id``; ViZDoom's controller removes them when it closes its game, but
not when its process is killed (a failed match, its owner killed), and ``/dev/shm`` keeps them
until the machine restarts. The launcher writes the engine's instance id into its player's
folder, and whoever removes the work folder releases those files first (``release``). A controller
creates its two message queues before its engine is launched, so a player killed in between has
written no id: the owner, closing a match, stops what is left of each player, reads the files its
processes hold (``held``), kills them and unlinks those (``unlink``).

Run as a script, ``python -I -S keeper.py``, so that it imports the standard library alone: a
process that makes or joins a user namespace must have a single thread, and importing numpy
starts a second one.

    keep <work_dir> <isolate|share>
        Reports one line on stdout, ``<pid> isolated <inode of the namespace>`` or ``<pid> shared
        <why>``, then waits for stdin to close, releases the shared memory of the engines started
        in ``work_dir`` and removes ``work_dir`` if it is still there.
    enter <keeper pid> <namespace inode> <engine> [arguments]
        Joins the keeper's namespace (none where both are ``-``: the match shares the machine's
        network), writes the engine's instance id into the current folder (its player's) and
        executes the engine: a player's game starts its engine through this
        (``DoomGame.set_vizdoom_path``).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import socket
import struct
import sys
import time

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
INSTANCE_FILE = "engine_instance"   # in a player's folder: its engine's +viz_instance_id
SHARED_MEMORY = ("ViZDoomSM", "ViZDoomMQCtr", "ViZDoomMQDoom")   # each + the instance id, in /dev/shm


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _isolate() -> int:
    """Move this process into a new network namespace with loopback up; its inode."""
    libc = _libc()
    if libc.unshare(CLONE_NEWNET) != 0:
        uid, gid = os.geteuid(), os.getegid()
        _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNET), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
    return os.stat("/proc/self/ns/net").st_ino


def release(work_dir: str) -> None:
    """Unlink the shared memory files of the engines started in ``work_dir`` (their processes may
    still be running: the files go when the last of them lets go)."""
    try:
        players = os.listdir(work_dir)
    except OSError:
        return
    for player in players:
        try:
            with open(os.path.join(work_dir, player, INSTANCE_FILE)) as f:
                instance = f.read().strip()
        except OSError:
            continue
        if instance.isalnum():
            unlink({f"/dev/shm/{prefix}{instance}" for prefix in SHARED_MEMORY})


def held(pids: list[int]) -> set[str]:
    """The engines' shared memory files that processes ``pids`` (stopped: ``processes.pause_group``)
    have open or mapped. The open ones are read before the mapped ones: a file is open once created,
    mapped before it is closed, so none is missed however far a process had got."""
    found = set()
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            links = []
        try:
            with open(f"/proc/{pid}/maps") as f:
                links += [line.split(maxsplit=5)[-1].strip() for line in f if "/dev/shm/" in line]
        except OSError:
            pass
        for name in links:
            if (name.startswith("/dev/shm/") and name[len("/dev/shm/"):].startswith(SHARED_MEMORY)
                    and not name.endswith(" (deleted)")):   # that one is unlinked already
                found.add(name)
    return found


def unlink(paths: set[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def _remove(work_dir: str) -> None:
    # the players' watchdogs stop the engines within a fraction of a second of the owner's death;
    # a file one of them writes meanwhile would keep the folder, so it is tried again
    for delay in (0.0, 0.5, 1.0, 2.0):
        if not os.path.isdir(work_dir):
            return
        time.sleep(delay)
        shutil.rmtree(work_dir, ignore_errors=True)


def keep(work_dir: str, isolate: bool) -> None:
    try:
        line = f"{os.getpid()} isolated {_isolate()}" if isolate else f"{os.getpid()} shared"
    except OSError as exc:
        line = f"{os.getpid()} shared {exc.strerror or exc}"
    except AttributeError:   # a C library without unshare: not Linux
        line = f"{os.getpid()} shared this system has no network namespaces"
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    while sys.stdin.buffer.read(4096):
        pass
    release(work_dir)
    _remove(work_dir)


def _join(keeper: int, inode: int) -> None:
    user = os.open(f"/proc/{keeper}/ns/user", os.O_RDONLY)
    net = os.open(f"/proc/{keeper}/ns/net", os.O_RDONLY)
    if os.fstat(net).st_ino != inode:   # the keeper is gone and its pid reused
        raise OSError(errno.ESRCH, f"the match's keeper (pid {keeper}) is gone")
    libc = _libc()
    if os.fstat(user).st_ino != os.stat("/proc/self/ns/user").st_ino:
        _check(libc.setns(user, CLONE_NEWUSER), "setns (user namespace)")
    _check(libc.setns(net, CLONE_NEWNET), "setns (network namespace)")
    os.close(user)
    os.close(net)


def enter(network: tuple[int, int] | None, argv: list[str]) -> None:
    if network is not None:
        _join(*network)
    if "+viz_instance_id" in argv[:-1]:   # the engine starts in its player's folder
        try:
            _write(INSTANCE_FILE, argv[argv.index("+viz_instance_id") + 1])
        except OSError:   # its files would outlive a kill, which is no reason not to start
            pass
    os.execv(argv[0], argv)


def launcher(path: str, network: tuple[int, int] | None, engine: str) -> str:
    """Write an executable at ``path`` that starts ``engine`` in the namespace of ``network`` (the
    keeper's pid and namespace inode; None: the machine's network)."""
    import shlex
    keeper, inode = network or ("-", "-")
    words = [sys.executable, "-I", "-S", os.path.abspath(__file__), "enter", str(keeper), str(inode), engine]
    _write(path, "#!/bin/sh\nexec " + " ".join(shlex.quote(w) for w in words) + ' "$@"\n')
    os.chmod(path, 0o700)
    return path


if __name__ == "__main__":
    if sys.argv[1] == "keep":
        keep(sys.argv[2], sys.argv[3] == "isolate")
    else:
        try:
            enter(None if sys.argv[2] == "-" else (int(sys.argv[2]), int(sys.argv[3])), sys.argv[4:])
        except OSError as exc:
            where = "join its match's network namespace" if sys.argv[2] != "-" else "start"
            sys.stderr.write(f"marlkit: the engine cannot {where}: {exc}\n")
            sys.exit(1)
