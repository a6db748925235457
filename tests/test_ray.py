"""``runner.vectorize: ray`` on a real multi-node Ray cluster on this machine: a head with no CPUs
and worker nodes of one CPU each, every node and the driver bound to 127.0.0.1. Env workers land
on several nodes, step like in-process envs, train identically to worker processes, survive a lost
node, stop with a named error where no node has room, and leave no game process behind."""
import contextlib
import ipaddress
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")
from ray._private import ray_constants  # noqa: E402

import marlkit
from marlkit.config import ConfigError
from marlkit.envs.core import EnvWorkerError
from marlkit.envs.ray_cluster import LOOPBACK, cmdline, loopback_cluster
from marlkit.envs.vector.ray import RayVectorEnv
from marlkit.envs.vector import OPEN_VECTOR_ENVS, EpisodeStatistics, SyncVectorEnv
from test_doom_cleanup import descendants, is_engine
from test_doom import gone_within, work_folders
from test_vector import fns, trajectory
from forked_cli import run_marlkit

TESTS = str(Path(__file__).parent)


def _nodes_alive() -> list[dict]:
    return [n for n in ray.nodes() if n["Alive"]]


@pytest.fixture(scope="module")
def cluster():
    with pytest.MonkeyPatch.context() as mp:
        # the nodes' workers import the toy envs of this folder, as the test process does
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), TESTS) if p))
        with loopback_cluster(nodes=2, cpus_per_node=1) as c:
            yield c


