"""Envs in arrays (``marlkit/envs/array_env.py``): the pettingzoo adapter reads an
``ArrayParallelEnv``'s ``[A, ...]`` arrays one index per group, and must see exactly what it sees
through the same env's per-agent dicts: observations, masks, rewards, ends, the global state and
its refusals. The real mettagrid game is held to the same, step for step."""
import numpy as np
import pytest
from gymnasium import spaces

from marlkit.config import ConfigError
from marlkit.envs.array_env import AgentRows, ArrayParallelEnv, DictsOnly
from marlkit.envs.core import EnvAPIError
from marlkit.envs.pettingzoo import PettingZooEnv


LIFETIMES = np.array([3, 4, 5, 10**6])   # agent i terminates at step 3 + i, agent 3 never


class Gridlike(ArrayParallelEnv):
    """Four agents whose names interleave two groups (``red_0, blue_0, red_1, blue_1``); agent i
    terminates at step ``3 + i`` (agent 3 never does), the observation is seeded noise plus the step,
    rewards are the action taken plus the agent's index (nothing once it left), and action ``2`` is masked at odd steps."""

    def __init__(self, n_actions: int = 3, masks: bool = True):
        self.possible_agents = ["red_0", "blue_0", "red_1", "blue_1"]
        self.n_actions, self.masks = n_actions, masks
        self._obs = spaces.Box(-1.0, 20.0, (2, 3), np.float32)

    def observation_space(self, agent):
        return self._obs

    def action_space(self, agent):
        return spaces.Discrete(self.n_actions)

    def _info(self):
        if not self.masks:
            return {}
        mask = np.ones((4, self.n_actions), bool)
        mask[:, 2] = self.t % 2 == 0
        return {"action_mask": mask}

    def _observation(self):
        return (self.rng.random((4, 2, 3)) + self.t).astype(np.float32)

    def reset_arrays(self, seed=None):
        self.rng, self.t = np.random.default_rng(seed), 0
        return self._observation(), self._info()

    def step_arrays(self, actions):
        self.t += 1
        # an agent that left is paid nothing: its action entry means nothing
        reward = np.where(self.t <= LIFETIMES, actions + np.arange(4), 0).astype(np.float32)
        terminated = self.t == LIFETIMES
        return self._observation(), reward, terminated, np.zeros(4, bool), self._info()


GROUPS = {"red": ["red_*"], "blue": ["blue_*"]}


