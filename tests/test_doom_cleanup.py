"""No game process outlives a Doom run, checked by PID: every descendant of a real training process
(vector workers, player workers, engines) is recorded while it runs and must be gone after a normal
end, Ctrl+C, an exception in training, a player worker killed, or the training process killed, with
both ``runner.vectorize`` settings; and so must every engine's shared memory files in /dev/shm.
``--test --render`` writes one side-by-side video per episode."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import pytest

from marlkit.envs.doom.keeper import SHARED_MEMORY
from marlkit.runners.checkpoint import read_steps

from test_doom import alive, gone_within, no_work_folder_left  # noqa: F401  (autouse: no work folder left)
from forked_cli import run_marlkit

PLAYERS, ENVS = 2, 2
TINY = ["env.episode_timeout=40", "env.frame_skip=2", "env.resize=[30,40]", "env.frame_stack=2",
        f"env.players={PLAYERS}", f"runner.parallels={ENVS}", f"runner.workers={ENVS}", "runner.horizon=8",
        "runner.progress=false", "logger=none", "runner.eval_episodes=2", "runner.eval_parallels=1"]


def children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> set[int]:
    tree, out, todo = children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def is_engine(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"vizdoom" in f.read().split(b"\0")[0]
    except OSError:   # gone, even while being read
        return False


def instance_of(engine: int) -> str | None:
    """The engine's ``+viz_instance_id``: its shared memory files are named after it."""
    try:
        with open(f"/proc/{engine}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return None
    return args[args.index(b"+viz_instance_id") + 1].decode() if b"+viz_instance_id" in args[:-1] else None


class Watched:
    """A training process and every process it ever started, sampled every 50 ms."""

    def __init__(self, args: list[str], cwd: Path, session: bool = False):
        """``session``: the process leads a session, hence a process group, of its own (``setsid``)."""
        # the tests folder ahead of the caller's path, so that the marlkit under test is the one run
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                                        os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen([sys.executable, *args], cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, start_new_session=session)
        self.seen: set[int] = set()
        self.engines: set[int] = set()
        self.instances: set[str] = set()

    def sample(self) -> None:
        found = descendants(self.proc.pid)
        self.seen |= found
        new = {p for p in found if is_engine(p)} - self.engines
        self.engines |= new
        self.instances |= {i for i in map(instance_of, new) if i is not None}

    def until(self, condition, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.proc.poll() is None, f"exited early ({self.proc.returncode}): {self.proc.stderr.read()}"
            assert time.monotonic() < deadline, "timed out"
            self.sample()
            time.sleep(0.05)

    def all_engines_up(self) -> bool:
        return len(self.engines) >= ENVS * PLAYERS

    def training(self, root: Path):
        """Every match started and the run begun (config.yaml is written once the envs are up)."""
        return lambda: self.all_engines_up() and any(root.rglob("config.yaml"))

    def finish(self, timeout: float = 180) -> tuple[int, str]:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"still running after {timeout} s: {self.proc.communicate()[1][-3000:]}")
            self.sample()
            time.sleep(0.05)
        _, stderr = self.proc.communicate(timeout=30)
        return self.proc.returncode, stderr

    def assert_all_gone(self, seconds: float = 10) -> None:
        assert len(self.engines) >= ENVS * PLAYERS, f"saw engines {self.engines} of processes {self.seen}"
        left = [p for p in self.seen if alive(p)]
        assert gone_within(left, seconds), f"left running: {[p for p in left if alive(p)]}"
        assert len(self.instances) == len(self.engines), (self.instances, self.engines)
        files = [f"/dev/shm/{prefix}{i}" for i in self.instances for prefix in SHARED_MEMORY]
        deadline = time.monotonic() + seconds   # a keeper releases them as its owner's death reaches it
        while any(map(os.path.exists, files)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [f for f in files if os.path.exists(f)], "shared memory left in /dev/shm"


@pytest.fixture
def watch():
    """Starts Watched processes; whatever a failing test leaves running is killed (its engines then
    go by themselves, as test_training_process_killed shows)."""
    started: list[Watched] = []

    def start(args: list[str], cwd: Path, session: bool = False) -> Watched:
        started.append(Watched(args, cwd, session))
        return started[-1]

    yield start
    for w in started:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.communicate(timeout=30)


def train_args(root: Path, vectorize: str, total: int) -> list[str]:
    return ["-m", "marlkit", "--agent", "MAPPO", "--env", "doom_coop", "--set", *TINY,
            f"runner.vectorize={vectorize}", f"runner.run_root={root}", f"runner.total_steps={total}",
            f"runner.save_interval={total}"]


VECTORIZE = ["sync", "subprocess"]
# a Ray of the run's own (runner.ray_address null): its servers and actors are the run's descendants too
WITH_RAY = [*VECTORIZE, "ray"]


@pytest.mark.slow
@pytest.mark.parametrize("vectorize", WITH_RAY)
def test_normal_end(tmp_path, vectorize, watch):
    w = watch(train_args(tmp_path / "runs", vectorize, 64), tmp_path)
    rc, stderr = w.finish()
    assert rc == 0, stderr
    w.assert_all_gone(seconds=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]   # no _vizdoom.ini, no _vizdoom/


@pytest.mark.slow
@pytest.mark.parametrize("vectorize", WITH_RAY)
def test_ctrl_c(tmp_path, vectorize, watch):
    w = watch(train_args(tmp_path / "runs", vectorize, 10 ** 8), tmp_path)
    w.until(w.training(tmp_path / "runs"))
    time.sleep(1.0)
    w.proc.send_signal(signal.SIGINT)
    rc, stderr = w.finish()
    assert rc == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    w.assert_all_gone(seconds=2)


@pytest.mark.slow
@pytest.mark.parametrize("vectorize,sig", [("subprocess", signal.SIGTERM), ("subprocess", signal.SIGINT),
                                            ("sync", signal.SIGTERM)])
def test_a_signal_to_the_whole_process_group_is_the_users_stop(tmp_path, vectorize, sig, watch):
    """``timeout``, Slurm, systemd and a terminal signal every process of the group, marlkit's env
    workers included: the run stops at the end of its rollout, saves, says so and exits 130, and no
    process of the run is left."""
    root = tmp_path / "runs"
    w = watch(train_args(root, vectorize, 10 ** 8), tmp_path, session=True)
    w.until(w.training(root))
    time.sleep(1.0)
    os.killpg(w.proc.pid, sig)
    rc, stderr = w.finish()
    assert rc == 130, stderr
    [latest] = root.rglob("latest.pt")
    assert f"interrupted; saved {latest} (step {read_steps(latest)} of {10 ** 8})" in stderr, stderr
    assert "Traceback" not in stderr and "EnvWorkerError" not in stderr
    w.assert_all_gone(seconds=2)


RAISE_IN_UPDATE = """
import sys
import yaml
import marlkit
from marlkit.agents.on_policy import OnPolicyAgent

def update(self, *args, **kwargs):
    raise RuntimeError("a bug in training")

OnPolicyAgent.update = update
overrides = dict(kv.split("=", 1) for kv in sys.argv[1:])
marlkit.run(agent="MAPPO", env="doom_coop", **{k: yaml.safe_load(v) for k, v in overrides.items()})
"""


@pytest.mark.slow
@pytest.mark.parametrize("vectorize", VECTORIZE)
def test_exception_in_training(tmp_path, vectorize, watch):
    overrides = [*TINY, f"runner.vectorize={vectorize}", f"runner.run_root={tmp_path / 'runs'}",
                 "runner.total_steps=1000"]
    w = watch(["-c", RAISE_IN_UPDATE, *overrides], tmp_path)
    rc, stderr = w.finish()
    assert rc == 1 and "RuntimeError: a bug in training" in stderr
    w.assert_all_gone(seconds=2)


def kill_a_player(w: Watched) -> int:
    engine = min(w.engines)
    with open(f"/proc/{engine}/stat") as f:
        worker = int(f.read().rsplit(")", 1)[1].split()[1])   # the engine's parent: a player's worker
    os.kill(worker, signal.SIGKILL)
    return worker


@pytest.mark.slow
@pytest.mark.parametrize("vectorize", VECTORIZE)
def test_player_worker_killed(tmp_path, vectorize, watch):
    w = watch(train_args(tmp_path / "runs", vectorize, 10 ** 8) + ["env.restart_on_failure=false"], tmp_path)
    w.until(w.training(tmp_path / "runs"))
    time.sleep(3.0)                                  # some rollouts of 2 envs x 8 steps in
    worker = kill_a_player(w)
    start = time.monotonic()
    rc, stderr = w.finish()
    assert rc != 0 and time.monotonic() - start < 30
    assert re.search(rf"env \d: player_\d \(pid {worker}\) died with exit code -9", stderr), stderr
    w.assert_all_gone(seconds=2)
    # the rollouts done before the failure are saved, and the message says how to go on
    [latest] = (tmp_path / "runs").rglob("latest.pt")
    steps = read_steps(latest)
    assert steps > 0 and steps % 16 == 0
    assert f"the run up to step {steps} is saved in {latest}" in stderr and "marlkit --resume" in stderr


@pytest.mark.slow
def test_player_worker_killed_with_restart_the_run_goes_on(tmp_path, watch):
    """``env.restart_on_failure`` (on in doom_coop.yaml): the match restarts, the run finishes."""
    w = watch(train_args(tmp_path / "runs", "sync", 400) + ["env.restart_on_failure=true"], tmp_path)
    w.until(w.training(tmp_path / "runs"))
    first = set(w.engines)
    worker = kill_a_player(w)
    rc, stderr = w.finish()
    assert rc == 0, stderr
    assert re.search(rf"player_\d \(pid {worker}\) died with exit code -9.*restarting the match \(restart 1 of "
                     r"this env\)", stderr, re.S), stderr
    assert len(w.engines - first) == PLAYERS         # the restarted match's engines
    w.assert_all_gone(seconds=2)


@pytest.mark.slow
@pytest.mark.parametrize("vectorize", WITH_RAY)
def test_training_process_killed(tmp_path, vectorize, watch):
    w = watch(train_args(tmp_path / "runs", vectorize, 10 ** 8), tmp_path)
    w.until(w.training(tmp_path / "runs"))
    time.sleep(1.0)
    w.sample()
    w.proc.kill()
    w.proc.communicate(timeout=30)
    w.assert_all_gone(seconds=10)


@pytest.mark.slow
def test_test_render_writes_one_side_by_side_video_per_episode(tmp_path):
    root = tmp_path / "runs"
    out = subprocess.run([sys.executable, *train_args(root, "sync", 16)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    [latest] = root.rglob("latest.pt")
    out = run_marlkit(["--test", "--load", str(latest), "--render", "--set", *TINY, "runner.test_episodes=2",
                       f"runner.run_root={root}"], os.environ, tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    videos = sorted(p for p in root.rglob("episode_*") if p.suffix in (".mp4", ".gif"))
    assert [v.stem for v in videos] == ["episode_1", "episode_2"]
    for video in videos:
        frames = imageio.mimread(video)
        assert 10 <= len(frames) <= 40 // 2 + 1      # a frame per step (a gif merges repeated frames)
        frame = np.asarray(frames[0])
        assert frame.shape[:2] == (120, PLAYERS * 160)   # every player's full screen, side by side