def _listening(pids) -> set[str]:
    """Local addresses of the TCP sockets these processes listen on (``/proc``: socket inodes of
    their fds against the LISTEN rows of the kernel's tables)."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    raw = bytes.fromhex(cols[1].split(":")[0])   # 32-bit words, each little-endian
                    ip = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
                    out.add(str(getattr(ip, "ipv4_mapped", None) or ip))
    return out


@pytest.mark.slow
def test_nodes_and_their_servers_listen_on_loopback_only(cluster):
    nodes = _nodes_alive()
    assert len(nodes) == 3 and {n["NodeManagerAddress"] for n in nodes} == {LOOPBACK}
    addresses = _listening(descendants(os.getpid()) | {os.getpid()})
    assert addresses == {LOOPBACK}, addresses


def test_env_workers_land_on_two_nodes_and_step_like_in_process_envs(cluster):
    expected = trajectory(EpisodeStatistics(SyncVectorEnv(fns(5, length=7))))
    venv = EpisodeStatistics(RayVectorEnv(fns(5, length=7), num_workers=2))
    try:
        assert len({node for node, _, _ in venv.venv.nodes}) == 2
        got = trajectory(venv)
        assert len(got) == len(expected)
        for a, b in zip(expected, got):
            np.testing.assert_array_equal(a, b)
        # one batched call per actor per step: the actions of all its envs go out, the arrays come back
        assert venv.venv.bytes_sent == 40 * 5 * 3 * 8
    finally:
        venv.close()
    assert not any(isinstance(v, RayVectorEnv) for v in OPEN_VECTOR_ENVS)


def _weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "latest.pt", weights_only=False)["groups"]["agents"]["modules"]


@pytest.mark.slow
@pytest.mark.exact_transport
def test_training_on_the_cluster_is_identical_to_worker_processes_and_resumes_across_modes(cluster, tiny):
    """The driver acts for the Ray actors, the subprocess workers for themselves: with the acting
    blocks of ``runner.act_batch`` they act on the same batches, and train alike bit for bit. (That
    the blocks of act_batch make training independent of how the envs are split, under each CPU
    capability's kernels, is test_vector's exact test of resuming with another worker count.)"""
    settings = {**tiny, "runner.parallels": 4, "runner.horizon": 25, "runner.workers": 2,
                "runner.save_interval": 300, "runner.act_batch": 2}

    def train(vectorize, total, **extra):
        return marlkit.run(agent="MAPPO", env="mpe_spread", seed=5,
                           **{**settings, "runner.vectorize": vectorize, "runner.total_steps": total, **extra})

    sub, on_ray = train("subprocess", 600), train("ray", 600)
    half = train("ray", 300)
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 600, "runner.vectorize": "subprocess"})
    for run in (on_ray, resumed):
        assert run.steps == sub.steps == 600 and run.episode_returns == sub.episode_returns
        for key, value in sub.metrics.items():
            if not key.startswith("perf/"):
                assert run.metrics[key] == value, key
        a, b = _weights(sub.run_dir), _weights(run.run_dir)
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_self_play_on_the_cluster_plays_the_matches_of_worker_processes(cluster, tiny):
    """The frozen side acts with its snapshot's weights wherever the envs step: on Ray's actors (the
    driver acts for them) as in worker processes that act themselves, the same matches and ratings."""
    settings = {**tiny, "runner.parallels": 2, "runner.workers": 2, "runner.horizon": 16, "runner.total_steps": 256,
                "runner.act_batch": 1, "self_play.save_steps": 64, "self_play.swap_steps": 32,
                "self_play.team_change": 128, "self_play.window": 2, "agents.MAPPO.epochs": 1}
    sub = marlkit.run(agent="MAPPO", env="connect_four", seed=3,
                      **{**settings, "runner.vectorize": "subprocess", "runner.act_in_workers": True})
    on_ray = marlkit.run(agent="MAPPO", env="connect_four", seed=3, **{**settings, "runner.vectorize": "ray"})
    assert on_ray.self_play["matches"] == sub.self_play["matches"] > 0
    assert on_ray.self_play["elo_curve"] == sub.self_play["elo_curve"]


def _engines_of(pids) -> set[int]:
    return {p for pid in pids for p in descendants(pid) if is_engine(p)}


@pytest.mark.slow
def test_doom_matches_on_the_cluster_die_with_their_actors(cluster):
    from dataclasses import replace

    from marlkit.config import resolve
    from marlkit.envs.factory import make_env_vector
    cfg = resolve("MAPPO", "doom_coop")
    env_cfg = replace(cfg.env, players=2, resize=[30, 40], episode_timeout=40, frame_skip=2)
    runner = replace(cfg.runner, vectorize="ray", workers=2, parallels=2)
    venv = make_env_vector(env_cfg, runner)
    try:
        assert len({node for node, _, _ in venv.venv.nodes}) == 2
        engines = [_engines_of([pid]) for _, _, pid in venv.venv.nodes]
        assert [len(e) for e in engines] == [2, 2], engines   # one match of 2 players per actor, on its node
        obs = venv.reset(seed=3)
        assert obs.obs["agents"].dtype == np.uint8
        rng = np.random.default_rng(0)
        n_actions = venv.spec.groups["agents"].action_space.n
        for _ in range(5):
            res = venv.step({"agents": rng.integers(0, n_actions, (2, 2))})
        assert res.next.obs["agents"].dtype == np.uint8 and res.next.obs["agents"].shape[:2] == (2, 2)
        killed = venv.venv.nodes[0][2]
        assert [pid for pid, _ in work_folders().values()].count(killed) == 1
        ray.kill(venv.venv.actors[0], no_restart=True)
        assert gone_within(sorted(engines[0]), 15), "the games of a killed actor outlived it"
        assert all(os.path.exists(f"/proc/{p}") for p in engines[1])
        deadline = time.monotonic() + 10   # its match's work folder too (Ray kills an actor with SIGKILL)
        while killed in [pid for pid, _ in work_folders().values()] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert killed not in [pid for pid, _ in work_folders().values()], "a killed actor's work folder outlived it"
    finally:
        venv.close()
    assert gone_within(sorted(engines[1]), 15), "games outlived close()"


def _cluster_node(cluster, node_id: str):
    return next(n for n in cluster.worker_nodes if n.node_id == node_id)


@pytest.mark.slow
def test_a_lost_node_is_replaced_then_a_loss_without_room_stops_with_the_node_named(cluster):
    spare = cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
    cluster.wait_for_nodes()
    venv = EpisodeStatistics(RayVectorEnv(fns(4, length=50), num_workers=2, timeout=30))
    try:
        venv.reset(seed=1)
        actions = {"agents": np.zeros((4, 3), np.int64)}
        for _ in range(3):
            before = venv.step(actions)
        lost_node = venv.venv.nodes[0][0]
        cluster.remove_node(_cluster_node(cluster, lost_node))
        res = venv.step(actions)
        assert venv.restarts == 1 and venv.venv.nodes[0][0] not in (lost_node, venv.venv.nodes[1][0])
        np.testing.assert_array_equal(res.lost, [True, True, False, False])   # the runner learns nothing of it
        # the lost envs' episodes end truncated at the last observation seen, with no reward and no
        # episode report; fresh episodes follow; the other actor's envs went on
        np.testing.assert_array_equal(res.episode_end, [True, True, False, False])
        assert res.truncated["agents"][:2].all() and not res.terminated["agents"][:2].any()
        assert (res.reward["agents"][:2] == 0).all() and not any("episode" in i for i in res.infos)
        np.testing.assert_array_equal(res.final.obs["agents"][:2], before.next.obs["agents"][:2])
        for _ in range(3):
            res = venv.step(actions)
        assert not res.episode_end.any()
        # no room left for a second loss: one line naming the node, well within a minute
        lost_node = venv.venv.nodes[1][0]
        cluster.remove_node(_cluster_node(cluster, lost_node))
        began = time.monotonic()
        with pytest.raises(EnvWorkerError) as err:
            for _ in range(3):
                venv.step(actions)
        assert time.monotonic() - began < 60
        message = str(err.value)
        assert lost_node[:12] in message and "no live node has 1 free CPU" in message and "--resume" in message
    finally:
        venv.close()
        for _ in range(3 - len(cluster.worker_nodes)):   # the two worker nodes the other tests expect
            cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
        cluster.wait_for_nodes()
        del spare


def _marlkit(*args, env=None, timeout=60):
    """A marlkit process; RAY_ADDRESS only where ``env`` gives it."""
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **(env or {})}
    return run_marlkit(args, env, timeout=timeout)


@pytest.mark.slow
def test_a_run_without_an_address_starts_its_own_ray_beside_a_running_cluster(cluster, tmp_path):
    """ray.init() with no address would join the cluster last started on this machine."""
    jobs, nodes = len(ray._private.state.jobs()), len(_nodes_alive())
    out = _marlkit("--env", "mpe_spread", "--set", "runner.vectorize=ray", "runner.workers=1",
                   "runner.parallels=2", "runner.total_steps=100", "logger=none", "runner.progress=false",
                   f"runner.run_root={tmp_path}", timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(ray._private.state.jobs()) == jobs and len(_nodes_alive()) == nodes


@pytest.mark.slow
@pytest.mark.parametrize("how", ["RAY_ADDRESS", "runner.ray_address"])
def test_a_run_given_a_cluster_joins_it_and_leaves_it_running(cluster, tmp_path, how):
    """The cluster's address from the environment (ray_address null) or from the setting: the run
    is one more job of that cluster, its envs on the cluster's nodes, and the nodes live on."""
    jobs, nodes = len(ray._private.state.jobs()), len(_nodes_alive())
    given = {"env": {"RAY_ADDRESS": cluster.address}} if how == "RAY_ADDRESS" else {}
    setting = [] if how == "RAY_ADDRESS" else [f"runner.ray_address={cluster.address}"]
    out = _marlkit("--env", "mpe_spread", "--set", "runner.vectorize=ray", "runner.workers=2",
                   "runner.parallels=2", "runner.total_steps=100", "logger=none", "runner.progress=false",
                   f"runner.run_root={tmp_path}", *setting, timeout=120, **given)
    assert out.returncode == 0, out.stderr
    assert len(ray._private.state.jobs()) == jobs + 1 and len(_nodes_alive()) == nodes