def assert_same(a, b):
    """Two observations, or two dicts of per-group arrays, equal array for array."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for g in a:
            np.testing.assert_array_equal(a[g], b[g])
        return
    for field in ("obs", "agent_mask", "action_mask"):
        assert_same(getattr(a, field), getattr(b, field))
    np.testing.assert_array_equal(a.state, b.state)


def test_groups_rows_are_slices_where_consecutive_and_indices_where_not():
    rows = AgentRows(["a0", "b0", "a1", "c0", "c1"], {"a": ["a0", "a1"], "b": ["b0"], "c": ["c0", "c1"]})
    assert rows.rows["c"] == slice(3, 5) and rows.rows["b"] == slice(1, 2)
    np.testing.assert_array_equal(rows.rows["a"], [0, 2])
    x = np.arange(10).reshape(5, 2)
    split = rows.split(x)
    np.testing.assert_array_equal(split["a"], [[0, 1], [4, 5]])
    assert np.shares_memory(split["c"], x)   # a slice: a view
    np.testing.assert_array_equal(rows.join(split, np.zeros_like(x)), x)


@pytest.mark.parametrize("max_episode_steps", [None, 4])
def test_arrays_and_dicts_give_the_same_steps_deaths_masks_and_time_limit(max_episode_steps):
    arrays = PettingZooEnv(Gridlike(), groups=GROUPS, max_episode_steps=max_episode_steps)
    dicts = PettingZooEnv(DictsOnly(Gridlike()), groups=GROUPS, max_episode_steps=max_episode_steps)
    assert arrays._rows is not None and dicts._rows is None
    assert list(arrays.spec.groups) == ["red", "blue"] and arrays.spec.state_shape == (24,)
    assert_same(arrays.reset(seed=7), dicts.reset(seed=7))
    rng = np.random.default_rng(0)
    ended = False
    for t in range(1, 9):
        actions = {g: rng.integers(0, 2, (2,)) for g in ("red", "blue")}
        got, want = arrays.step(actions), dicts.step(actions)
        for x, y in zip(got[:4], want[:4]):
            assert_same(x, y)
        assert got[4] == want[4]
        ob, reward, terminated, truncated, over = got
        if t == 3:   # red_0 terminated at step 3: absent from then on, its end reported once
            assert terminated["red"].tolist() == [True, False] and ob.agent_mask["red"].tolist() == [False, True]
        if t == 4:
            assert terminated["red"].tolist() == [False, False] and terminated["blue"].tolist() == [True, False]
        # action 2 is masked at odd steps for agents still playing; an absent agent's mask is all True
        assert ob.action_mask["red"][:, 2].tolist() == ((t % 2 == 0) | ~ob.agent_mask["red"]).tolist()
        np.testing.assert_array_equal(reward["blue"], np.where(t <= LIFETIMES[[1, 3]], actions["blue"] + [1, 3], 0))
        if over:
            ended = True
            assert t == max_episode_steps == 4
            # the time limit truncates the agents that were still playing, and no other
            assert truncated["red"].tolist() == [False, True] and truncated["blue"].tolist() == [False, True]
            break
    assert ended == (max_episode_steps is not None)


def test_an_index_outside_the_action_space_is_refused_naming_the_agent():
    env = PettingZooEnv(Gridlike(masks=False), groups=GROUPS)
    env.reset(seed=1)
    with pytest.raises(ValueError, match="'blue_1' was given action index 3"):
        env.step({"red": np.array([0, 1]), "blue": np.array([0, 3])})


class WrongShape(Gridlike):
    def step_arrays(self, actions):
        obs, *rest = super().step_arrays(actions)
        return obs[:3], *rest


class OutOfBounds(Gridlike):
    def _observation(self):
        obs = super()._observation()
        obs[2, 0, 0] = 99.0
        return obs


class UnlikeSpaces(Gridlike):
    def action_space(self, agent):
        return spaces.Discrete(4 if agent == "blue_1" else 3)


def test_what_breaks_the_array_form_is_refused_in_one_line():
    env = PettingZooEnv(WrongShape(), groups=GROUPS)
    env.reset(seed=0)
    with pytest.raises(EnvAPIError, match=r"observations of shape \(3, 2, 3\).*\(4, 2, 3\)"):
        env.step({"red": np.zeros(2, int), "blue": np.zeros(2, int)})
    with pytest.raises(EnvAPIError, match="observation of agent 'red_1' lies outside"):
        PettingZooEnv(OutOfBounds(), groups=GROUPS).reset(seed=0)
    with pytest.raises(ConfigError, match=r"agent\(s\) \['blue_1'\] have other spaces"):
        PettingZooEnv(UnlikeSpaces(), groups={"red": ["red_*"], "blue": ["blue_0"], "last": ["blue_1"]})


def test_the_real_mettagrid_game_gives_the_same_steps_through_arrays_and_dicts():
    pytest.importorskip("mettagrid")
    from marlkit.envs.mettagrid import parallel_env
    small = {"num_agents": 3, "width": 10, "height": 10, "hearts": 6, "walls": 4, "max_steps": 12}
    arrays, dicts = PettingZooEnv(parallel_env(**small)), PettingZooEnv(DictsOnly(parallel_env(**small)))
    assert arrays._rows is not None
    rng = np.random.default_rng(3)
    for episode in range(2):
        assert_same(arrays.reset(seed=episode), dicts.reset(seed=episode))
        for t in range(12):
            actions = {"agents": rng.integers(0, arrays.spec.groups["agents"].n_actions, (3,))}
            got, want = arrays.step(actions), dicts.step(actions)
            for x, y in zip(got[:4], want[:4]):
                assert_same(x, y)
            assert got[4] == want[4]
        assert got[4] and got[3]["agents"].all()   # the step limit: a truncation of every agent


def test_the_examples_game_in_arrays_plays_as_its_dict_form():
    """examples/custom_env.py's Rendezvous and RendezvousInArrays: the same episodes through the adapter."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from custom_env import make_env
    arrays, dicts = PettingZooEnv(make_env(arrays=True, n_agents=4)), PettingZooEnv(make_env(n_agents=4))
    assert arrays._rows is not None and dicts._rows is None
    assert_same(arrays.reset(seed=5), dicts.reset(seed=5))
    rng = np.random.default_rng(1)
    for t in range(20):
        actions = {"agents": rng.integers(0, 3, (4,))}
        got, want = arrays.step(actions), dicts.step(actions)
        for x, y in zip(got[:4], want[:4]):
            assert_same(x, y)
        assert got[4] == want[4] == (t == 19)
