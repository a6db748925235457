"""The env workers acting on their own envs (``runner.act_in_workers``): the same training as acting
in the runner's process, bit for bit; exact resume across both; the errors of a worker that hangs
or fails mid-rollout; the settings it refuses."""
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import marlkit
from conftest import assert_close_training, assert_same_training
from marlkit.config import ConfigError
from marlkit.envs.core import EnvWorkerError
from marlkit.envs.vector import OPEN_VECTOR_ENVS

WORKERS = {"runner.vectorize": "subprocess", "runner.workers": 2}
GRU = {"name": "gru", "hidden_sizes": [32], "rnn_hidden": 32}


def _pair(agent, env, tiny, seed=3, **settings):
    """The same run acted on here and in the workers."""
    common = {**tiny, **WORKERS, **settings}
    here = marlkit.run(agent=agent, env=env, seed=seed, **{**common, "runner.act_in_workers": False})
    there = marlkit.run(agent=agent, env=env, seed=seed, **{**common, "runner.act_in_workers": True})
    return here, there


def _weights_equal(a, b, group="agents"):
    wa = torch.load(a.run_dir / "latest.pt", weights_only=False)["groups"][group]["modules"]
    wb = torch.load(b.run_dir / "latest.pt", weights_only=False)["groups"][group]["modules"]
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=0, msg=name)


@pytest.mark.exact
@pytest.mark.parametrize("agent", ["MAPPO", "IPPO", "COMA"])
@pytest.mark.parametrize("overlap", [True, False])
def test_acting_in_the_workers_trains_as_acting_here(tiny, agent, overlap):
    """With ``runner.act_batch`` the size of a worker's block, this process acts on the blocks the
    workers act on, and the runs are the same bit for bit on any CPU."""
    here, there = _pair(agent, "mpe_spread", tiny, **{"runner.parallels": 4, "runner.horizon": 25,
                                                      "runner.total_steps": 400, "runner.overlap": overlap,
                                                      "runner.act_batch": 2})
    assert here.episode_returns and here.steps == there.steps == 400
    assert_same_training(here, there)
    _weights_equal(here, there)


def test_without_act_batch_acting_in_the_workers_trains_as_acting_here_to_rounding(tiny):
    """This process acts on 4 envs at once, the workers on 2 each: the same draws and actions, the
    log-probs to float rounding where torch's kernels round those batch sizes differently."""
    here, there = _pair("MAPPO", "mpe_spread", tiny, **{"runner.parallels": 4, "runner.horizon": 25,
                                                        "runner.total_steps": 400})
    assert here.episode_returns and here.steps == there.steps == 400
    assert_close_training(here, there)


@pytest.mark.parametrize("act_batch", [1, None])
def test_recurrent_agents_with_dying_agents_and_truncation_act_alike_in_the_workers(tiny, env_yaml, act_batch):
    """A GRU actor and critic on the scripted env (agents die and appear mid-episode, episodes are cut
    by a time limit): hidden states, masks and truncation finals come back from the workers as they
    are made here; 5 envs over 2 workers make blocks of unequal size. Acting on one env at a time
    everywhere (``act_batch: 1``), the runs are the same bit for bit; acting on 5 envs here and on 3
    and 2 in the workers, the draws, actions and episodes are the same, log-probs and values to
    float rounding (torch's kernels round the last bit of a GRU's batch of 15 rows, about 1e-7,
    otherwise than of 9 and 6)."""
    path = env_yaml("toy_envs:scripted", {"length": 7}, env={"max_episode_steps": 5})
    here, there = _pair("MAPPO", path, tiny, **{
        "runner.parallels": 5, "runner.horizon": 10, "runner.total_steps": 100, "agents.MAPPO.actor": GRU,
        "agents.MAPPO.critic": GRU, "agents.MAPPO.chunk_length": 5, "agents.MAPPO.critic_input": "state",
        "runner.act_batch": act_batch})
    assert here.episode_returns and here.steps == there.steps == 100
    assert here.episode_returns == there.episode_returns
    if act_batch:
        assert_same_training(here, there)
    else:
        assert_close_training(here, there)


@pytest.mark.exact
def test_a_group_that_does_not_learn_acts_in_the_workers_too(tiny):
    """mpe_tag with a random policy for the fleeing agent: both groups act in the workers, the
    adversaries learn, and the run is the one acted here."""
    here, there = _pair("MAPPO", "mpe_tag", tiny, **{"runner.parallels": 4, "runner.horizon": 25,
                                                     "runner.total_steps": 300, "groups.agent.agent": "random",
                                                     "runner.act_batch": 2})
    assert_same_training(here, there, group="adversary")
    _weights_equal(here, there, group="adversary")