@pytest.mark.slow
def test_training_survives_a_lost_node_and_logs_the_restart(cluster, tiny):
    """A node is removed while a run trains on the cluster: its envs restart on a spare node,
    the run finishes its steps, and the restart is in its metrics."""
    import threading
    spare = cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
    cluster.wait_for_nodes()
    removed = []

    def remove_a_node_mid_run():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            live = [v for v in list(OPEN_VECTOR_ENVS) if isinstance(v, RayVectorEnv) and v.bytes_sent > 20_000]
            if live:
                node = live[0].nodes[0][0]
                cluster.remove_node(_cluster_node(cluster, node))
                removed.append(node)
                return
            time.sleep(0.05)

    remover = threading.Thread(target=remove_a_node_mid_run, daemon=True)
    remover.start()
    try:
        result = marlkit.run(agent="MAPPO", env="mpe_spread", seed=2, **{
            **tiny, "runner.vectorize": "ray", "runner.workers": 2, "runner.parallels": 4, "runner.horizon": 25,
            "runner.total_steps": 4000, "runner.log_interval": 100})
        remover.join(5)
        assert removed, "the run ended before a node could be removed"
        assert result.steps == 4000 and result.metrics["env/worker_restarts"] == 1
    finally:
        for _ in range(3 - len(cluster.worker_nodes)):
            cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
        cluster.wait_for_nodes()
        del spare


