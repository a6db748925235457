"""Per-env random streams: what an env draws does not depend on how envs are batched, the values
have the distribution they claim, and a stream's state carries over exactly."""
import pickle

import numpy as np
import pytest
import torch

from marlkit.networks.distributions import Categorical, DiagGaussian
from marlkit.random_streams import EnvStreams, GeneratorNoise, StreamNoise


def test_an_env_draws_the_same_whatever_the_batch_it_is_in():
    whole = EnvStreams(5)
    first, second = whole.block(0, 3), whole.block(3, 5)
    for shape in ((1, 8, 3, 5), (1, 8, 2)):
        joint = whole.uniform(shape, env_dim=1)
        split = np.concatenate([first.uniform(shape[:1] + (3,) + shape[2:], 1),
                                second.uniform(shape[:1] + (5,) + shape[2:], 1)], 1)
        assert np.array_equal(joint, split)
    # the env dimension may sit anywhere: env 4 of a [3, E] draw is env 4 of an [E, 3] draw
    a, b = EnvStreams(9), EnvStreams(9)
    assert np.array_equal(a.normal((3, 6), env_dim=1), b.normal((6, 3), env_dim=0).T)
    # a part's streams go back where they were taken from
    whole.absorb(first)
    whole.absorb(second)
    assert np.array_equal(whole.uniform((8, 4)), np.concatenate([first.uniform((3, 4)), second.uniform((5, 4))]))


def test_streams_differ_between_envs_and_seeds_and_move_on():
    s = EnvStreams(1)
    u = s.uniform((2, 1000))
    assert not np.array_equal(u[0], u[1])
    assert not np.array_equal(u, EnvStreams(2).uniform((2, 1000)))
    assert not np.array_equal(u, s.uniform((2, 1000)))
    assert s.counters.tolist() == [2000, 2000]


def test_uniform_and_normal_have_their_distributions():
    u = EnvStreams(3).uniform((64, 20_000))
    assert u.dtype == np.float32 and 0.0 < u.min() and u.max() < 1.0
    assert u.mean() == pytest.approx(0.5, abs=2e-3) and u.var() == pytest.approx(1 / 12, abs=1e-3)
    hist = np.histogram(u, bins=10, range=(0, 1))[0] / u.size
    assert np.abs(hist - 0.1).max() < 2e-3
    # neighbouring envs are not correlated
    assert abs(np.corrcoef(u[0], u[1])[0, 1]) < 0.03
    z = EnvStreams(4).normal((32, 20_000))
    assert z.mean() == pytest.approx(0.0, abs=5e-3) and z.std() == pytest.approx(1.0, abs=5e-3)
    assert ((z - z.mean()) ** 4).mean() / z.var() ** 2 == pytest.approx(3.0, abs=0.05)


def test_a_saved_stream_goes_on_exactly():
    s = EnvStreams(7)
    s.uniform((4, 10))
    saved = pickle.loads(pickle.dumps(s.state_dict()))
    after = s.normal((4, 3))
    restored = EnvStreams(0)
    restored.load_state_dict(saved)
    assert np.array_equal(restored.normal((4, 3)), after)


@pytest.mark.parametrize("noise", [lambda: StreamNoise(EnvStreams(11), env_dim=0),
                                   lambda: GeneratorNoise(torch.Generator().manual_seed(11))])
def test_sampling_draws_from_the_distribution(noise):
    noise = noise()
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0])
    mask = probs > 0
    dist = Categorical(probs.clamp(min=1e-30).log().expand(40_000, 5), mask.expand(40_000, 5))
    counts = torch.bincount(dist.sample(noise), minlength=5) / 40_000
    torch.testing.assert_close(counts, probs, atol=8e-3, rtol=0)
    gauss = DiagGaussian(torch.full((40_000, 2), 3.0), torch.tensor([0.0, float(np.log(2.0))]))
    draws = gauss.sample(noise)
    torch.testing.assert_close(draws.mean(0), torch.tensor([3.0, 3.0]), atol=0.05, rtol=0)
    torch.testing.assert_close(draws.std(0), torch.tensor([1.0, 2.0]), atol=0.05, rtol=0)


def _acting_pair(agent):
    """An agent of 6 mpe_spread envs and a copy of it, and the first observation of those envs."""
    import copy

    from marlkit.api import build_config
    from marlkit.envs.factory import make_env_vector
    from marlkit.registry import get_agent
    cfg = build_config(agent, "mpe_spread", overrides={"runner": {"vectorize": "sync", "parallels": 6}})
    venv = make_env_vector(cfg.env, cfg.runner)
    try:
        obs = venv.reset(seed=0)
    finally:
        venv.close()
    spec = venv.spec
    one = get_agent(agent)(spec.groups["agents"], spec, cfg.agents[agent], seed=3)
    return one, copy.deepcopy(one), obs


def _act_on_halves(agent, parts, obs):
    """``agent`` acting on envs 0-2, then 3-5, each with the streams of its envs alone (``parts``,
    as two env workers of 3 envs each hold them)."""
    halves = []
    for part, rows in zip(parts, (slice(0, 3), slice(3, 6))):
        agent.streams = part
        halves.append(agent.act(obs.obs["agents"][rows], obs.state[rows], obs.agent_mask["agents"][rows],
                                obs.action_mask["agents"][rows], None, True))
    return halves


@pytest.mark.parametrize("agent", ["MAPPO", "MAT", "random"])
def test_acting_on_envs_in_two_batches_draws_as_in_one(agent):
    """An agent acting on envs 0-5, then on its copy acting on envs 0-2 and 3-5 in turn with the
    streams of those envs, draws the same noise and so picks the same actions; the log-probabilities
    agree to float rounding, as torch's matrix kernels may round a batch of 3 envs otherwise than one
    of 6 (on an AVX2 AMD EPYC, a Linear layer does for MAT's 3 x 3 rows against 6 x 3)."""
    one, two, obs = _acting_pair(agent)
    parts = [two.streams.block(0, 3), two.streams.block(3, 3)]
    for _ in range(3):
        joint = one.act(obs.obs["agents"], obs.state, obs.agent_mask["agents"], obs.action_mask["agents"], None,
                        True)
        halves = _act_on_halves(two, parts, obs)
        assert np.array_equal(joint.actions, np.concatenate([h.actions for h in halves]))
        np.testing.assert_allclose(joint.log_prob, np.concatenate([h.log_prob for h in halves]), rtol=1e-6)


@pytest.mark.exact
@pytest.mark.parametrize("agent", ["MAPPO", "MAT", "IPPO", "COMA", "random"])
def test_acting_in_blocks_is_acting_on_each_block_alone(agent):
    """``runner.act_batch: 3``: the collector acts on 6 envs in blocks of 3, which gives, bit for bit
    on any CPU, what two workers of 3 envs each give: every env in a batch of the same shape."""
    from marlkit.runners.collector import act
    one, two, obs = _acting_pair(agent)
    parts = [two.streams.block(0, 3), two.streams.block(3, 3)]
    for _ in range(3):
        joint = act({"agents": one}, obs, {"agents": None}, explore=True, block=3)["agents"]
        halves = _act_on_halves(two, parts, obs)
        assert np.array_equal(joint.actions, np.concatenate([h.actions for h in halves]))
        assert np.array_equal(joint.log_prob, np.concatenate([h.log_prob for h in halves]))
        if joint.value is not None:
            assert np.array_equal(joint.value, np.concatenate([h.value for h in halves]))
    assert np.array_equal(one.streams.counters, np.concatenate([p.counters for p in parts]))
