"""Collection beside the update (``runner.overlap``): policy lag exactly 1, exact resume with the
rollout in flight, determinism, and the settings it refuses."""
import pickle
import re
import threading
import time

import numpy as np
import pytest
import torch

import marlkit
from conftest import assert_same_training
from marlkit.agents.mappo import MAPPO
from marlkit.config import ConfigError
from marlkit.registry import register_agent

OVERLAP = {"runner.parallels": 4, "runner.horizon": 25, "runner.vectorize": "subprocess", "runner.workers": 2}


@torch.no_grad()
def _checksum(agent) -> float:
    return float(sum(p.double().sum() for p in agent.modules["actor"].parameters()))


@register_agent("MAPPO_LAG_PROBE")
class LagProbe(MAPPO):
    """MAPPO whose actions carry a checksum of the actor weights that picked them (an extra, stored
    with the rollout wherever the acting happens: here or in an env worker), and which records per
    update the checksums its rollout was acted with, and its weights after it."""

    collected_with: list = []
    updated: list = []

    def act(self, *args, **kwargs):
        out = super().act(*args, **kwargs)
        out.extras["acted_with"] = np.full(out.log_prob.shape, _checksum(self))
        return out

    def update(self, batch, progress=None):
        if not LagProbe.updated:
            LagProbe.updated.append(_checksum(self))   # the initial weights, "update -1"
        LagProbe.collected_with.append(set(batch.rollout.extras["acted_with"].ravel().tolist()))
        metrics = super().update(batch, progress)
        LagProbe.updated.append(_checksum(self))
        return metrics


@pytest.mark.parametrize("overlap, lag", [(True, 1), (False, 0)])
@pytest.mark.parametrize("where", [{"runner.act_in_workers": True}, {"runner.act_in_workers": False},
                                   {"runner.vectorize": "sync"}], ids=["workers act", "this process acts",
                                                                        "envs in this process"])
def test_acting_uses_the_weights_of_the_update_before_the_last(tiny, overlap, lag, where):
    """Rollout r is acted on with the weights after update r - 1 - lag (the initial ones before
    that): lag 1 with overlap, lag 0 when collection and update take turns, whether the env workers
    act, this process does, or the envs step in this process."""
    LagProbe.collected_with.clear()
    LagProbe.updated.clear()
    marlkit.run(agent="MAPPO_LAG_PROBE", env="mpe_spread", seed=3,
                **{**tiny, **OVERLAP, "runner.overlap": overlap, **where,
                   "runner.total_steps": 600, "agents.MAPPO_LAG_PROBE.lr": 1e-2})
    updates = 6
    assert len(LagProbe.updated) == updates + 1 and len(set(LagProbe.updated)) == updates + 1   # each one changed them
    assert len(LagProbe.collected_with) == updates
    for r in range(updates):
        assert LagProbe.collected_with[r] == {LagProbe.updated[max(r - lag, 0)]}, r



@register_agent("MAPPO_THREAD_PROBE")
class ThreadProbe(MAPPO):
    """MAPPO whose actions carry the torch thread count they were acted with (wherever acting
    runs), and which records the count of each update."""

    acted_with: list = []
    updated_with: list = []

    def act(self, *args, **kwargs):
        out = super().act(*args, **kwargs)
        out.extras["threads"] = np.full(out.log_prob.shape, torch.get_num_threads())
        return out

    def update(self, batch, progress=None):
        ThreadProbe.acted_with.append(set(batch.rollout.extras["threads"].ravel().tolist()))
        ThreadProbe.updated_with.append(torch.get_num_threads())
        return super().update(batch, progress)


THREADS = {"runner.torch_threads": 1, "runner.update_threads": 2}


