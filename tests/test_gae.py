"""GAE against hand-computed values, with termination, truncation and masked slots."""
import numpy as np
import pytest

from marlkit.storage.returns import compute_gae

G, L = 0.9, 0.8


def gae(reward, value, terminated, truncated, episode_end, mask, trunc_value, last_value):
    arr = lambda x, dt=np.float32: np.asarray(x, dt).reshape(len(reward), 1, 1)  # noqa: E731
    adv, ret = compute_gae(arr(reward), arr(value), arr(terminated, bool), arr(truncated, bool),
                           np.asarray(episode_end, bool).reshape(-1, 1), arr(mask, bool), arr(trunc_value),
                           np.full((1, 1), last_value, np.float32), G, L)
    return adv.ravel(), ret.ravel()


def test_termination_and_truncation_by_hand():
    # t:            0     1     2(trunc)  3     4(term)  5
    reward = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    value = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    terminated = [0, 0, 0, 0, 1, 0]
    truncated = [0, 0, 1, 0, 0, 0]
    episode_end = [0, 0, 1, 0, 1, 0]
    trunc_value = [0, 0, 10.0, 0, 0, 0]      # value of the final observation after step 2
    last_value = 7.0
    adv, ret = gae(reward, value, terminated, truncated, episode_end, [1] * 6, trunc_value, last_value)
    # step 5: bootstraps from the value after the rollout
    d5 = 6.0 + G * 7.0 - 3.0
    a5 = d5
    # step 4: terminated -> successor worth 0, no flow from step 5
    d4 = 5.0 + 0.0 - 2.5
    a4 = d4
    # step 3: ordinary
    d3 = 4.0 + G * 2.5 - 2.0
    a3 = d3 + G * L * a4
    # step 2: truncated -> successor is the final observation's value, no flow from step 3
    d2 = 3.0 + G * 10.0 - 1.5
    a2 = d2
    d1 = 2.0 + G * 1.5 - 1.0
    a1 = d1 + G * L * a2
    d0 = 1.0 + G * 1.0 - 0.5
    a0 = d0 + G * L * a1
    expected = np.array([a0, a1, a2, a3, a4, a5], np.float32)
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    np.testing.assert_allclose(ret, expected + np.array(value, np.float32), rtol=1e-6)


def test_masked_slots_are_skipped_and_never_leak():
    reward = [1.0, 99.0, 2.0, 3.0]
    value = [0.5, -50.0, 1.0, 1.5]
    mask = [1, 0, 1, 1]                        # absent at step 1 (garbage there)
    adv, ret = gae(reward, value, [0] * 4, [0] * 4, [0] * 4, mask, [0] * 4, 4.0)
    a3 = 3.0 + G * 4.0 - 1.5
    a2 = 2.0 + G * 1.5 - 1.0 + G * L * a3
    # successor: next *present* step (2); the reward that reached the agent while absent (step 1)
    # belongs to its last action (an agent deciding every other step is paid when it next decides)
    a0 = 1.0 + 99.0 + G * 1.0 - 0.5 + G * L * a2
    np.testing.assert_allclose(adv, [a0, 0.0, a2, a3], rtol=1e-6)
    assert ret[1] == 0.0
    # whatever the value in the absent slot, nothing changes
    adv2, _ = gae(reward, [0.5, 1e6, 1.0, 1.5], [0] * 4, [0] * 4, [0] * 4, mask, [0] * 4, 4.0)
    np.testing.assert_array_equal(adv, adv2)


def test_agent_that_spawns_late_and_dies_early():
    # absent at 0-1, present 2-3 (terminated at 3), absent 4-5
    mask = [0, 0, 1, 1, 0, 0]
    terminated = [0, 0, 0, 1, 0, 0]
    reward = [7.0, 7.0, 1.0, 2.0, 7.0, 7.0]
    value = [9.0, 9.0, 0.5, 1.0, 9.0, 9.0]
    adv, _ = gae(reward, value, terminated, [0] * 6, [0] * 6, mask, [0] * 6, 123.0)
    a3 = 2.0 - 1.0
    a2 = 1.0 + G * 1.0 - 0.5 + G * L * a3
    np.testing.assert_allclose(adv, [0, 0, a2, a3, 0, 0], rtol=1e-6)


def test_vectorised_shapes_match_per_slot_computation():
    rng = np.random.default_rng(0)
    T, E, A = 12, 3, 4
    data = dict(reward=rng.normal(size=(T, E, A)).astype(np.float32), value=rng.normal(size=(T, E, A)).astype(np.float32),
                terminated=rng.random((T, E, A)) < 0.1, truncated=rng.random((T, E, A)) < 0.1,
                mask=rng.random((T, E, A)) < 0.8, trunc=rng.normal(size=(T, E, A)).astype(np.float32))
    episode_end = rng.random((T, E)) < 0.15
    last = rng.normal(size=(E, A)).astype(np.float32)
    adv, _ = compute_gae(data["reward"], data["value"], data["terminated"], data["truncated"], episode_end,
                         data["mask"], data["trunc"], last, G, L)
    for e in range(E):
        for a in range(A):
            one, _ = gae(data["reward"][:, e, a], data["value"][:, e, a], data["terminated"][:, e, a],
                         data["truncated"][:, e, a], episode_end[:, e], data["mask"][:, e, a], data["trunc"][:, e, a],
                         last[e, a])
            np.testing.assert_allclose(adv[:, e, a], one, rtol=1e-6, atol=1e-6)
    assert adv.shape == (T, E, A) and not adv[~data["mask"]].any()


