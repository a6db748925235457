"""Free ports for the game servers that env adapters start (a ViZDoom host, an ML-Agents gRPC
server).

A port asked of the OS with ``bind(0)`` comes from the ephemeral range, the same range every
client socket draws from, so between picking it and the server binding it, a client of another
game (a ViZDoom joiner's socket, say) can be handed that very port; the server then fails to bind
(ViZDoom's engine segfaults). Ports are therefore drawn at random from below the ephemeral range,
where nothing is handed out implicitly, and checked free by binding them.
"""
from __future__ import annotations

import random
import socket

LOWEST = 20000            # leave the lower ports to services that are configured to use them
_DEFAULT_EPHEMERAL = (32768, 60999)


def ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL


def free_port(kind: int = socket.SOCK_DGRAM, host: str = "0.0.0.0", attempts: int = 64) -> int:
    """A port that ``host`` can bind for ``kind`` (``SOCK_DGRAM`` or ``SOCK_STREAM``) right now,
    outside the ephemeral range when that leaves room; another process may still take it before
    the server binds it, so callers retry on a failed start."""
    low = ephemeral_range()[0]
    pool = range(LOWEST, low) if low - LOWEST >= 1000 else None
    rng = random.SystemRandom()
    for _ in range(attempts if pool else 0):
        port = rng.choice(pool)
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