@pytest.mark.slow
@pytest.mark.exact
def test_a_run_resumes_exactly_from_workers_acting_to_this_process_acting_and_back(tiny):
    """Saved with the workers acting (and the next rollout in flight), resumed with this process
    acting, then with 3 workers acting: the run ends where an uninterrupted one does (every env
    acted on alone, ``act_batch: 1``, wherever it is)."""
    common = {**tiny, **WORKERS, "runner.parallels": 4, "runner.horizon": 25, "runner.save_interval": 300,
              "runner.act_batch": 1}
    full = marlkit.run(agent="MAPPO", env="mpe_spread", seed=4, **{**common, "runner.total_steps": 900})
    half = marlkit.run(agent="MAPPO", env="mpe_spread", seed=4, **{**common, "runner.total_steps": 300})
    state = pickle.loads(torch.load(half.run_dir / "latest.pt", weights_only=False)["runner"])
    assert state["pending"]["agents"].rollout.full
    marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 600, "runner.act_in_workers": False})
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 900, "runner.workers": 3})
    assert resumed.steps == 900
    assert_same_training(full, resumed)
    _weights_equal(full, resumed)


@pytest.mark.slow
def test_a_worker_whose_env_hangs_mid_rollout_is_an_error_within_the_timeout(tiny, env_yaml):
    path = env_yaml("toy_envs:crashing", {"mode": "hang", "at": 7})
    start = time.monotonic()
    with pytest.raises(EnvWorkerError, match=r"env \d \(worker of envs \d-\d, pid \d+\) did not answer within 2 s "
                                             r"while collecting a rollout \(runner.worker_timeout\)"):
        marlkit.run(agent="MAPPO", env=path, **{**tiny, **WORKERS, "runner.parallels": 4,
                                                "runner.worker_timeout": 2, "runner.total_steps": 400})
    assert time.monotonic() - start < 20
    assert not [v for v in OPEN_VECTOR_ENVS if not v.closed]


@pytest.mark.slow
def test_a_slow_rollout_that_keeps_stepping_is_not_a_timeout(tiny, env_yaml):
    """The timeout is per env step, not per rollout: 20 steps of 0.15 s each take 3 s against a
    timeout of 1 s."""
    path = env_yaml("toy_envs:slow", {"seconds": 0.15, "length": 50})
    run = marlkit.run(agent="MAPPO", env=path, **{**tiny, **WORKERS, "runner.parallels": 2, "runner.horizon": 20,
                                                  "runner.worker_timeout": 1, "runner.total_steps": 40})
    assert run.steps == 40


def test_an_env_error_in_a_worker_names_the_env(tiny, env_yaml):
    path = env_yaml("toy_envs:broken", {"how": "missing_obs", "break_at": 4})
    with pytest.raises(EnvWorkerError, match=r"env \d raised while collecting a rollout: EnvAPIError: .*agent_1") as info:
        marlkit.run(agent="MAPPO", env=path, **{**tiny, **WORKERS, "runner.parallels": 4, "runner.total_steps": 400})
    # it broke in the first rollout, before the run had a directory: its traceback went to a temp file
    [note] = [n for n in info.value.__notes__ if "the worker's traceback is in " in n]
    where = Path(note.rsplit("the worker's traceback is in ", 1)[1])
    assert "in _observe" in where.read_text()
    where.unlink()


def test_acting_in_workers_without_worker_processes_is_refused_naming_the_fix(tiny):
    with pytest.raises(ConfigError, match=r"runner.act_in_workers: true needs env worker processes.*"
                                          r"runner.vectorize: sync.*set runner.vectorize: subprocess, or "
                                          r"runner.act_in_workers: false"):
        marlkit.run(agent="MAPPO", env="mpe_spread", **{**tiny, "runner.vectorize": "sync",
                                                         "runner.act_in_workers": True})
    from marlkit.config import RunnerConfig
    assert RunnerConfig(vectorize="subprocess").acts_in_workers()
    assert RunnerConfig(vectorize="auto", parallels=4).acts_in_workers()
    assert not RunnerConfig(vectorize="auto", parallels=1).acts_in_workers()
    assert not RunnerConfig(vectorize="ray").acts_in_workers()
    assert not RunnerConfig(vectorize="subprocess", act_in_workers=False).acts_in_workers()


