"""Server ports are drawn from below the ephemeral range, where no client socket is handed one."""
import socket

from marlkit.envs import ports


def test_free_ports_lie_below_the_ephemeral_range_and_can_be_bound():
    low, _ = ports.ephemeral_range()
    for kind, host in ((socket.SOCK_DGRAM, "0.0.0.0"), (socket.SOCK_STREAM, "localhost")):
        picked = [ports.free_port(kind, host) for _ in range(20)]
        assert all(ports.LOWEST <= p < low for p in picked)
        assert len(set(picked)) > 1                     # drawn at random, not one fixed port
        with socket.socket(socket.AF_INET, kind) as sock:
            sock.bind((host, picked[-1]))


def test_a_taken_port_is_skipped(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("0.0.0.0", 0))
        busy = taken.getsockname()[1]
        draws = iter([busy, busy])
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (busy + 2000, busy + 3000))
        monkeypatch.setattr(ports.random.SystemRandom, "choice", lambda self, pool: next(draws, busy + 1))
        assert ports.free_port(socket.SOCK_DGRAM) == busy + 1


def test_without_room_below_the_range_the_os_picks(monkeypatch):
    real_low, real_high = ports.ephemeral_range()
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (ports.LOWEST + 10, 65000))
    assert real_low <= ports.free_port(socket.SOCK_STREAM, "localhost") <= real_high   # bind(0): the OS's range
