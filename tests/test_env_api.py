"""An env that breaks its own API gets an error naming the agent and the step."""
import logging
import tempfile

import numpy as np
import pytest

import marlkit
from marlkit.config import ConfigError
from marlkit.envs.core import EnvAPIError
from marlkit.envs.pettingzoo import PettingZooEnv
from marlkit.errors import EnvWorkerError
from toy_envs import BrokenEnv


def _drive(env, steps=6):
    env.reset(seed=0)
    for _ in range(steps):
        env.step({"agents": np.zeros(3, np.int64)})


def test_missing_observation_names_agent_and_step():
    with pytest.raises(EnvAPIError, match="step 3: the env returned no observation for agent 'agent_1', which is still in env.agents"):
        _drive(PettingZooEnv(BrokenEnv("missing_obs", break_at=3)))


def test_observation_outside_its_space():
    with pytest.raises(EnvAPIError, match=r"step 2: observation of agent 'agent_2' lies outside its observation_space Box\(-10.0, 10.0"):
        _drive(PettingZooEnv(BrokenEnv("out_of_space", break_at=2)))
    # the full space check can be turned off for speed; shapes are always checked
    _drive(PettingZooEnv(BrokenEnv("out_of_space", break_at=2), check_api=False))


def test_wrong_shape_and_unknown_agent():
    class WrongShape(BrokenEnv):
        def step(self, actions):
            obs, *rest = super().step(actions)
            obs["agent_0"] = np.zeros(7, np.float32)
            return (obs, *rest)

    with pytest.raises(EnvAPIError, match=r"step 1: observation of agent 'agent_0' has shape \(7,\), but its observation_space says \(4,\)"):
        _drive(PettingZooEnv(WrongShape()))

    class Stranger(BrokenEnv):
        def step(self, actions):
            obs, *rest = super().step(actions)
            obs["ghost"] = np.zeros(4, np.float32)
            return (obs, *rest)

    with pytest.raises(EnvAPIError, match="step 1: the env returned an observation for 'ghost', which is not in possible_agents"):
        _drive(PettingZooEnv(Stranger()))


def test_missing_reward_names_agent():
    class NoReward(BrokenEnv):
        def step(self, actions):
            obs, rewards, *rest = super().step(actions)
            rewards.pop("agent_2")
            return (obs, rewards, *rest)

    with pytest.raises(EnvAPIError, match=r"step 1: the env returned no reward for agent\(s\) \['agent_2'\]"):
        _drive(PettingZooEnv(NoReward()))


@pytest.mark.parametrize("vectorize, error, where", [("sync", EnvAPIError, ""),
                                                     ("auto", EnvWorkerError, r"env \d raised while collecting a rollout: ")])
