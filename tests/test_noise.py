"""Per-env random streams: what an env draws does not depend on how envs are batched, the values
have the distribution they claim, and a stream's state carries over exactly."""
import pickle

import numpy as np
import pytest
import torch

import marlkit
from marlkit.networks.distributions import Categorical, DiagGaussian
from marlkit.networks.noise import EnvStreams, GeneratorNoise, StreamNoise


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


@pytest.mark.parametrize("agent", ["MAPPO", "MAT", "random"])
def test_acting_on_envs_in_two_batches_draws_as_in_one(agent):
    """An agent acting on envs 0-5, then on its copy acting on envs 0-2 and 3-5 in turn with the
    streams of those envs, picks the same actions with the same log-probabilities."""
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
    cls = get_agent(agent)
    one = cls(spec.groups["agents"], spec.state_shape, cfg.agents[agent], 6, 25, seed=3, state_dtype=spec.state_dtype,
              state_from_obs=spec.state_from_obs)
    two = copy.deepcopy(one)
    parts = [two.streams.block(0, 3), two.streams.block(3, 3)]

    def act(a, rows):
        return a.act(obs.obs["agents"][rows], obs.state[rows], obs.agent_mask["agents"][rows],
                     obs.action_mask["agents"][rows], None, True)

    for _ in range(3):
        joint = act(one, slice(0, 6))
        halves = []
        for part, rows in zip(parts, (slice(0, 3), slice(3, 6))):
            two.streams = part
            halves.append(act(two, rows))
        assert np.array_equal(joint.actions, np.concatenate([h.actions for h in halves]))
        assert np.array_equal(joint.log_prob, np.concatenate([h.log_prob for h in halves]))
