"""``env.type: gymma``: Gymnasium multi-agent envs as EPyMARL plays them, on the real lbforaging and
rware packages (and a toy env for what those two never do: per-agent ends, action masks)."""
import os
import pickle

import gymnasium
import numpy as np
import pytest
import yaml
from gymnasium import spaces

import marlkit
from marlkit.config import ConfigError
from marlkit.envs.core import EnvAPIError
from marlkit.envs.factory import make_env
from marlkit.envs.gymma import GymmaConfig, GymmaEnv, make_gymma
from marlkit.envs.vector import EpisodeStatistics, SyncVectorEnv, dumps_state
from forked_cli import run_marlkit

pytest.importorskip("lbforaging")
pytest.importorskip("rware")

LBF = "lbforaging:Foraging-8x8-2p-2f-coop-v3"
RWARE = "rware:rware-tiny-2ag-v2"
NONE = 0   # lbforaging's Action.NONE and rware's Action.NOOP


def still(n_agents: int = 2) -> dict:
    return {"agents": np.full(n_agents, NONE)}


def random_actions(env, rng) -> dict:
    return {g: rng.integers(0, gs.n_actions, gs.n_agents) for g, gs in env.spec.groups.items()}


@pytest.mark.parametrize("env_id,obs_size,n_actions,limit", [(LBF, 12, 6, 50), (RWARE, 71, 5, 500)])
def test_spaces_shapes_and_the_state_as_the_joint_observation(env_id, obs_size, n_actions, limit):
    env = make_env(GymmaConfig(id=env_id))
    spec = env.spec
    assert list(spec.groups) == ["agents"]
    group = spec.groups["agents"]
    assert group.agents == ["agent_0", "agent_1"] and group.obs_shape == (obs_size,)
    assert group.action_space == spaces.Discrete(n_actions) and group.n_actions == n_actions
    assert spec.state_shape == (2 * obs_size,) and spec.state_from_obs
    assert env.time_limit == limit   # the env's own, by default
    ob = env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert ob.obs["agents"].shape == (2, obs_size) and ob.obs["agents"].dtype == np.float32
        assert ob.agent_mask["agents"].tolist() == [True, True]
        assert ob.action_mask["agents"].shape == (2, n_actions) and ob.action_mask["agents"].all()
        np.testing.assert_array_equal(ob.state, ob.obs["agents"].reshape(-1))
        ob, reward, terminated, truncated, done = env.step(random_actions(env, rng))
        assert reward["agents"].shape == terminated["agents"].shape == truncated["agents"].shape == (2,)
        assert not done


def test_the_time_limit_is_a_truncation_that_keeps_the_final_observation():
    """LBF reports its own 50-step limit as a termination; here the 50th step is a truncation, and
    the vector env's final observation is the episode's last one (agents that never move see the
    first again), not the next episode's first."""
    venv = EpisodeStatistics(SyncVectorEnv([lambda: make_env(GymmaConfig(id=LBF))]))
    first = venv.reset(seed=4).obs["agents"][0].copy()
    for t in range(1, 51):
        res = venv.step({"agents": np.full((1, 2), NONE)})
        assert res.episode_end[0] == (t == 50)
        assert not res.terminated["agents"].any()
        assert res.truncated["agents"][0].tolist() == [t == 50] * 2
    np.testing.assert_array_equal(res.final.obs["agents"][0], first)
    np.testing.assert_array_equal(res.final.state[0], first.reshape(-1))
    assert not np.array_equal(res.next.obs["agents"][0], first)   # already the next episode
    assert res.infos[0]["episode"]["length"] == 50
    venv.close()


@pytest.mark.parametrize("env_id,time_limit", [(LBF, 80), (LBF, 7), (RWARE, 30)])
def test_env_time_limit_replaces_the_envs_own(env_id, time_limit):
    env = make_env(GymmaConfig(id=env_id, time_limit=time_limit))
    env.reset(seed=0)
    for t in range(1, time_limit + 1):
        _, _, terminated, truncated, done = env.step(still())
        assert done == (t == time_limit) and not terminated["agents"].any()
    assert truncated["agents"].all()


