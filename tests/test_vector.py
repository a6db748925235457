"""In-process and subprocess vector envs: same trajectories, errors with env indices, no leftovers."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_close_training, assert_same_training
from marlkit.envs.core import EnvWorkerError
from marlkit.envs.pettingzoo import PettingZooConfig
from marlkit.envs.vector import EpisodeStatistics, SubprocVectorEnv, SyncVectorEnv
from marlkit.envs.factory import _EnvBuilder
import functools


def fns(n, factory="toy_envs:scripted", **kwargs):
    builder = _EnvBuilder(PettingZooConfig(factory=factory, kwargs=kwargs))
    return [functools.partial(builder, i) for i in range(n)]


def trajectory(venv, steps=40, seed=7):
    rng = np.random.default_rng(0)
    obs = venv.reset(seed=seed)
    out = [obs.obs["agents"].copy()]
    for _ in range(steps):
        res = venv.step({"agents": rng.integers(0, 3, (venv.num_envs, 3))})
        out += [res.next.obs["agents"], res.final.obs["agents"], res.reward["agents"], res.next.agent_mask["agents"],
                res.episode_end, res.terminated["agents"], res.truncated["agents"], res.next.state]
        out += [np.array([i["episode"]["return"]["agents"]]) for i in res.infos if "episode" in i]
    return out


def test_sync_and_subprocess_give_identical_trajectories():
    sync = EpisodeStatistics(SyncVectorEnv(fns(5, length=7)))
    try:
        a = trajectory(sync)
    finally:
        sync.close()
    sub = EpisodeStatistics(SubprocVectorEnv(fns(5, length=7), num_workers=2, timeout=30))
    try:
        b = trajectory(sub)
    finally:
        sub.close()
    assert len(a) == len(b) and len(a) > 300
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_jobs_go_on_from_a_restored_state_where_they_were_saved():
    """The workers' own vector envs keep the episode counters while they host jobs: a saved
    state holds them, and restoring it puts them back in the workers, beside the envs."""
    from toy_envs import TrajectoryJob
    builder = _EnvBuilder(PettingZooConfig(factory="toy_envs:scripted", kwargs={"length": 7}, exact_resume=True))
    venv = EpisodeStatistics(SubprocVectorEnv([functools.partial(builder, i) for i in range(5)], num_workers=2,
                                              timeout=30))
    try:
        venv.reset(seed=3)
        venv.install_jobs([TrajectoryJob() for _ in venv.blocks])
        venv.run_jobs([4, 4], "stepping")            # every episode is 4 steps in: returns accumulated
        saved = venv.state_dict()
        first = venv.run_jobs([10, 10], "stepping")
        venv.load_state_dict(saved)
        again = venv.run_jobs([10, 10], "stepping")
    finally:
        venv.close()
    episodes = [x for block in first for x in block if isinstance(x, tuple)]
    assert len(episodes) >= 5 and all(e["length"] == 7 for _, _, e in episodes)
    assert len(first) == len(again) == 2
    for a, b in zip(first, again):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            if isinstance(x, tuple):
                assert x == y
            else:
                np.testing.assert_array_equal(x, y)


def test_auto_vectorize_uses_a_worker_per_env_from_two_envs_on():
    from marlkit.envs.vector import make_vector_env
    builder = _EnvBuilder(PettingZooConfig(factory="toy_envs:scripted", kwargs={"length": 7}))
    for num_envs, kind in ((1, SyncVectorEnv), (2, SubprocVectorEnv)):
        venv = make_vector_env(builder, num_envs, "auto", timeout=30)
        try:
            assert type(venv.venv) is kind and venv.num_envs == num_envs
            assert venv.reset(seed=0).obs["agents"].shape[0] == num_envs
        finally:
            venv.close()


def test_auto_reset_and_final_observation():
    venv = SyncVectorEnv(fns(2, length=3))
    try:
        venv.reset(seed=0)
        for _ in range(2):
            res = venv.step({"agents": np.zeros((2, 3), np.int64)})
            assert not res.episode_end.any()
        res = venv.step({"agents": np.zeros((2, 3), np.int64)})
        assert res.episode_end.all()
        # next is the new episode's first observation (time feature 0), final the old episode's last
        assert (res.next.obs["agents"][:, 0, 1] == 0).all() and (res.final.obs["agents"][:, 0, 1] == 1.0).all()
    finally:
        venv.close()


@pytest.mark.parametrize("vectorize", ["sync", "subprocess"])
def test_episode_stats_of_each_env_arrive_with_its_episode_end(vectorize):
    make = fns(3, "toy_envs:stats", length=4)
    venv = EpisodeStatistics(SyncVectorEnv(make) if vectorize == "sync" else
                             SubprocVectorEnv(make, num_workers=2, timeout=30))
    try:
        venv.reset(seed=0)
        seen = []
        for t in range(8):
            actions = np.zeros((3, 3), np.int64)
            actions[:, 0] = (np.arange(3) + t) % 3     # env e, step t: agent_0 plays (e + t) mod 3
            res = venv.step({"agents": actions})
            for e, info in enumerate(res.infos):
                assert ("episode" in info) == bool(res.episode_end[e])
                if "episode" in info:
                    seen.append((t, e, info["episode"]["stats"]))
        # episodes of 4 steps end at t = 3 and 7 in every env; their sums: (e + 0..3) mod 3, then (e + 4..7) mod 3
        assert seen == [(t, e, {"episode": float(t // 4 + 1),
                                "agent_0_actions": float(sum((e + s) % 3 for s in range(t - 3, t + 1)))})
                        for t in (3, 7) for e in range(3)]
    finally:
        venv.close()


def test_runs_log_the_envs_episode_stats_and_keep_them_in_each_evaluation(tiny, env_yaml):
    import marlkit
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    path = env_yaml("toy_envs:stats", {"length": 5})
    result = marlkit.run(agent="MAPPO", env=path, mode="benchmark", seed=1, **{**tiny, "logger": "tensorboard"})
    # each evaluation: one 5-step episode per eval env. The random baseline plays the eval envs'
    # first episode, so the k-th evaluation sees their (k + 1)-th
    evaluations = result.evaluations
    assert result.baseline["env"]["episode"] == 1.0
    assert [row["env"]["episode"] for row in evaluations] == [float(k + 2) for k in range(len(evaluations))]
    assert all(0 <= row["env"]["agent_0_actions"] <= 2 * 5 for row in result.evaluations)
    events = EventAccumulator(str(result.run_dir))
    events.Reload()
    assert {"env/agent_0_actions", "eval/env/agent_0_actions"} <= set(events.Tags()["scalars"])


def test_dead_worker_is_reported_with_its_env_index():
    venv = SubprocVectorEnv(fns(4, factory="toy_envs:crashing", mode="exit", at=2), num_workers=2, timeout=20)
    try:
        venv.reset(seed=0)
        venv.step({"agents": np.zeros((4, 3), np.int64)})
        start = time.monotonic()
        with pytest.raises(EnvWorkerError, match=r"env 0 \(worker of envs 0-1, pid \d+\) died with exit code 3 while stepping"):
            venv.step({"agents": np.zeros((4, 3), np.int64)})
        assert time.monotonic() - start < 10
    finally:
        venv.close()
    assert all(not p.is_alive() for p in venv.procs)


def test_a_config_error_in_a_worker_reaches_the_parent_as_itself():
    from marlkit.errors import ConfigError
    with pytest.raises(ConfigError, match=r"env.factory: cannot import module 'no_such_module'") as info:
        SubprocVectorEnv(fns(2, factory="no_such_module:make"), num_workers=2, timeout=30)
    assert "worker traceback" not in str(info.value)


@pytest.mark.slow
def test_hung_worker_times_out():
    venv = SubprocVectorEnv(fns(2, factory="toy_envs:crashing", mode="hang", at=1), num_workers=2, timeout=2)
    try:
        venv.reset(seed=0)
        start = time.monotonic()
        with pytest.raises(EnvWorkerError, match=r"did not answer within 2 s while stepping"):
            venv.step({"agents": np.zeros((2, 3), np.int64)})
        assert time.monotonic() - start < 6
    finally:
        venv.close()
    assert all(not p.is_alive() for p in venv.procs)


def test_env_exception_names_the_env():
    venv = SubprocVectorEnv(fns(3, factory="toy_envs:broken", how="missing_obs", break_at=2), num_workers=3)
    try:
        venv.reset(seed=0)
        with pytest.raises(EnvWorkerError, match=r"env 0 raised while stepping:.*no observation for agent 'agent_1'"):
            for _ in range(4):
                venv.step({"agents": np.zeros((3, 3), np.int64)})
    finally:
        venv.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _wait_gone(pids, timeout=15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_workers_can_host_envs_with_child_processes_and_close_them(tmp_path):
    """A daemonic worker could not start the env's own child process; close() must end both."""
    pid_file = tmp_path / "pids"
    venv = SubprocVectorEnv(fns(2, factory="toy_envs:child_process", pid_file=str(pid_file)), num_workers=2)
    venv.reset(seed=0)
    children = [int(x) for x in pid_file.read_text().split()]
    workers = [p.pid for p in venv.procs]
    assert len(children) == 2 and all(_alive(p) for p in children + workers)
    venv.close()
    assert _wait_gone(children + workers) == []