@pytest.mark.slow
def test_a_bad_ray_address_fails_at_once_with_one_line(tmp_path):
    began = time.monotonic()
    out = _marlkit("--env", "mpe_spread", "--set", "runner.vectorize=ray",
                   "runner.ray_address=127.0.0.1:1", f"runner.run_root={tmp_path}")
    assert time.monotonic() - began < 30
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "runner.ray_address" in lines[0] and "127.0.0.1:1" in lines[0] \
        and "ray start --head" in lines[0], out.stderr
    assert not any(tmp_path.iterdir())


def test_without_ray_the_message_names_the_install_command(tmp_path):
    # a Python where `import ray` fails as it does where ray is not installed
    blocker = tmp_path / "noray"
    blocker.mkdir()
    (blocker / "ray.py").write_text("raise ImportError('No module named ray')\n")
    out = _marlkit("--env", "mpe_spread", "--set", "runner.vectorize=ray",
                   f"runner.run_root={tmp_path / 'runs'}",
                   env={"PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])})
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install ray==2.60.0" in lines[0] and "runner.vectorize" in lines[0], out.stderr


@pytest.mark.slow
def test_more_env_actors_than_the_cluster_holds_are_refused_at_once(cluster, tmp_path):
    """doom_coop's YAML asks for 4 workers, which a cluster of 2 or 3 CPUs cannot hold: Ray would
    leave the actors that do not fit pending until runner.worker_start_timeout (2 minutes) ran out."""
    cpus = int(ray.cluster_resources()["CPU"])
    assert cpus < 4
    began = time.monotonic()
    out = _marlkit("--env", "doom_coop", "--set", "runner.vectorize=ray",
                   f"runner.ray_address={cluster.address}", f"runner.run_root={tmp_path}", timeout=120)
    assert time.monotonic() - began < 60
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0] == (f"marlkit: error: runner.workers: 4 env actors of runner.ray_cpus_per_worker=1 CPU need 4 "
                        f"CPUs, but the Ray cluster has {cpus}; set runner.workers={cpus} (or null: as many as the "
                        f"cluster holds), share CPUs with runner.ray_cpus_per_worker={cpus / 4:g}, or add nodes "
                        "(ray start --address=<head>)")
    assert not any(tmp_path.iterdir())
    with pytest.raises(ConfigError, match=rf"runner.ray_cpus_per_worker: an env actor reserves 4 CPU, but the Ray "
                                          rf"cluster has {cpus}; lower runner.ray_cpus_per_worker or add a node"):
        RayVectorEnv(fns(2), cpus_per_worker=4)


@contextlib.contextmanager
def _cluster_apart(nodes: int, cpus_per_node: float):
    """A cluster on loopback that this process does not join (it may be joined to ``cluster``)."""
    from ray.cluster_utils import Cluster

    from marlkit.envs.ray_cluster import loopback_node_ip
    with loopback_node_ip():
        apart = Cluster(initialize_head=True, connect=False,
                        head_node_args={"num_cpus": 0, "node_ip_address": LOOPBACK, "include_dashboard": False})
        try:
            for _ in range(nodes):
                apart.add_node(num_cpus=cpus_per_node, node_ip_address=LOOPBACK)
        except BaseException:
            apart.shutdown()
            raise
    try:
        yield apart
    finally:
        apart.shutdown()


@contextlib.contextmanager
def _try_out(nodes: int, cpus_per_node: float, **env):
    """``python -m marlkit.envs.ray_cluster``, the one-machine try-out of docs/cluster.md, with
    ``env`` set: (its process, its address); stopped with Ctrl+C."""
    proc = subprocess.Popen([sys.executable, "-m", "marlkit.envs.ray_cluster", "--nodes", str(nodes),
                             "--cpus-per-node", str(cpus_per_node)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **env})
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline() if ready else ""
        assert "runner.ray_address=" in line and "Ctrl+C stops it" in line, \
            line + (proc.stderr.read() if not ready else "")
        yield proc, line.rsplit("runner.ray_address=", 1)[1].split(";")[0]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.fixture(scope="module")
def token_head():
    """A head that requires an auth token (RAY_AUTH_MODE=token)."""
    with _try_out(0, 0, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32)) as (_, address):
        yield address


