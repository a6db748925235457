"""What of a Doom match the machine's network can reach, and what of it outlives its process: each
match's engines in a network of their own (the privileged way, an unprivileged user's way, and the
fallback with its one warning where the system allows neither), and the match's work folder removed
however its process ends. Real engines in real games; the kernel's own socket tables."""
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from marlkit.envs.doom import DoomCoopEnv
from marlkit.envs.doom import match as match_module
from test_doom import SHORT, alive, gone_within, no_work_folder_left, process_group, work_folders  # noqa: F401


def engines_of(env: DoomCoopEnv) -> list[int]:
    return [p for worker in env.match.pids() for p in process_group(worker) if p != worker]


def netns(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def udp_table(pid: int) -> dict[str, tuple[str, int]]:
    """The UDP sockets of the network ``pid`` is in: inode -> (local address, port)."""
    out = {}
    for table in ("udp", "udp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                raw_ip, raw_port = cols[1].split(":")
                raw = bytes.fromhex(raw_ip)   # 32-bit words, each little-endian
                ip = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
                out[cols[9]] = (str(getattr(ip, "ipv4_mapped", None) or ip), int(raw_port, 16))
    return out


def socket_inodes(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def interfaces(pid: int) -> list[str]:
    with open(f"/proc/{pid}/net/dev") as f:
        return [row.split(":")[0].strip() for row in f.read().splitlines()[2:]]


def play(env: DoomCoopEnv, steps: int = 5) -> None:
    env.reset(seed=0)
    for _ in range(steps):
        env.step({a: 1 for a in env.agents})


@pytest.mark.slow
def test_a_matchs_engines_are_out_of_reach_of_the_machines_network():
    """The engines bind every interface of the network they are in, which is the match's own:
    loopback alone. The machine's tables do not hold their sockets, and a packet sent to the host's
    port from this machine reaches nothing; two matches do not share a network either."""
    envs = [DoomCoopEnv(players=2, **SHORT) for _ in range(2)]
    try:
        here, spaces = udp_table(os.getpid()), []
        for env in envs:
            play(env)
            engines = engines_of(env)
            assert len(engines) == 2
            [space] = {netns(p) for p in engines}
            assert space != netns(os.getpid()) and interfaces(engines[0]) == ["lo"]
            spaces.append(space)
            inside = udp_table(engines[0])
            mine = set().union(*(socket_inodes(p) for p in engines))
            assert ("0.0.0.0", env.match.current_port) in [inside[i] for i in mine & set(inside)]
            assert not mine & set(here) and env.match.current_port not in {port for _, port in here.values()}
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.settimeout(5)
                probe.connect(("127.0.0.1", env.match.current_port))
                probe.send(b"\x00")
                with pytest.raises(ConnectionRefusedError):
                    probe.recv(64)
            assert env.match.isolated
        assert spaces[0] != spaces[1]
    finally:
        for env in envs:
            env.close()


SCRIPT = textwrap.dedent("""
    import json, logging, os, sys
    from marlkit.envs.doom import DoomCoopEnv

    def engines_of(workers):
        out = []
        for p in map(int, filter(str.isdigit, os.listdir("/proc"))):
            try:
                if p not in workers and os.getpgid(p) in workers:
                    out.append(p)
            except OSError:
                pass
        return out

    def netns(pid):
        return os.stat(f"/proc/{pid}/ns/net").st_ino

    def udp(pid):
        rows = [r.split() for r in open(f"/proc/{pid}/net/udp").read().splitlines()[1:]]
        return [(r[1], int(r[1].split(":")[1], 16)) for r in rows]

    if __name__ == "__main__":
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        envs = [DoomCoopEnv(players=2, episode_timeout=40, frame_skip=2) for _ in range(2)]
        try:
            report = []
            for env in envs:
                env.reset(seed=0)
                env.step({a: 1 for a in env.agents})
                engines = engines_of(env.match.pids())
                report.append({"isolated": env.match.isolated, "port": env.match.current_port,
                               "engines_here": [netns(p) == netns("self") for p in engines],
                               "bound_here": [a for a, port in udp(os.getpid()) if port == env.match.current_port]})
            print(json.dumps({"matches": report}))
        finally:
            for env in envs:
                env.close()
""")


def _run_script(prefix: list[str], tmp: str, timeout: float = 120) -> tuple[dict, str]:
    script = os.path.join(tmp, "match.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    out = subprocess.run([*prefix, sys.executable, script], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "TMPDIR": tmp}, cwd=tmp)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.fixture
def shared_tmp():
    """A temp directory every user can write to (removed with all it holds)."""
    path = tempfile.mkdtemp(prefix="marlkit-test-")
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path)


def _without_sys_admin() -> list[str]:
    """A command prefix that takes away the right to make namespaces directly (CAP_SYS_ADMIN), as
    an ordinary user has it; user namespaces need no right."""
    probe = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", "--"]
    if not shutil.which("setpriv") or \
            subprocess.run([*probe, "unshare", "-rn", "true"], capture_output=True).returncode:
        pytest.skip("setpriv, or user namespaces, are not available here")
    return probe


@pytest.mark.slow
def test_a_process_without_the_right_to_make_a_network_gets_one_per_match_too(shared_tmp):
    """Without CAP_SYS_ADMIN (an ordinary user's case), the keeper makes the match's network in a
    user namespace of its own, and the engines join both."""
    report, stderr = _run_script(_without_sys_admin(), shared_tmp)
    for m in report["matches"]:
        assert m["isolated"] and m["engines_here"] == [False, False] and m["bound_here"] == []
    assert "every interface" not in stderr
    assert not [e for e in os.listdir(shared_tmp) if e.startswith(match_module.WORK_PREFIX)]


def _no_namespaces_allowed() -> list[str]:
    """A command prefix under which the system refuses new namespaces: the limits of a user
    namespace of its own set to 0 (the machine's own limits stay as they are)."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "-r", "true"], capture_output=True).returncode:
        pytest.skip("user namespaces are not available here to simulate a system that refuses them")
    return ["unshare", "-r", "sh", "-c", "echo 0 > /proc/sys/user/max_net_namespaces && "
            "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\"", "sh"]


@pytest.mark.slow
def test_where_the_system_refuses_a_network_the_matches_share_the_machines_with_one_warning(shared_tmp):
    """The documented fallback: the host engine listens on every interface of the machine's
    network, the run goes on, and one warning (for both matches) says so and why."""
    report, stderr = _run_script(_no_namespaces_allowed(), shared_tmp)
    for m in report["matches"]:
        assert not m["isolated"] and m["engines_here"] == [True, True]
        assert [a.split(":")[0] for a in m["bound_here"]] == ["00000000"]   # 0.0.0.0
    warnings = [line for line in stderr.splitlines() if "every interface" in line]
    assert len(warnings) == 1, stderr
    assert "No space left on device" in warnings[0] and "firewall" in warnings[0]


OWNER = textwrap.dedent("""
    import sys, time
    from marlkit.envs.doom import DoomCoopEnv

    if __name__ == "__main__":
        env = DoomCoopEnv(players=2, episode_timeout=40, frame_skip=2)
        env.reset(seed=0)
        print(env.match.work_dir, env.match.keeper[0], *env.match.pids(), flush=True)
        time.sleep(600)
""")


def _start_owner(tmp_path) -> tuple[subprocess.Popen, str, int, list[int]]:
    """A process that holds a running match and never closes it; its work folder, keeper and
    player workers."""
    (tmp_path / "owner.py").write_text(OWNER)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "owner.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=tmp_path)
    work_dir, keeper, *workers = proc.stdout.readline().split()
    assert os.path.isdir(work_dir), "the owner did not start its match"
    return proc, work_dir, int(keeper), [int(w) for w in workers]


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.communicate(timeout=30)


def _gone_within(path: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not os.path.exists(path)


def test_the_work_folder_of_a_process_killed_with_sigkill_goes_with_it(tmp_path):
    proc, work_dir, keeper, workers = _start_owner(tmp_path)
    try:
        match_processes = [keeper, *(p for w in workers for p in process_group(w))]
        assert len(match_processes) == 5
        _kill(proc)
        assert _gone_within(work_dir, 6), f"{work_dir} outlived its process"
        assert gone_within(match_processes, 5)
    finally:
        if proc.poll() is None:
            _kill(proc)


@pytest.mark.slow
def test_a_folder_whose_process_and_keeper_were_both_killed_goes_at_the_next_start(tmp_path):
    proc, work_dir, keeper, workers = _start_owner(tmp_path)
    try:
        match_processes = [p for w in workers for p in process_group(w)]
        os.kill(keeper, signal.SIGKILL)
        _kill(proc)
        assert gone_within(match_processes, 5)
        assert os.path.isdir(work_dir)   # nothing of the match is left to remove it
        env = DoomCoopEnv(players=2, **SHORT)
        try:
            assert not os.path.exists(work_dir)
            assert os.path.isdir(env.match.work_dir)   # the folder of a live process stays
        finally:
            env.close()
    finally:
        if proc.poll() is None:
            _kill(proc)
        shutil.rmtree(work_dir, ignore_errors=True)


def test_a_start_removes_the_folders_of_processes_gone_and_keeps_those_of_processes_alive(tmp_path, monkeypatch):
    """A folder is named after its process by pid and start time: a pid that a later process took
    over does not keep a dead process's folder."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    me, started = os.getpid(), match_module._started(os.getpid())
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        names = {"mine": f"marlkit-doom-{me}-{started}-abc", "reused": f"marlkit-doom-{me}-{started - 1}-abc",
                 "alive": f"marlkit-doom-{sleeper.pid}-{match_module._started(sleeper.pid)}-abc",
                 "gone": f"marlkit-doom-{2 ** 22 + 1}-5-abc", "other": "marlkit-doom-notours"}
        for name in names.values():
            (tmp_path / name / "player_0").mkdir(parents=True)
        match_module.sweep_work_folders()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([names["mine"], names["alive"], names["other"]])
    finally:
        sleeper.kill()
        sleeper.wait()
