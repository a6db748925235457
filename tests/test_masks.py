"""Agent masks (agents that die or spawn late) and action masks."""
import copy

import numpy as np
import pytest
import torch
from gymnasium import spaces

import marlkit
from conftest import learn_from
from marlkit.api import build_config
from marlkit.storage import Bootstrap, Transition
from marlkit.envs.factory import make_env_vector
from marlkit.envs.pettingzoo import PettingZooEnv
from marlkit.networks.distributions import Categorical, MultiCategorical
from marlkit.random_streams import GeneratorNoise
from marlkit.registry import get_agent
from toy_envs import MaskedChoiceEnv, ScriptedEnv


def test_adapter_masks_follow_lifetimes():
    env = PettingZooEnv(ScriptedEnv(length=10))
    ob = env.reset(seed=0)
    assert list(env.groups) == ["agents"] and ob.obs["agents"].shape == (3, 4)
    masks = [ob.agent_mask["agents"].tolist()]
    for _ in range(10):
        ob, reward, terminated, truncated, over = env.step({"agents": np.zeros(3, np.int64)})
        masks.append(ob.agent_mask["agents"].tolist())
        if terminated["agents"][1]:
            assert reward["agents"][1] == 2.0 and not ob.agent_mask["agents"][1]
    assert masks[0] == [True, True, False]            # agent_2 not spawned yet
    assert masks[3] == [True, True, True]             # spawned at step 3
    assert masks[4] == [True, False, True]            # agent_1 died after its step 3
    assert over and truncated["agents"][0] and truncated["agents"][2]
    # absent agents observe zeros
    assert not env.reset(seed=0).obs["agents"][2].any()


def test_logged_returns_count_present_steps_only():
    cfg = build_config("MAPPO", "mpe_spread")
    cfg.env = PettingZooEnv.config_cls(factory="toy_envs:scripted", kwargs={"length": 10})
    cfg.runner.parallels = 2
    venv = make_env_vector(cfg.env, cfg.runner)
    try:
        venv.reset(seed=0)
        infos = []
        for _ in range(10):
            infos += [i for i in venv.step({"agents": np.zeros((2, 3), np.int64)}).infos if "episode" in i]
    finally:
        venv.close()
    # agent_0: 10 steps x 1, agent_1: 4 steps x 2, agent_2: 7 steps x 3 -> mean over agents 13
    assert [i["episode"]["return"]["agents"] for i in infos] == [13.0, 13.0]
    assert [i["episode"]["length"] for i in infos] == [10, 10]


def _rollout(agent, venv, horizon, seed):
    """Act for one rollout with ``agent``; -> its transitions and the bootstrap after them."""
    obs = venv.reset(seed=seed)
    transitions = []
    for _ in range(horizon):
        out = agent.act(obs.obs["agents"], obs.state, obs.agent_mask["agents"], obs.action_mask["agents"], None)
        res = venv.step({"agents": out.actions})
        transitions.append(Transition(obs.obs["agents"], obs.state, obs.agent_mask["agents"],
                                      obs.action_mask["agents"], out.actions, out.log_prob, out.value,
                                      res.reward["agents"], res.terminated["agents"], res.truncated["agents"],
                                      res.episode_end, res.final.obs["agents"], res.final.state))
        obs = res.next
    return transitions, Bootstrap(obs.obs["agents"], obs.state, obs.agent_mask["agents"], obs.action_mask["agents"],
                                  None)


def _corrupt(tr: Transition, rng) -> Transition:
    """Garbage in every absent slot (finite: NaN would be a different bug)."""
    tr = copy.deepcopy(tr)
    absent = ~tr.agent_mask
    tr.obs[absent] = rng.uniform(-1e3, 1e3, tr.obs[absent].shape)
    tr.reward[absent] = rng.uniform(-1e3, 1e3, tr.reward[absent].shape)
    tr.log_prob[absent] = rng.uniform(-10, 0, tr.log_prob[absent].shape)
    tr.actions[absent] = rng.integers(0, 3, tr.actions[absent].shape)
    tr.terminated[absent] = rng.random(tr.terminated[absent].shape) < 0.5
    return tr