@pytest.mark.slow
@pytest.mark.parametrize("auth,why", [
    ({}, "needs its auth token, and this process sent none (RAY_AUTH_MODE is not token)"),
    ({"RAY_AUTH_MODE": "token"},
     "needs its auth token, and this process has none (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)"),
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}, "refused the auth token that this process sent")])
def test_a_driver_without_the_clusters_token_is_told_so_at_once_in_one_line(token_head, tmp_path, auth, why):
    """Ray itself retries for 20 s with a warning a second, then says only that it cannot connect."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(auth, HOME=str(tmp_path))   # no ~/.ray/auth_token
    began = time.monotonic()
    out = run_marlkit(["--env", "mpe_spread", "--set", "runner.vectorize=ray", f"runner.ray_address={token_head}",
                       f"runner.run_root={tmp_path / 'runs'}"], env, timeout=120)
    assert time.monotonic() - began < 15
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"marlkit: error: runner.ray_address: the Ray cluster at {token_head} {why}; set RAY_AUTH_MODE=token and "
        "RAY_AUTH_TOKEN to the cluster's token (`ray get-auth-token` on its head prints it)"], out.stderr
    assert not (tmp_path / "runs").exists()


def _env_actors_on(node) -> int:
    raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    return sum(cmdline(p).startswith("ray::EnvHost") for p in descendants(raylet))


@pytest.fixture(scope="module")
def apart():
    """A cluster of worker nodes of 2 CPUs that this process does not join, for the trials below:
    each starts with three nodes alive (the one a trial before took away is replaced)."""
    with _cluster_apart(3, 2) as cluster:
        yield cluster


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(2))
def test_a_node_lost_without_a_word_is_survived_and_ray_keeps_off_the_console(tmp_path, trial, apart):
    """Three nodes of 2 CPUs, 4 env actors; the node with the most actors dies (its processes
    SIGKILLed). Until Ray has missed its heartbeats it lists the node as alive, with the dead
    actors' CPUs free: a replacement placed there died with it and stopped the run (one try in
    three). Ray's report of the dead node (the last lines of its log, [state-dump] ...) goes to a
    log file, not to the console."""
    from marlkit.envs.ray_cluster import loopback_node_ip
    with loopback_node_ip():
        for _ in range(3 - len(apart.worker_nodes)):
            apart.add_node(num_cpus=2, node_ip_address=LOOPBACK)   # returns once the node is alive
    root = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-m", "marlkit", "--env", "mpe_spread", "--seed", str(trial), "--set",
                             "runner.vectorize=ray", "runner.workers=4", "runner.parallels=4", "runner.horizon=25",
                             "runner.total_steps=4000", "logger=console", "runner.log_interval=1000",
                             "runner.progress=false", f"runner.ray_address={apart.address}",
                             f"runner.run_root={root}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not any(root.rglob("config.yaml")) or sum(map(_env_actors_on, apart.worker_nodes)) < 4:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        time.sleep(1.0 + trial)
        victim = max(apart.worker_nodes, key=_env_actors_on)
        lost = _env_actors_on(victim)
        apart.remove_node(victim, allow_graceful=False)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    [run_dir] = {p.parent for p in root.rglob("config.yaml")}
    assert out.splitlines()[-1] == f"run directory: {run_dir}"
    assert all(line.startswith("[") and "agents/episode_return=" in line for line in out.splitlines()[:-1]), out
    assert f"env/worker_restarts={lost}" in out.splitlines()[-2] and lost >= 1
    log = run_dir / "ray.log"
    if not log.exists():   # the run directory came after Ray: its messages stayed in a temp file, named
        [line] = err.strip().splitlines()
        assert line.startswith("marlkit: Ray's messages of this run are in "), err
        log = Path(line.rsplit(" ", 1)[1])
    try:
        text = log.read_text()
        assert "Raylet is terminated. Termination is unexpected" in text and text.count("[state-dump]") >= 10
    finally:
        if log.parent != run_dir:
            log.unlink()


def test_rays_messages_are_held_then_kept_in_a_temp_file_or_the_run_directory(tmp_path, capsys):
    """Ray's messages are held until there is a run directory, where ray.log gets them; a warning
    or an error before that puts them in a temp file, named at the end; nothing else leaves a
    file behind (a run killed with SIGKILL runs no clean-up)."""
    import logging

    from marlkit.envs.ray_cluster import RayLog
    printer, handlers = ray._private.worker.print_to_stdstream, logging.getLogger("ray").handlers[:]
    before = set(Path(tempfile.gettempdir()).glob("marlkit-ray-*"))
    quiet = RayLog(ray)
    logging.getLogger("ray._private.worker").info("connected")
    assert quiet.path is None and set(Path(tempfile.gettempdir()).glob("marlkit-ray-*")) == before
    assert quiet.move_to(tmp_path) == tmp_path / "ray.log"
    quiet.close()
    assert (tmp_path / "ray.log").read_text().endswith("INFO ray._private.worker: connected\n")
    (tmp_path / "ray.log").unlink()

    log = RayLog(ray)
    try:
        logging.getLogger("ray._private.worker").info("connected")
        ray._private.worker.print_to_stdstream({"lines": ["node lost", "[state-dump] queue"], "pid": "raylet",
                                                "is_err": False}, ignore_prefix=False)
        temp = log.path
        assert temp.parent == Path(tempfile.gettempdir()) and temp.name.startswith("marlkit-ray-")
        assert temp.read_text().splitlines()[1:] == ["(raylet) node lost", "(raylet) [state-dump] queue"]
        assert log.move_to(tmp_path) == tmp_path / "ray.log" and not temp.exists()
        logging.getLogger("ray").warning("still here")
    finally:
        log.close()
    lines = (tmp_path / "ray.log").read_text().splitlines()
    assert lines[0].endswith("INFO ray._private.worker: connected") and lines[3].endswith("WARNING ray: still here")
    assert lines[1:3] == ["(raylet) node lost", "(raylet) [state-dump] queue"]
    assert ray._private.worker.print_to_stdstream is printer and logging.getLogger("ray").handlers == handlers
    assert capsys.readouterr() == ("", "")

    kept = RayLog(ray)   # a warning, and no run directory yet
    logging.getLogger("ray").warning("cannot reach a node")
    kept.close()
    try:
        assert capsys.readouterr().err == f"marlkit: Ray's messages of this run are in {kept.path}\n"
        assert kept.path.read_text().endswith("WARNING ray: cannot reach a node\n")
    finally:
        kept.path.unlink()


@pytest.mark.slow
def test_the_one_machine_try_out_listens_on_loopback_and_stops_on_ctrl_c():
    with _try_out(2, 1) as (proc, address):
        assert address.startswith(f"{LOOPBACK}:")
        started = descendants(proc.pid) | {proc.pid}
        assert _listening(started) == {LOOPBACK}
    assert gone_within(sorted(started), 30), "the try-out's Ray outlived it"