def test_team_reward_pays_every_agent_the_sum_and_individual_each_its_own():
    """Non-cooperative LBF: an agent loads food alone, so the two agents' rewards differ."""
    envs = {r: GymmaEnv(make_gymma("lbforaging:Foraging-5x5-2p-1f-v3", {}), reward=r) for r in ("individual", "team")}
    for env in envs.values():
        env.reset(seed=3)
    rng = np.random.default_rng(0)
    unequal, returns = 0, {r: 0.0 for r in envs}
    for _ in range(3000):
        actions = {"agents": rng.integers(0, 6, 2)}
        steps = {r: env.step(actions) for r, env in envs.items()}
        individual, team = steps["individual"][1]["agents"], steps["team"][1]["agents"]
        assert team.tolist() == [individual.sum()] * 2
        unequal += individual[0] != individual[1]
        for r in envs:
            returns[r] += float(steps[r][1]["agents"].sum()) / (2 if r == "team" else 1)
        if steps["team"][4]:
            for r, env in envs.items():
                assert env.episode_stats()["team_return"] == pytest.approx(returns[r])
                returns[r] = 0.0
                env.reset()
    assert unequal > 10


def test_groups_follow_the_pettingzoo_patterns():
    env = GymmaEnv(make_gymma(LBF, {}), groups={"first": ["agent_0"], "second": ["agent_1"]})
    assert {g: gs.agents for g, gs in env.spec.groups.items()} == {"first": ["agent_0"], "second": ["agent_1"]}
    ob = env.reset(seed=0)
    np.testing.assert_array_equal(ob.state, np.concatenate([ob.obs["first"][0], ob.obs["second"][0]]))
    with pytest.raises(ConfigError, match="agent 'agent_1' matches no group"):
        GymmaEnv(make_gymma(LBF, {}), groups={"first": ["agent_0"]})


class _PerAgentEnds(gymnasium.Env):
    """agent_0's episode ends at step 2, agent_1's at step 4; an action mask in the info."""

    observation_space = spaces.Tuple([spaces.Dict({"x": spaces.Box(0, 9, (2,), np.float32)})] * 2)
    action_space = spaces.Tuple([spaces.Discrete(3)] * 2)
    mask = [[True, True, False], [False, True, True]]

    def _obs(self):
        return tuple({"x": np.full(2, self.t + i, np.float32)} for i in range(2))

    def reset(self, seed=None, options=None):
        self.t = 0
        return self._obs(), {"action_mask": self.mask}

    def step(self, actions):
        self.t += 1
        return self._obs(), [1.0, 2.0], [self.t >= 2, self.t >= 4], False, {"action_mask": self.mask}


def test_per_agent_ends_action_masks_and_flattened_observations():
    env = GymmaEnv(_PerAgentEnds(), reward="individual")
    assert env.spec.groups["agents"].obs_shape == (2,)
    ob = env.reset()
    assert ob.action_mask["agents"].tolist() == _PerAgentEnds.mask
    seen = []
    for _ in range(4):
        ob, reward, terminated, truncated, done = env.step({"agents": np.array([1, 1])})
        seen.append((terminated["agents"].tolist(), ob.agent_mask["agents"].tolist(), done))
        assert reward["agents"].tolist() == [1.0, 2.0] and not truncated["agents"].any()
    assert seen == [([False, False], [True, True], False), ([True, False], [False, True], False),
                    ([False, False], [False, True], False), ([False, True], [False, False], True)]
    np.testing.assert_array_equal(ob.obs["agents"], [[4, 4], [5, 5]])
    with pytest.raises(ValueError, match="'agent_1' was given action index 3"):
        env.step({"agents": np.array([0, 3])})


class _FourAlike(gymnasium.Env):
    """Four alike agents: agent i's episode ends at step 2 + i (agent 3 at the time limit), each
    paid its action plus its index, with an action mask that changes every step."""

    observation_space = spaces.Tuple([spaces.Box(0, 99, (3,), np.float32)] * 4)
    action_space = spaces.Tuple([spaces.Discrete(3)] * 4)

    def _out(self):
        mask = np.ones((4, 3), bool)
        mask[:, self.t % 3] = False
        return tuple(np.full(3, 10 * i + self.t, np.float32) for i in range(4)), {"action_mask": mask}

    def reset(self, seed=None, options=None):
        self.t = 0
        return self._out()

    def step(self, actions):
        self.t += 1
        obs, info = self._out()
        rewards = [float(a) + i for i, a in enumerate(actions)]
        return obs, rewards, [self.t >= 2 + i for i in range(3)] + [False], False, info