def test_api_error_surfaces_through_the_runner(env_yaml, tiny, vectorize, error, where, tmp_path, monkeypatch):
    """In process as itself; from a worker (the default) as the worker's error naming the env."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # the worker's traceback file, before any run dir
    path = env_yaml("toy_envs:broken", {"how": "missing_obs", "break_at": 4})
    with pytest.raises(error, match=where + "(EnvAPIError: )?step 4: .*agent 'agent_1'"):
        marlkit.run(agent="MAPPO", env=path, **tiny, **{"runner.vectorize": vectorize})


def test_not_a_parallel_env(env_yaml, tiny):
    path = env_yaml("toy_envs:not_parallel")
    with pytest.raises(ConfigError, match="env factory returned dict, not a PettingZoo ParallelEnv"):
        marlkit.run(agent="MAPPO", env=path, **tiny)


@pytest.mark.parametrize("how", ["raise", "shape"])
def test_a_state_that_fails_keeps_the_last_one_with_one_warning(how, caplog, monkeypatch):
    """Each episode's last step has no state(); the step before's stands in, and the warning, naming
    the env and env.state, comes once however often it happens, from however many copies."""
    from marlkit.envs import pettingzoo
    from toy_envs import FailingStateEnv

    monkeypatch.setattr(pettingzoo, "_STATE_FAILED", set())
    env, twin = (PettingZooEnv(FailingStateEnv(how=how, length=4)) for _ in range(2))
    with caplog.at_level(logging.WARNING, logger="marlkit.pettingzoo"):
        for episode in range(3):
            obs = env.reset(seed=episode)
            states = [obs.state.copy()]
            over = False
            while not over:
                obs, *_, over = env.step({g: np.zeros(gs.n_agents, np.int64) for g, gs in env.groups.items()})
                states.append(obs.state.copy())
            assert [s[0] for s in states] == [0, 1, 2, 3, 3]        # the last step repeats step 3's state
        twin.reset(seed=0)
        for _ in range(4):
            twin.step({g: np.zeros(gs.n_agents, np.int64) for g, gs in twin.groups.items()})
    warnings = [r for r in caplog.records if r.name == "marlkit.pettingzoo"]
    assert len(warnings) == 1
    assert "scripted_v0" in warnings[0].getMessage() and "env.state: concat" in warnings[0].getMessage()


@pytest.mark.slow
def test_multiwalker_trains_with_the_defaults_through_walkers_falling(tmp_path, caplog, env_yaml, monkeypatch):
    """sisl multiwalker's state() fails on the step a walker falls (its hull is gone): training
    goes on over many such episode ends, with the one warning (in this process: the envs step here,
    where the log is captured; each worker process would warn once)."""
    pytest.importorskip("Box2D", reason="the games extra (pip install -e .[games]) brings Box2D")
    import marlkit
    from marlkit.envs import pettingzoo
    monkeypatch.setattr(pettingzoo, "_STATE_FAILED", set())
    path = env_yaml("pettingzoo.sisl.multiwalker_v9:parallel_env", {"max_cycles": 100})
    with caplog.at_level(logging.WARNING, logger="marlkit.pettingzoo"):
        result = marlkit.run(agent="MAPPO", env=path, seed=1, logger="none", **{
            "runner.run_root": str(tmp_path / "runs"), "runner.progress": False, "runner.parallels": 4,
            "runner.vectorize": "sync", "runner.horizon": 50, "runner.total_steps": 2000})
    assert result.steps == 2000 and len(result.episode_returns) >= 20
    assert all(np.isfinite(v) for v in result.metrics.values())
    warnings = [r.getMessage() for r in caplog.records if r.name == "marlkit.pettingzoo"]
    assert len(warnings) == 1 and "multiwalker" in warnings[0] and "env.state: concat" in warnings[0]


@pytest.mark.slow
def test_agents_that_see_a_blank_screen_are_named_with_the_key_that_mends_it(caplog, monkeypatch):
    """butterfly's cooperative_pong draws its screen only for a render mode: without one both paddles
    observe black for the whole first episode, and the adapter says so once per env class, naming
    the key that mends it; with ``env.render_mode: rgb_array`` the screens vary and nothing is said."""
    pytest.importorskip("pygame", reason="the games extra (pip install -e .[games]) brings pygame")
    from marlkit.envs import pettingzoo
    monkeypatch.setattr(pettingzoo, "_WARNED_BLANK", set())
    rng = np.random.default_rng(0)
    spread, warned = {}, {}
    for render_mode in (None, "rgb_array"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="marlkit.pettingzoo"):
            for _ in range(2):   # a second env of the class is not warned of again
                env = PettingZooEnv.from_config(pettingzoo.PettingZooConfig(
                    factory="pettingzoo.butterfly.cooperative_pong_v6:parallel_env", render_mode=render_mode))
                obs, over, seen = env.reset(seed=0), False, []
                while not over:
                    obs, *_, over = env.step({"agents": rng.integers(0, 3, 2)})
                    seen.append(obs.obs["agents"].std())
                env.close()
        spread[render_mode] = max(seen)
        warned[render_mode] = [r.getMessage() for r in caplog.records if r.name == "marlkit.pettingzoo"]
    assert spread[None] == 0 and spread["rgb_array"] > 10
    assert len(warned[None]) == 1 and "['paddle_0', 'paddle_1']" in warned[None][0]
    assert "env.render_mode: rgb_array" in warned[None][0]
    assert warned["rgb_array"] == []


def test_checking_wrappers_come_off_and_the_dynamics_stay():
    """mpe2's parallel_env steps its AEC core without PettingZoo's order and bounds wrappers:
    the same seed and actions give the same observations and rewards as the wrapped env."""
    from mpe2 import simple_spread_v3
    from pettingzoo.utils.wrappers import BaseWrapper

    from marlkit.envs.pettingzoo import PettingZooConfig
    cfg = PettingZooConfig(factory="mpe2.simple_spread_v3:parallel_env", kwargs={"N": 3, "max_cycles": 25})
    ours = PettingZooEnv.from_config(cfg)
    assert not isinstance(ours.env.aec_env, BaseWrapper)
    kept = PettingZooEnv.from_config(PettingZooConfig(factory=cfg.factory, kwargs=cfg.kwargs, strip_checks=False))
    assert isinstance(kept.env.aec_env, BaseWrapper)
    reference = simple_spread_v3.parallel_env(N=3, max_cycles=25)
    ref_obs, _ = reference.reset(seed=3)
    rng = np.random.default_rng(0)
    for env in (ours, kept):
        first = env.reset(seed=3)
        assert np.array_equal(first.obs["agents"], np.stack([ref_obs[a] for a in reference.possible_agents]))
    for _ in range(60):
        if not reference.agents:
            reference.reset(seed=4)
            ours.reset(seed=4)
            kept.reset(seed=4)
        actions = rng.integers(0, 5, 3)
        ref_obs, ref_reward, *_ = reference.step({a: int(actions[i]) for i, a in enumerate(reference.agents)})
        for env in (ours, kept):
            ob, reward, *_ = env.step({"agents": actions})
            assert np.array_equal(ob.obs["agents"], np.stack([ref_obs[a] for a in reference.possible_agents]))
            assert np.array_equal(reward["agents"], np.array([ref_reward[a] for a in reference.possible_agents],
                                                             np.float32))


def test_an_action_outside_the_space_is_refused_by_name():
    from marlkit.envs.pettingzoo import PettingZooConfig
    env = PettingZooEnv.from_config(PettingZooConfig(factory="mpe2.simple_spread_v3:parallel_env", kwargs={"N": 3}))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"step 1: agent 'agent_1' was given action index 5, outside its action "
                                         r"space Discrete\(5\)"):
        env.step({"agents": np.array([0, 5, 1])})


def test_a_discrete_observation_is_seen_one_hot():
    """Rock paper scissors observes the other player's last move as a Discrete(4)."""
    from pettingzoo.classic import rps_v2
    env = PettingZooEnv(rps_v2.parallel_env(), groups={"player_0": ["player_0"], "player_1": ["player_1"]})
    assert env.groups["player_0"].observation_space.shape == (4,)
    first = env.reset(seed=0)
    assert first.obs["player_0"].tolist() == [[0, 0, 0, 1]]   # 3: nothing played yet
    ob, _, _, _, _ = env.step({"player_0": np.array([0]), "player_1": np.array([2])})
    assert ob.obs["player_0"].tolist() == [[0, 0, 1, 0]] and ob.obs["player_1"].tolist() == [[1, 0, 0, 0]]