@pytest.mark.parametrize("gamma", [0.0, 1.0])
def test_edge_discounts(gamma):
    reward = np.ones((3, 1, 1), np.float32)
    value = np.zeros((3, 1, 1), np.float32)
    z = np.zeros((3, 1, 1), bool)
    adv, _ = compute_gae(reward, value, z, z, np.zeros((3, 1), bool), ~z, value, np.zeros((1, 1), np.float32), gamma, 1.0)
    assert adv.ravel().tolist() == ([1.0, 1.0, 1.0] if gamma == 0.0 else [3.0, 2.0, 1.0])


def test_bootstrap_of_slots_absent_after_the_rollout():
    from marlkit.storage.returns import last_present_value
    value = np.arange(12, dtype=np.float32).reshape(4, 1, 3)
    mask = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 0]], bool).reshape(4, 1, 3)
    # slot 0 last present at t=1 (value 3), slot 1 at t=2 (value 7), slot 2 never (0)
    np.testing.assert_array_equal(last_present_value(value, mask), [[3.0, 7.0, 0.0]])


def test_importance_weighs_each_td_error_and_the_trace_through_it():
    """V-trace's form with rho_t = c_t = w_t: A_t = w_t (delta_t + gamma lambda A_{t+1}), by hand,
    and weights of 1 give plain GAE bit for bit."""
    reward, value, last_value = [1.0, 0.0, 2.0], [0.5, 1.0, 1.5], 3.0
    w = [0.5, 1.0, 0.25]
    z = np.zeros((3, 1, 1), bool)
    args = (np.asarray(reward, np.float32).reshape(3, 1, 1), np.asarray(value, np.float32).reshape(3, 1, 1), z, z,
            np.zeros((3, 1), bool), ~z, np.zeros((3, 1, 1), np.float32), np.full((1, 1), last_value, np.float32), G, L)
    adv, ret = compute_gae(*args, importance=np.asarray(w, np.float32).reshape(3, 1, 1))
    a2 = 0.25 * (2.0 + G * 3.0 - 1.5)
    a1 = 1.0 * (0.0 + G * 1.5 - 1.0 + G * L * a2)
    a0 = 0.5 * (1.0 + G * 1.0 - 0.5 + G * L * a1)
    np.testing.assert_allclose(adv.ravel(), [a0, a1, a2], rtol=1e-6)
    np.testing.assert_allclose(ret.ravel(), np.array([a0, a1, a2]) + value, rtol=1e-6)
    plain, _ = compute_gae(*args)
    ones, _ = compute_gae(*args, importance=np.ones((3, 1, 1), np.float32))
    assert np.array_equal(plain, ones)


def test_every_slot_present_gives_the_masked_computation_bit_for_bit():
    """Where every slot is present, GAE runs a faster path (all steps at once but the recursion);
    its numbers are those of the general one, which an extra, always absent slot forces here:
    slots do not see each other, so the present ones come out the same."""
    rng = np.random.default_rng(0)
    T, E, A = 40, 3, 2
    reward = (rng.normal(size=(T, E, A + 1)) * (rng.random((T, E, A + 1)) < 0.3)).astype(np.float32)
    value = rng.normal(size=(T, E, A + 1)).astype(np.float32)
    terminated = rng.random((T, E, A + 1)) < 0.05
    truncated = (rng.random((T, E, A + 1)) < 0.05) & ~terminated
    episode_end = rng.random((T, E)) < 0.05
    truncation_value = rng.normal(size=(T, E, A + 1)).astype(np.float32)
    last_value = rng.normal(size=(E, A + 1)).astype(np.float32)
    importance = np.minimum(np.exp(0.2 * rng.normal(size=(T, E, A + 1))), 1.0).astype(np.float32)
    mask = np.ones((T, E, A + 1), bool)
    mask[..., A] = False
    for weights in (None, importance):
        general = compute_gae(reward, value, terminated, truncated, episode_end, mask, truncation_value, last_value,
                              G, L, weights)
        fast = compute_gae(*(x[..., :A] for x in (reward, value, terminated, truncated)), episode_end, mask[..., :A],
                           truncation_value[..., :A], last_value[..., :A], G, L,
                           None if weights is None else weights[..., :A])
        for g, f in zip(general, fast):
            assert f.dtype == np.float32 and np.array_equal(g[..., :A], f)
