"""VMAS scenarios as one batched env: one simulator step per vector step, the contract's arrays,
episodes cut by the time limit and reset where they stand, the refusals, and a run through the
runner."""
import sys

import numpy as np
import pytest
from gymnasium import spaces

import marlkit
from marlkit.api import build_config
from marlkit.config import ConfigError
from marlkit.envs.factory import make_env_vector

pytest.importorskip("vmas")


def _venv(num_envs=4, max_steps=5, **settings):
    cfg = build_config("MADDPG", "vmas_navigation", **{"env.max_steps": max_steps, **settings})
    return make_env_vector(cfg.env, cfg.runner, num_envs)


def test_the_envs_step_as_one_batch_with_the_contracts_arrays():
    venv = _venv(num_envs=4, max_steps=5)
    try:
        inner = venv.venv   # the batched backend inside the episode statistics
        group = venv.spec.groups["agents"]
        assert group.agents == ["agent_0", "agent_1", "agent_2"]
        assert isinstance(group.action_space, spaces.Box) and group.action_space.shape == (2,)
        assert venv.spec.episode_limit == 5 and venv.spec.state_from_obs
        ob = venv.reset(seed=3)
        A, O = 3, group.obs_shape[0]
        assert ob.obs["agents"].shape == (4, A, O) and ob.obs["agents"].dtype == np.float32
        np.testing.assert_array_equal(ob.state, ob.obs["agents"].reshape(4, -1))
        assert ob.agent_mask["agents"].all() and ob.action_mask["agents"].shape == (4, A, 0)

        calls = []
        step = inner.env.step
        inner.env.step = lambda actions: calls.append(len(actions)) or step(actions)
        rng = np.random.default_rng(0)
        for t in range(5):
            before = ob
            res = venv.step({"agents": rng.uniform(-1, 1, (4, A, 2)).astype(np.float32)})
            assert res.reward["agents"].shape == (4, A) and np.isfinite(res.reward["agents"]).all()
            ob = res.next
        assert calls == [A] * 5   # one simulator step for the four envs, each time
        # the time limit ends every env's episode at step 5 as a truncation, and each starts afresh
        assert res.episode_end.all() and res.truncated["agents"].all() and not res.terminated["agents"].any()
        assert not np.allclose(res.final.obs["agents"], res.next.obs["agents"])
        assert not np.allclose(res.final.obs["agents"], before.obs["agents"])   # the last step's own observation
    finally:
        venv.close()


def test_a_run_trains_on_it_and_counts_its_episodes(tiny):
    run = marlkit.run(agent="MADDPG", env="vmas_navigation", mode="benchmark", seed=1, **{
        **tiny, "runner.parallels": 4, "runner.horizon": 10, "runner.total_steps": 400, "env.max_steps": 20,
        "agents.MADDPG.learning_starts": 100, "agents.MADDPG.batch_size": 32, "runner.eval_interval": 400,
        "runner.eval_episodes": 4, "runner.eval_parallels": 4})
    assert run.metrics["agents/gradient_steps"] > 0
    assert len(run.episode_returns) == 400 // 20   # 100 steps of each of the 4 envs: an episode every 20
    assert run.evaluations and np.isfinite(run.evaluations[-1]["mean"]["agents"])


def test_workers_and_a_missing_package_are_refused_in_one_line(tiny, monkeypatch):
    with pytest.raises(ConfigError, match=r"runner.vectorize: subprocess puts envs in workers, but env.type: vmas "
                                          r"steps all runner.parallels envs as one batched simulation"):
        marlkit.run(agent="MAPPO", env="vmas_balance", **{**tiny, "runner.vectorize": "subprocess"})
    monkeypatch.setitem(sys.modules, "vmas", None)
    with pytest.raises(ConfigError, match=r"env.type: vmas needs the vmas package; pip install 'marlkit\[vmas\]'"):
        marlkit.run(agent="MAPPO", env="vmas_balance", **tiny)