@pytest.mark.parametrize("agent_name", ["MAPPO", "IPPO"])
def test_masked_slots_never_affect_learning(agent_name):
    cfg = build_config(agent_name, "mpe_spread", **{"agents." + agent_name + ".epochs": 2})
    cfg.env = PettingZooEnv.config_cls(factory="toy_envs:scripted", kwargs={"length": 10})
    cfg.runner.parallels = 3
    venv = make_env_vector(cfg.env, cfg.runner)
    spec = venv.spec
    make = lambda: get_agent(agent_name)(spec.groups["agents"], spec, cfg.agents[agent_name], seed=5)  # noqa: E731
    clean, dirty = make(), make()
    dirty.load_state_dict(clean.state_dict())
    try:
        transitions, bootstrap = _rollout(clean, venv, 16, seed=1)
    finally:
        venv.close()
    assert sum((~t.agent_mask).sum() for t in transitions) > 10   # the rollout really has absent slots
    rng = np.random.default_rng(0)
    bad_bootstrap = copy.deepcopy(bootstrap)
    bad_bootstrap.obs[~bad_bootstrap.agent_mask] = 777.0
    m_clean = learn_from(clean, transitions, bootstrap)
    m_dirty = learn_from(dirty, [_corrupt(tr, rng) for tr in transitions], bad_bootstrap)
    assert m_clean.keys() == m_dirty.keys()
    for k in m_clean:
        assert m_clean[k] == pytest.approx(m_dirty[k], rel=1e-5, abs=1e-7), k
    for (name, p), q in zip(clean.modules.named_parameters(), dirty.modules.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=name)


def test_categorical_never_samples_masked_actions():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5000, 7, generator=g) * 5
    mask = torch.rand(5000, 7, generator=g) < 0.4
    mask[torch.arange(5000), torch.randint(0, 7, (5000,), generator=g)] = True   # at least one legal
    dist = Categorical(logits, mask)
    noise = GeneratorNoise(g)
    for _ in range(3):
        a = dist.sample(noise)
        assert mask[torch.arange(5000), a].all()
    assert mask[torch.arange(5000), dist.mode()].all()
    assert torch.isfinite(dist.entropy()).all() and torch.isfinite(dist.log_prob(dist.sample(noise))).all()
    # probability mass sits on legal actions only
    assert torch.allclose(dist.log_probs.exp()[~mask], torch.zeros(()), atol=0)


def test_multidiscrete_masks():
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(3000, 3 + 4, generator=g) < 0.5
    mask[:, 0] = mask[:, 3] = True
    dist = MultiCategorical(torch.randn(3000, 7, generator=g), [3, 4], mask)
    a = dist.sample(GeneratorNoise(g))
    assert mask[torch.arange(3000), a[:, 0]].all() and mask[torch.arange(3000), 3 + a[:, 1]].all()


@pytest.mark.slow
@pytest.mark.parametrize("agent_name", ["MAPPO", "random"])
def test_training_never_sends_an_illegal_action(env_yaml, tiny, agent_name):
    """MaskedChoiceEnv raises on any illegal action; thousands of draws go through it."""
    path = env_yaml("toy_envs:masked_choice", {"length": 20})
    overrides = {**tiny, "runner.parallels": 4, "runner.horizon": 20, "runner.total_steps": 3200}
    result = marlkit.run(agent=agent_name, env=path, **overrides)
    assert result.steps == 3200
    assert len(result.episode_returns) == 100   # the runner keeps the last 100 episodes


def test_action_mask_from_obs_dict_reaches_agents():
    env = PettingZooEnv(MaskedChoiceEnv(length=5))
    assert isinstance(env.groups["agents"].observation_space, spaces.Box)  # mask stripped from the obs space
    ob = env.reset(seed=0)
    expected = np.stack([env.env.legal(a, 0) for a in env.env.possible_agents]).astype(bool)
    np.testing.assert_array_equal(ob.action_mask["agents"], expected)