@pytest.fixture
def threads_back():
    """This process's torch thread count as it was before the test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _new_thread_count() -> int:
    counts = []
    thread = threading.Thread(target=lambda: counts.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return counts[0]


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("where", [{"runner.act_in_workers": True}, {"runner.act_in_workers": False},
                                   {"runner.vectorize": "sync"}], ids=["workers act", "this process acts",
                                                                        "envs in this process"])
def test_the_update_runs_on_its_own_thread_count_and_acting_keeps_the_runners(tiny, threads_back, overlap, where):
    """``runner.update_threads`` is the count of every update, beside collection or not, while
    acting, in the workers or in this process beside the update's thread, keeps
    ``runner.torch_threads``; this process and threads started later have the acting count back
    when training ends."""
    ThreadProbe.acted_with.clear()
    ThreadProbe.updated_with.clear()
    marlkit.run(agent="MAPPO_THREAD_PROBE", env="mpe_spread", seed=3,
                **{**tiny, **OVERLAP, **where, **THREADS, "runner.overlap": overlap, "runner.total_steps": 400})
    assert ThreadProbe.updated_with == [2] * 4
    assert ThreadProbe.acted_with == [{1}] * 4
    assert torch.get_num_threads() == 1 and _new_thread_count() == 1


@register_agent("MAPPO_FAILING_UPDATE")
class FailingUpdate(MAPPO):
    def update(self, batch, progress=None):
        raise RuntimeError("the update failed")


@pytest.mark.parametrize("overlap", [True, False])
def test_a_failed_update_gives_the_acting_thread_count_back(tiny, threads_back, overlap):
    with pytest.raises(RuntimeError, match="the update failed"):
        marlkit.run(agent="MAPPO_FAILING_UPDATE", env="mpe_spread", seed=3,
                    **{**tiny, **OVERLAP, **THREADS, "runner.overlap": overlap, "runner.total_steps": 400})
    assert torch.get_num_threads() == 1 and _new_thread_count() == 1


@register_agent("MAPPO_SLOW_UPDATE")
class SlowUpdate(MAPPO):
    def update(self, batch, progress=None):
        time.sleep(0.5)   # collection of a 40-step rollout takes a fraction of this, on a busy machine too
        return super().update(batch, progress)


@register_agent("MAPPO_SLOW_ACT")
class SlowAct(MAPPO):
    def act(self, *args, **kwargs):
        time.sleep(0.01)
        return super().act(*args, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("agent, settings, hinted", [
    ("MAPPO_SLOW_UPDATE", {}, True),
    ("MAPPO_SLOW_UPDATE", {"runner.update_threads": 2}, False),   # the count is the user's already
    ("MAPPO_SLOW_ACT", {}, False),                                # collection bounds the run
], ids=["update bound", "update threads set", "collection bound"])
def test_a_run_bound_by_its_update_says_once_how_it_may_run_faster(tiny, capsys, agent, settings, hinted):
    marlkit.run(agent=agent, env="mpe_spread", seed=3,
                **{**tiny, **OVERLAP, **settings, "runner.horizon": 10, "runner.total_steps": 480,
                   "runner.log_interval": 480, "runner.eval_interval": 10**6})
    out = capsys.readouterr().out
    assert out.count("--config update_bound") == (1 if hinted else 0), out
    if hinted:
        waited = int(re.search(r"collection waited for it (\d+)% of the last (\d+) updates", out).group(1))
        assert 50 <= waited <= 100

@pytest.mark.slow
@pytest.mark.exact
@pytest.mark.parametrize("agent", ["MAPPO", "MAT", "COMA"])
def test_an_overlapped_run_resumes_exactly_with_its_next_rollout_saved(tiny, agent):
    """A run of 600 steps ends with its agents after the 6th update and the 7th rollout, collected
    beside that update with the weights of the 5th, in latest.pt; extended to 1200 steps it ends
    where a run of 1200 steps ends, bit for bit."""
    common = {**tiny, **OVERLAP, "runner.save_interval": 600}
    full = marlkit.run(agent=agent, env="mpe_spread", seed=4, **{**common, "runner.total_steps": 1200})
    half = marlkit.run(agent=agent, env="mpe_spread", seed=4, **{**common, "runner.total_steps": 600})
    state = pickle.loads(torch.load(half.run_dir / "latest.pt", weights_only=False)["runner"])
    assert state["steps"] == 600 and state["pending"]["agents"].rollout.full
    resumed = marlkit.run(mode="train", resume=str(half.run_dir), **{"runner.total_steps": 1200})
    assert resumed.run_dir == half.run_dir and resumed.steps == 1200
    assert_same_training(full, resumed)


def test_a_rollout_in_flight_is_trained_on_when_the_run_resumes_without_overlap(tiny):
    """Resumed in process (vectorize sync, so no overlap), the saved rollout is the first one the
    agent learns from: the run goes on from it, step for step, and the reverse works as well."""
    common = {**tiny, **OVERLAP, "runner.save_interval": 300}
    half = marlkit.run(agent="MAPPO", env="mpe_spread", seed=6, **{**common, "runner.total_steps": 300})
    resumed = marlkit.run(mode="train", resume=str(half.run_dir),
                          **{"runner.total_steps": 600, "runner.vectorize": "sync"})
    assert resumed.steps == 600
    state = pickle.loads(torch.load(half.run_dir / "latest.pt", weights_only=False)["runner"])
    assert state["steps"] == 600 and state["updates"] == 6 and not state["pending"]
    again = marlkit.run(mode="train", resume=str(half.run_dir),
                        **{"runner.total_steps": 900, "runner.vectorize": "subprocess"})
    assert again.steps == 900
    state = pickle.loads(torch.load(half.run_dir / "latest.pt", weights_only=False)["runner"])
    assert state["updates"] == 9 and state["pending"]


@pytest.mark.slow
@pytest.mark.exact
def test_overlapped_training_is_deterministic():
    """The learner's and the behaviour's draws come from generators of their own, so how the two
    threads interleave cannot change a run."""
    import tempfile
    runs = []
    for _ in range(2):
        with tempfile.TemporaryDirectory() as root:
            run = marlkit.run(agent="MAPPO", env="mpe_spread", seed=2, logger="none",
                              **{**OVERLAP, "runner.run_root": root, "runner.progress": False,
                                 "runner.total_steps": 2000})
            runs.append(({k: v for k, v in run.metrics.items() if not k.startswith("perf/")}, run.episode_returns))
    assert runs[0] == runs[1]


@pytest.mark.slow
@pytest.mark.exact
@pytest.mark.parametrize("env", ["mpe_spread", "lbf_8x8_2p_2f_coop"])
def test_overlap_with_envs_in_this_process_learns_what_one_env_worker_learns(tiny, env):
    """With the envs in this process the next rollout is collected after the update instead of beside
    it, acting with the same weights: the run is the one of a single env worker, bit for bit (a
    one-core job of a study runs so, without the worker's process and copies)."""
    common = {**tiny, **OVERLAP, "runner.overlap": True, "runner.total_steps": 800}
    worker = marlkit.run(agent="MAPPO", env=env, seed=5, **{**common, "runner.workers": 1})
    here = marlkit.run(agent="MAPPO", env=env, seed=5, **{**common, "runner.vectorize": "sync"})
    assert_same_training(worker, here)
    state = pickle.loads(torch.load(here.run_dir / "latest.pt", weights_only=False)["runner"])
    assert state["updates"] == 8 and state["pending"]["agents"].rollout.full
    # auto: on with worker processes, off without
    from marlkit.config import RunnerConfig
    assert RunnerConfig(vectorize="subprocess").overlapped() and not RunnerConfig(vectorize="sync").overlapped()
    assert not RunnerConfig(vectorize="auto", parallels=1).overlapped()
    assert not RunnerConfig(vectorize="subprocess", overlap=False).overlapped()


@pytest.mark.exact
def test_a_run_resumed_in_fresh_episodes_learns_its_saved_rollout_from_where_it_ended(tiny, env_yaml):
    """An env that cannot be restored exactly resumes in fresh episodes, but the rollout saved beside
    the last update was collected before them: the update on it, the first after the resume, is
    bootstrapped from the observation it ended at, so it is the update an uninterrupted run made
    (equal weights after it), though the episodes collected beside it differ."""
    path = env_yaml("test_run_safety:outside_state", {"length": 7})
    common = {**tiny, **OVERLAP, "runner.parallels": 2, "runner.horizon": 10, "runner.save_interval": 40}
    full = marlkit.run(agent="MAPPO", env=path, seed=2, **{**common, "runner.total_steps": 60})
    half = marlkit.run(agent="MAPPO", env=path, seed=2, **{**common, "runner.total_steps": 40})
    state = pickle.loads(torch.load(half.run_dir / "latest.pt", weights_only=False)["runner"])
    assert state["pending"] and state["steps"] == 40   # the third rollout ends 30 steps into its envs
    resumed = marlkit.run(mode="train", resume=str(half.run_dir), **{"runner.total_steps": 60})
    assert resumed.steps == 60
    losses = [k for k in full.metrics if "loss" in k]
    assert losses and all(resumed.metrics[k] == full.metrics[k] for k in losses)
    wa = torch.load(full.run_dir / "latest.pt", weights_only=False)["groups"]["agents"]["modules"]
    wb = torch.load(resumed.run_dir / "latest.pt", weights_only=False)["groups"]["agents"]["modules"]
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=0, msg=name)