def test_alike_agents_read_as_arrays_give_what_they_give_agent_by_agent():
    arrays = GymmaEnv(_FourAlike(), groups={"even": ["agent_0", "agent_2"], "odd": ["agent_1", "agent_3"]},
                      reward="individual", time_limit=6)
    by_agent = GymmaEnv(_FourAlike(), groups={"even": ["agent_0", "agent_2"], "odd": ["agent_1", "agent_3"]},
                        reward="individual", time_limit=6)
    assert arrays._alike
    by_agent._alike = False   # the path of unlike agents
    pairs = [(arrays.reset(), by_agent.reset())]
    rng = np.random.default_rng(0)
    for t in range(6):
        actions = {g: rng.integers(0, 3, (2,)) for g in ("even", "odd")}
        got, want = arrays.step(actions), by_agent.step(actions)
        pairs.append((got[0], want[0]))
        for x, y in zip(got[1:4], want[1:4]):
            for g in x:
                np.testing.assert_array_equal(x[g], y[g])
        assert got[4] == want[4] == (t == 5)
    for a, b in pairs:
        for g in ("even", "odd"):
            for field in ("obs", "agent_mask", "action_mask"):
                np.testing.assert_array_equal(getattr(a, field)[g], getattr(b, field)[g])
        np.testing.assert_array_equal(a.state, b.state)
    # agent_2 (even's second) ended at step 4, agent_3 (odd's second) was truncated at the limit
    assert pairs[4][0].agent_mask["even"].tolist() == [False, False] and got[3]["odd"].tolist() == [False, True]
    short = _FourAlike()
    short._out = lambda: ((np.zeros(3, np.float32),) * 3 + (np.zeros(2, np.float32),), {})
    with pytest.raises(EnvAPIError, match=r"observations have shapes .*\(2,\)\].*says \(3,\)"):
        GymmaEnv(short).reset()


@pytest.mark.parametrize("env_id", [LBF, RWARE])
def test_a_pickled_env_continues_the_same_trajectory(env_id):
    """What ``env.exact_resume: true`` in the packaged YAMLs rests on: mid-episode, the env's
    state as a checkpoint saves it continues exactly as the env itself, across episode ends."""
    env = make_env(GymmaConfig(id=env_id, time_limit=15, exact_resume=True))
    env.reset(seed=5)
    rng = np.random.default_rng(1)
    for _ in range(9):
        env.step(random_actions(env, rng))
    copy = pickle.loads(dumps_state(env))
    trajectories = []
    for e in (env, copy):
        rng = np.random.default_rng(2)
        steps = []
        for _ in range(40):
            ob, reward, terminated, truncated, done = e.step(random_actions(e, rng))
            if done:
                ob = e.reset()
            steps.append((ob.obs["agents"].tolist(), reward["agents"].tolist(), done))
        trajectories.append(steps)
    assert trajectories[0] == trajectories[1]
    assert sum(done for *_, done in trajectories[0]) == 3


@pytest.mark.parametrize("env_name,overrides,episodes", [
    ("lbf_8x8_2p_2f_coop", {"runner.horizon": 50, "runner.total_steps": 200}, None),
    ("rware_tiny_2ag", {"env.time_limit": 25, "runner.horizon": 25, "runner.total_steps": 100}, 4),
])
def test_mappo_trains_on_the_packaged_yamls(tiny, env_name, overrides, episodes):
    # without overlap no rollout is collected beyond the budget, so the episodes can be counted
    result = marlkit.run(agent="MAPPO", env=env_name, seed=1, **{**tiny, "runner.overlap": False, **overrides})
    assert result.steps == overrides["runner.total_steps"]
    returns = [r["agents"] for r in result.episode_returns]
    if episodes is None:   # LBF: episodes of at most 50 steps, team returns in [0, 1]
        assert len(returns) >= 4 and all(0.0 <= r <= 1.0 for r in returns)
    else:                  # rware never ends an episode itself: exactly the time limit's
        assert len(returns) == episodes and all(r >= 0 and r == int(r) for r in returns)
    saved = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert saved["env"]["type"] == "gymma" and saved["env"]["reward"] == "team"
    assert (result.run_dir / "latest.pt").is_file()


@pytest.mark.slow
def test_a_missing_env_module_is_a_one_line_config_error(tmp_path):
    out = run_marlkit(["--env", "lbf_8x8_2p_2f_coop", "--set", "env.id=no_such_package:Foraging-8x8-2p-2f-coop-v3",
                       f"runner.run_root={tmp_path}"],
                      {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))}, tmp_path, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "env.id: cannot import module 'no_such_package'" in lines[0]
    assert "pip install -e .[games]" in lines[0]
    assert not list(tmp_path.rglob("*.pt"))


def test_an_unknown_id_or_kwarg_names_the_key():
    with pytest.raises(ConfigError, match="did you mean 'Foraging-8x8-2p-2f-coop-v3'"):
        make_gymma("lbforaging:Foraging-8x8-2p-2f-cop-v3", {})
    with pytest.raises(ConfigError, match="env.kwargs: 'rware-tiny-2ag-v2' refused them"):
        make_gymma(RWARE, {"no_such_setting": 1})