@pytest.mark.parametrize("how", ["sigkill", "sigterm", "exception"])
def test_no_process_survives_the_parent(tmp_path, how):
    """The parent dies (SIGKILL, SIGTERM, or an exception); workers and their children go too."""
    pid_file = tmp_path / "pids"
    script = textwrap.dedent(f"""
        import sys, time, functools, numpy as np
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from marlkit.envs.pettingzoo import PettingZooConfig
        from marlkit.envs.factory import _EnvBuilder
        from marlkit.envs.vector import SubprocVectorEnv
        if __name__ == "__main__":
            b = _EnvBuilder(PettingZooConfig(factory="toy_envs:child_process", kwargs={{"pid_file": {str(pid_file)!r}}}))
            venv = SubprocVectorEnv([functools.partial(b, i) for i in range(2)], num_workers=2)
            venv.reset(seed=0)
            print(" ".join(str(p.pid) for p in venv.procs), flush=True)
            if {how!r} == "exception":
                raise RuntimeError("boom")
            while True:
                venv.step({{"agents": np.zeros((2, 3), np.int64)}})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers = [int(p) for p in proc.stdout.readline().split()]
    assert len(workers) == 2, proc.stderr.read()
    children = [int(x) for x in pid_file.read_text().split()]
    if how == "sigkill":
        proc.send_signal(signal.SIGKILL)
    elif how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert _wait_gone(workers + children) == []


def test_training_with_subprocess_workers_leaves_no_process(tiny):
    import multiprocessing

    import marlkit
    run = marlkit.run(agent="IPPO", env="mpe_spread", **{**tiny, "runner.vectorize": "subprocess", "runner.workers": 2,
                                                         "runner.parallels": 4, "runner.total_steps": 200})
    assert run.steps == 200 and np.isfinite(run.metrics["agents/policy_loss"])
    assert multiprocessing.active_children() == []


@pytest.mark.slow
def test_hung_worker_is_terminated_and_its_env_children_closed(tmp_path):
    """terminate() sends SIGTERM: the worker unwinds and closes its env, which ends the game process."""
    pid_file = tmp_path / "pids"
    builder = _EnvBuilder(PettingZooConfig(factory="toy_envs:child_process",
                                           kwargs={"pid_file": str(pid_file), "hang_at": 1}))
    venv = SubprocVectorEnv([functools.partial(builder, i) for i in range(2)], num_workers=2, timeout=2)
    venv.reset(seed=0)
    children = [int(x) for x in pid_file.read_text().split()]
    with pytest.raises(EnvWorkerError, match="did not answer within 2 s"):
        venv.step({"agents": np.zeros((2, 3), np.int64)})
    assert _wait_gone(children + [p.pid for p in venv.procs]) == []


def test_workers_hold_whole_acting_blocks():
    """``runner.act_batch: 2`` over 5 envs makes the blocks 0-1, 2-3 and 4; a worker holds whole
    ones, and there are never more workers than blocks."""
    for workers, split in ((3, [[0, 1], [2, 3], [4]]), (2, [[0, 1, 2, 3], [4]]), (4, [[0, 1], [2, 3], [4]])):
        venv = SubprocVectorEnv(fns(5, length=7), num_workers=workers, align=2)
        try:
            assert venv.indices == split
            assert venv.blocks == [(idx[0], len(idx)) for idx in split]
        finally:
            venv.close()


def _resumed_with_other_workers(tiny, act_batch):
    """A run of 600 steps on 4 workers, and one saved at 300 on 2 workers and resumed to 600 on 3."""
    import marlkit
    # env workers, so collection overlaps the update in all three runs
    common = {**tiny, "runner.parallels": 4, "runner.horizon": 25, "runner.save_interval": 300,
              "runner.vectorize": "subprocess", "runner.act_batch": act_batch}
    full = marlkit.run(agent="MAPPO", env="mpe_spread", seed=2, **{**common, "runner.total_steps": 600,
                                                                   "runner.workers": 4})
    half = marlkit.run(agent="MAPPO", env="mpe_spread", seed=2, **{**common, "runner.total_steps": 300,
                                                                   "runner.workers": 2})
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 600, "runner.workers": 3})
    return full, resumed


@pytest.mark.slow
@pytest.mark.exact
def test_resume_with_another_worker_count_is_exact_with_act_batch(tiny):
    """With ``runner.act_batch: 1`` every env is acted on alone, whichever worker holds it."""
    assert_same_training(*_resumed_with_other_workers(tiny, act_batch=1))


def test_resume_with_another_worker_count_agrees_to_rounding_without_act_batch(tiny):
    """Workers of 1, 2 and 1-2 envs act on batches of those sizes, which torch may round otherwise."""
    assert_close_training(*_resumed_with_other_workers(tiny, act_batch=None))