def test_the_workers_act_on_the_cpu_whatever_device_the_update_runs_on():
    """The snapshot an env worker gets is on the CPU, with the agent's weights, so a run whose update
    runs on a GPU acts in its CPU workers (the GPU half runs in tests/test_device.py where there is one)."""
    from marlkit.api import build_config
    from marlkit.envs.pettingzoo import PettingZooEnv
    from mpe2 import simple_spread_v3
    cfg = build_config("MAPPO", "mpe_spread", device="cuda")
    assert cfg.runner.acts_in_workers()
    env = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25))
    agent = __import__("marlkit.registry", fromlist=["get_agent"]).get_agent("MAPPO")(
        env.groups["agents"], env.spec, build_config("MAPPO", "mpe_spread").agents["MAPPO"])
    twin = agent.snapshot(2, 3, device="cpu")
    assert twin.device.type == "cpu" and twin.streams.first_env == 2 and len(twin.streams.counters) == 3
    assert all(p.device.type == "cpu" and not p.requires_grad for p in twin.modules.parameters())
    assert all(torch.equal(a, b) for a, b in zip(agent.modules.parameters(), twin.modules.parameters()))
    assert twin.optimizer is None and twin.rng is None   # never learns


START_METHOD = """
import sys, threading, time
import torch
from marlkit.envs.vector import resolve_start_method
torch.set_num_threads(1)
print(resolve_start_method("auto"), resolve_start_method("spawn"))
torch.set_num_threads(2)
print(resolve_start_method("auto"))
torch.set_num_threads(1)
waiting = threading.Thread(target=time.sleep, args=(2,))
waiting.start()
print(resolve_start_method("auto"))
waiting.join()
print(resolve_start_method("auto"))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux alone")
def test_auto_start_method_forks_only_a_single_threaded_process():
    """``auto`` forks where nothing runs that a forked child would lack: no other Python thread, and
    torch on one thread (its OpenMP pool would not exist in the child). In a fresh interpreter, so
    that no thread of another test counts."""
    out = subprocess.run([sys.executable, "-c", START_METHOD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["fork", "spawn", "spawn", "spawn", "fork"]


def test_rollout_blocks_join_in_env_order():
    from marlkit.storage import Rollout, Transition
    whole = Rollout(2, 5, 2, (3,), np.float32, (4,), (), np.int64, 4)
    parts = [whole.for_envs(2), whole.for_envs(3)]
    rng = np.random.default_rng(0)
    steps = []
    for t in range(2):
        E = 5
        tr = Transition(rng.normal(size=(E, 2, 3)).astype(np.float32), rng.normal(size=(E, 4)).astype(np.float32),
                        rng.random((E, 2)) < 0.8, rng.random((E, 2, 4)) < 0.9, rng.integers(0, 4, (E, 2)),
                        rng.normal(size=(E, 2)).astype(np.float32), None, rng.normal(size=(E, 2)).astype(np.float32),
                        np.zeros((E, 2), bool), rng.random((E, 2)) < 0.3, rng.random(E) < 0.3,
                        rng.normal(size=(E, 2, 3)).astype(np.float32), rng.normal(size=(E, 4)).astype(np.float32),
                        extras={"onehot": rng.random((E, 2, 4)).astype(np.float32)})
        steps.append(tr)
        whole.add(tr)
        for part, rows in zip(parts, (slice(0, 2), slice(2, 5))):
            part.add(Transition(*[getattr(tr, f)[rows] if isinstance(getattr(tr, f), np.ndarray) else getattr(tr, f)
                                  for f in ("obs", "state", "agent_mask", "action_mask", "actions", "log_prob",
                                            "value", "reward", "terminated", "truncated", "episode_end",
                                            "final_obs", "final_state")],
                                extras={"onehot": tr.extras["onehot"][rows]}))
    joined = whole.for_envs(5)
    joined.fill_from(parts)
    assert joined.full and whole.finals
    for name, value in vars(whole).items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(getattr(joined, name), value), name
    assert np.array_equal(joined.extras["onehot"], whole.extras["onehot"])
    assert [(t, e) for t, e, *_ in joined.finals] == [(t, e) for t, e, *_ in whole.finals]
    for a, b in zip(joined.finals, whole.finals):
        assert all(np.array_equal(x, y) for x, y in zip(a[2:4], b[2:4]))
    with pytest.raises(ValueError, match="do not make one of 5 envs"):
        joined.fill_from(parts[:1])


def test_a_run_leaves_no_thread_behind_so_the_next_one_forks_its_workers(tiny):
    """Workers are forked only where no other thread runs (``runner.start_method: auto``); a thread
    left by a run (tqdm's monitor of the progress bar) would make every later run in the process
    spawn its workers instead, each importing torch again."""
    import threading
    before = set(threading.enumerate())   # other tests may have left threads of their own (wandb's)
    for progress in (True, False):
        marlkit.run(agent="MAPPO", env="mpe_spread", **{**tiny, **WORKERS, "runner.progress": progress,
                                                         "runner.total_steps": 40})
        assert set(threading.enumerate()) <= before, threading.enumerate()
