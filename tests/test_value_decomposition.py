"""IQL, VDN and QMIX: epsilon-greedy acting within the action mask, the replay of whole episodes,
the mixers, masked slots, learning, the refusals, and the runner's modes (workers, resume, --test)."""
import copy

import numpy as np
import pytest
import torch

import marlkit
from conftest import assert_same_training
from marlkit.agents.base import Progress
from marlkit.api import build_config
from marlkit.config import ConfigError
from marlkit.envs.factory import make_env_vector
from marlkit.envs.pettingzoo import PettingZooEnv
from marlkit.networks.mixers import QMixer, VDNMixer
from marlkit.registry import get_agent
from marlkit.storage import Bootstrap, Collected, StorageLayout, Transition
from test_masks import _corrupt

FAMILY = ["IQL", "VDN", "QMIX"]
SIGNAL = {"factory": "toy_envs:signal", "kwargs": {"n": 3, "length": 5}}
QUICK = {"runner.parallels": 4, "runner.horizon": 5, "runner.vectorize": "sync"}


def _quick(agent: str, **more) -> dict:
    """Settings that make the family learn the signal game in a few thousand steps."""
    return {**QUICK, f"agents.{agent}.epsilon_anneal_steps": 1000, f"agents.{agent}.target_update_interval": 50,
            f"agents.{agent}.batch_size": 16, **more}


def _agent_on(agent: str, factory: str, kwargs: dict, num_envs: int, **overrides):
    """``agent`` on a vector of ``num_envs`` envs of a toy factory (the vector env is returned open)."""
    cfg = build_config(agent, "mpe_spread", **overrides)
    cfg.env = PettingZooEnv.config_cls(factory=factory, kwargs=kwargs)
    cfg.runner.parallels = num_envs
    venv = make_env_vector(cfg.env, cfg.runner)
    return get_agent(agent)(venv.spec.groups["agents"], venv.spec, cfg.agents[agent], seed=5), venv


def _collect(agent, venv, horizon: int, rollouts: int, seed: int = 1):
    """``rollouts`` rollouts of ``horizon`` steps into ``agent``'s storage, as the collector fills it;
    -> (the storage, the batches, every transition in order)."""
    storage = agent.make_storage(StorageLayout(agent.group, venv.spec, venv.num_envs, horizon))
    obs, batches, steps = venv.reset(seed=seed), [], []
    for _ in range(rollouts):
        rollout = storage.next_rollout()
        for _ in range(horizon):
            out = agent.act(obs.obs["agents"], obs.state, obs.agent_mask["agents"], obs.action_mask["agents"], None,
                            True, Progress(0, 1))
            res = venv.step({"agents": out.actions})
            tr = Transition(obs.obs["agents"], obs.state, obs.agent_mask["agents"], obs.action_mask["agents"],
                            out.actions, out.log_prob, None, res.reward["agents"], res.terminated["agents"],
                            res.truncated["agents"], res.episode_end, res.final.obs["agents"], res.final.state,
                            agent_end=res.agent_end.get("agents"),
                            final_action_mask=res.final.action_mask["agents"])
            rollout.add(tr)
            steps.append(copy.deepcopy(tr))
            obs = res.next
        bootstrap = Bootstrap(obs.obs["agents"].copy(), obs.state.copy(), obs.agent_mask["agents"].copy(),
                              obs.action_mask["agents"].copy(), None)
        batches.append(storage.finish(Collected(rollout, bootstrap)))
    return storage, batches, steps


# ---------------------------------------------------------------------- acting


@pytest.mark.parametrize("epsilon", [1.0, 0.0])
def test_epsilon_greedy_never_picks_a_masked_action(epsilon):
    """Every step only half the actions are legal (the env raises on an illegal one): picked at
    random (epsilon 1) or greedily (epsilon 0), the action is always a legal one."""
    agent, venv = _agent_on("QMIX", "toy_envs:masked_choice", {"length": 20}, 4,
                            **{"agents.QMIX.epsilon_start": epsilon, "agents.QMIX.epsilon_finish": epsilon})
    try:
        obs, picked = venv.reset(seed=0), []
        for _ in range(60):
            out = agent.act(obs.obs["agents"], obs.state, obs.agent_mask["agents"], obs.action_mask["agents"], None,
                            True, Progress(0, 1))
            assert np.take_along_axis(obs.action_mask["agents"], out.actions[..., None], -1).all()
            picked.append(out.actions)
            obs = venv.step({"agents": out.actions}).next
    finally:
        venv.close()
    assert len(np.unique(np.stack(picked))) == 6   # every action, legal somewhere, was picked somewhere


def test_epsilon_falls_with_the_env_steps_and_evaluation_is_greedy():
    agent, venv = _agent_on("VDN", "toy_envs:signal", {"n": 3}, 64, **{"agents.VDN.epsilon_anneal_steps": 1000})
    try:
        obs = venv.reset(seed=0)
    finally:
        venv.close()
    assert agent.epsilon(Progress(0, 10)) == 1.0
    assert agent.epsilon(Progress(500, 10)) == pytest.approx(0.525)
    assert agent.epsilon(Progress(5000, 10)) == pytest.approx(0.05)
    args = (obs.obs["agents"], obs.state, obs.agent_mask["agents"], obs.action_mask["agents"], None)
    with torch.no_grad():
        q, _ = agent.q_values("", torch.from_numpy(obs.obs["agents"]).unsqueeze(0), None, None, None)
    greedy = q[0].argmax(-1).numpy()
    assert np.array_equal(agent.act(*args, explore=False).actions, greedy)
    # outside training (evaluation, --test: no progress given) it is greedy even where it samples
    assert agent.epsilon(None) == 0.0 and np.array_equal(agent.act(*args, True, None).actions, greedy)
    early = agent.act(*args, True, Progress(0, 10)).actions
    late = agent.act(*args, True, Progress(5000, 10)).actions
    assert (early == greedy).mean() < 0.6 < 0.9 < (late == greedy).mean()


# ---------------------------------------------------------------------- the replay


def test_the_replay_cuts_rollouts_into_whole_episodes():
    """Episodes of 7 steps collected in rollouts of 5 steps of 2 envs: each episode in the replay is
    its env's 7 steps in order, across rollout boundaries, with the observation its truncation ended
    at after them; agents that spawn late or die early are masked where they are absent."""
    agent, venv = _agent_on("QMIX", "toy_envs:scripted", {"length": 7}, 2)
    try:
        storage, batches, steps = _collect(agent, venv, horizon=5, rollouts=3)
    finally:
        venv.close()
    assert [b.new_episodes for b in batches] == [0, 2, 2]      # 15 steps of each env: episodes end at 7 and 14
    assert len(storage) == 4 and (storage.lengths[:4] == 7).all()
    ring = storage.ring
    for slot, (e, first) in enumerate([(0, 0), (1, 0), (0, 7), (1, 7)]):
        episode = steps[first:first + 7]
        assert np.array_equal(ring["obs"][slot, :7], np.stack([tr.obs[e] for tr in episode]))
        assert np.array_equal(ring["state"][slot, :7], np.stack([tr.state[e] for tr in episode]))
        assert np.array_equal(ring["agent_mask"][slot, :7], np.stack([tr.agent_mask[e] for tr in episode]))
        assert np.array_equal(ring["actions"][slot], np.stack([tr.actions[e] for tr in episode]))
        assert np.array_equal(ring["reward"][slot], np.stack([tr.reward[e] for tr in episode]))
        assert ring["truncated"][slot, 6].any() and not ring["truncated"][slot, :6].any()
        assert np.array_equal(ring["obs"][slot, 7], episode[-1].final_obs[e])   # what the cut bootstraps from
    assert not ring["agent_mask"][0, 5:7, 1].any() and not ring["agent_mask"][0, :3, 2].any()
    sample = storage.sample(3, np.random.default_rng(0))
    assert sample["obs"].shape[:2] == (3, 8) and sample["actions"].shape[:2] == (3, 7) and sample["filled"].all()


def test_a_full_replay_drops_its_oldest_episodes():
    agent, venv = _agent_on("VDN", "toy_envs:signal", {"n": 3, "length": 5}, 2, **{"agents.VDN.buffer_size": 3})
    try:
        storage, _, steps = _collect(agent, venv, horizon=5, rollouts=3)
    finally:
        venv.close()
    assert len(storage) == 3 and storage.episodes == 6
    # episodes enter in the order they end (env 0, then env 1, each rollout): the last three are
    # env 1's second, then both third ones, which went to slots 0, 1 and 2 after the ring wrapped
    for slot, (e, first) in enumerate([(1, 5), (0, 10), (1, 10)]):
        assert np.array_equal(storage.ring["obs"][slot, :5], np.stack([tr.obs[e] for tr in steps[first:first + 5]]))


# ---------------------------------------------------------------------- targets


def _forward_view(reward, next_value, continues, length, gamma, lam):
    """The lambda-return of one episode by its definition: a (1 - lam) lam^(n-1) weighted mix of the
    n-step returns, the last one carrying the remaining weight (no bootstrap past a cut return)."""
    out = []
    for t in range(length):
        n_step, total, weight, discount, ret = [], 0.0, 1.0, 1.0, 0.0
        for k in range(t, length):
            ret += discount * reward[k]
            discount *= gamma * continues[k]
            n_step.append(ret + discount * next_value[k])
        for i, g in enumerate(n_step):
            w = lam ** i * ((1 - lam) if i < len(n_step) - 1 else 1.0)
            total += w * g
        out.append(total)
    return out


@pytest.mark.parametrize("lam", [0.0, 0.6, 1.0])
def test_td_lambda_targets_are_the_lambda_returns_of_each_episode(lam):
    """Episodes of 5 and 3 steps in one batch (padding after the second), one cut by a termination:
    every taken step's target equals the forward-view lambda-return; lam 0 is the one-step target."""
    from marlkit.storage.returns import lambda_returns

    g = torch.Generator().manual_seed(0)
    reward, next_value = torch.rand(5, 2, generator=g), torch.rand(5, 2, generator=g)
    continues = torch.ones(5, 2)
    continues[2, 1] = 0.0                       # the second episode terminates at its last step
    lengths = [5, 3]
    filled = torch.arange(5)[:, None] < torch.tensor(lengths)[None]
    targets = lambda_returns(reward, next_value, continues, filled[1:], 0.9, lam)
    for b, length in enumerate(lengths):
        expected = _forward_view(reward[:, b].tolist(), next_value[:, b].tolist(), continues[:, b].tolist(),
                                 length, 0.9, lam)
        torch.testing.assert_close(targets[:length, b], torch.tensor(expected), rtol=1e-5, atol=1e-6)
    one_step = reward + 0.9 * continues * next_value
    if lam == 0.0:
        torch.testing.assert_close(targets, one_step)


@pytest.mark.parametrize("tau", [None, 0.25])
def test_target_networks_are_copied_every_interval_or_moved_by_tau(tau):
    """Hard copies (the default) every ``target_update_interval`` gradient steps and not between;
    with ``target_update_tau`` a step of that size towards the online networks after every one."""
    agent, venv = _agent_on("QMIX", "toy_envs:scripted", {"length": 7}, 2, **{
        "agents.QMIX.target_update_interval": 3, "agents.QMIX.target_update_tau": tau})
    venv.close()
    online = [k for k in agent.modules if "target_" + k in agent.modules]
    assert set(online) == {"q", "q_head", "mixer"}
    with torch.no_grad():
        for name in online:
            for p in agent.modules[name].parameters():
                p.add_(torch.randn_like(p))
    before = {n: [p.clone() for p in agent.modules["target_" + n].parameters()] for n in online}
    for steps in (1, 2, 3):
        agent.gradient_steps = steps
        agent.update_targets()
        for name in online:
            targets, sources = list(agent.modules["target_" + name].parameters()), list(agent.modules[name].parameters())
            if tau is None:
                expected = sources if steps == 3 else before[name]
            else:
                expected = [b + tau * (p - b) for b, p in zip(before[name], sources)]
                before[name] = expected
            for t, e in zip(targets, expected):
                torch.testing.assert_close(t, e)


# ---------------------------------------------------------------------- mixers


def test_vdn_sums_the_present_agents():
    q = torch.tensor([[[1.0, 2.0, 4.0]]])
    present = torch.tensor([[[True, False, True]]])
    assert VDNMixer()(q, None, present).item() == 5.0


def test_qmix_is_monotonic_and_leaves_absent_agents_out():
    torch.manual_seed(0)
    mixer = QMixer(state_dim=6, n_agents=3, embed_dim=8)
    state = torch.randn(5, 4, 6)
    q = torch.randn(5, 4, 3, requires_grad=True)
    present = torch.rand(5, 4, 3) > 0.3
    mixer(q, state, present).sum().backward()
    assert (q.grad >= 0).all()                                       # Q_tot never falls as an agent's Q rises
    assert (q.grad[~present] == 0).all()                             # an absent agent's Q does not count
    other = q.detach().clone()
    other[~present] = 1e3
    torch.testing.assert_close(mixer(other, state, present), mixer(q.detach(), state, present))


def test_qmix_state_norm_makes_the_mix_blind_to_the_state_scale():
    """With ``state_norm`` the hypernetworks read the state normalised: the same state shifted and
    scaled (MPE's positions after a drift) mixes the same Q-values to the same team Q; without it
    the team Q moves with the scale."""
    torch.manual_seed(0)
    state = torch.randn(5, 4, 6)
    q = torch.randn(5, 4, 3)
    present = torch.ones(5, 4, 3, dtype=torch.bool)
    far = 50.0 * state + 7.0
    normed = QMixer(state_dim=6, n_agents=3, embed_dim=8, state_norm=True)
    torch.testing.assert_close(normed(q, far, present), normed(q, state, present), atol=1e-4, rtol=1e-4)
    plain = QMixer(state_dim=6, n_agents=3, embed_dim=8)
    assert (plain(q, far, present) - plain(q, state, present)).abs().max() > 1.0
    cfg = build_config(agent="QMIX", env="mpe_spread")
    assert cfg.agents["QMIX"].state_norm is True                      # the packaged mpe_spread turns it on


@pytest.mark.parametrize("td_lambda", [0.0, 0.6])
@pytest.mark.parametrize("agent_name", FAMILY)
def test_masked_slots_never_affect_learning(agent_name, td_lambda):
    """Garbage in every absent slot of the replayed episodes (observations, rewards, actions, ends)
    leaves the update's metrics and weights as they are with clean slots, with one-step and
    TD(lambda) targets."""
    settings = {f"agents.{agent_name}.batch_size": 4, f"agents.{agent_name}.target_update_interval": 2,
                f"agents.{agent_name}.td_lambda": td_lambda}
    clean, venv = _agent_on(agent_name, "toy_envs:scripted", {"length": 7}, 3, **settings)
    dirty = copy.deepcopy(clean)
    try:
        storage, batches, steps = _collect(clean, venv, horizon=7, rollouts=2)
    finally:
        venv.close()
    assert sum((~t.agent_mask).sum() for t in steps) > 10
    rng = np.random.default_rng(0)
    dirty_storage = dirty.make_storage(storage.layout)
    dirty_batches = []
    for r in range(2):
        rollout = dirty_storage.next_rollout()
        for tr in steps[7 * r:7 * (r + 1)]:
            garbage = _corrupt(tr, rng)
            garbage.reward = tr.reward   # a reward reaches the team even while its agent is absent (Unity)
            rollout.add(garbage)
        dirty_batches.append(dirty_storage.finish(Collected(rollout, None)))
    for batch, dirty_batch in zip(batches, dirty_batches):   # the first holds fewer episodes than a batch
        m_clean = clean.update(batch, Progress(42, 100))
        m_dirty = dirty.update(dirty_batch, Progress(42, 100))
    assert m_clean["gradient_steps"] == 3 and m_clean.keys() == m_dirty.keys()
    for k in m_clean:
        assert m_clean[k] == pytest.approx(m_dirty[k], rel=1e-5, abs=1e-6), k
    for (name, p), q in zip(clean.modules.named_parameters(), dirty.modules.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------- learning


@pytest.mark.slow
@pytest.mark.parametrize("agent", FAMILY)
def test_learns_the_signal_game(tiny, env_yaml, agent):
    """Both agents paid only when both pick the signal they see: random play earns 5/9 per episode,
    coordination 5."""
    path = env_yaml(SIGNAL["factory"], SIGNAL["kwargs"])
    run = marlkit.run(agent=agent, env=path, mode="benchmark", seed=2, **{
        **tiny, **_quick(agent), "runner.total_steps": 3000, "runner.eval_interval": 1500,
        "runner.eval_episodes": 20, "runner.eval_parallels": 4})
    first, last = run.evaluations[0]["mean"]["agents"], run.evaluations[-1]["mean"]["agents"]
    assert run.baseline["mean"]["agents"] < 1.5 and first < 1.5
    assert last >= 4.5, [e["mean"] for e in run.evaluations]


# ---------------------------------------------------------------------- the runner's modes


@pytest.mark.exact
@pytest.mark.parametrize("agent", ["QMIX", "IQL"])
def test_resume_continues_exactly_with_the_replay(tiny, env_yaml, agent):
    """Saved at 200 steps with the replay and the episodes in progress (40-step rollouts of 4 envs,
    episodes of 5... cut across), extended to 400: the run ends where an uninterrupted one does."""
    path = env_yaml("toy_envs:scripted", {"length": 7}, env={"exact_resume": True})
    common = {**tiny, **_quick(agent), "runner.horizon": 10, "runner.save_interval": 200}
    full = marlkit.run(agent=agent, env=path, seed=4, **{**common, "runner.total_steps": 400})
    half = marlkit.run(agent=agent, env=path, seed=4, **{**common, "runner.total_steps": 200})
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 400})
    assert resumed.steps == 400 and full.metrics["agents/gradient_steps"] > 0
    assert_same_training(full, resumed)


@pytest.mark.exact
def test_acting_in_the_workers_trains_as_acting_here(tiny, env_yaml):
    """Epsilon-greedy acting in two env workers, each with its block's streams, and in this process
    on the same blocks (``act_batch``), with the collection beside the update: the same run."""
    path = env_yaml(SIGNAL["factory"], SIGNAL["kwargs"])
    common = {**tiny, **_quick("QMIX"), "runner.vectorize": "subprocess", "runner.workers": 2,
              "runner.act_batch": 2, "runner.total_steps": 400}
    here = marlkit.run(agent="QMIX", env=path, seed=3, **{**common, "runner.act_in_workers": False})
    there = marlkit.run(agent="QMIX", env=path, seed=3, **{**common, "runner.act_in_workers": True})
    assert here.metrics["agents/gradient_steps"] > 0
    assert_same_training(here, there)


@pytest.mark.slow
def test_test_mode_plays_the_greedy_policy(tmp_path, env_yaml):
    path = env_yaml(SIGNAL["factory"], SIGNAL["kwargs"])
    common = {"runner.run_root": str(tmp_path / "runs"), "runner.progress": False, "logger": "none"}
    trained = marlkit.run(agent="VDN", env=path, seed=2, **{**common, **_quick("VDN"), "runner.total_steps": 3000})
    test = marlkit.run(agent="VDN", env=path, mode="test", load=str(trained.run_dir / "latest.pt"),
                       **{**common, "runner.eval_deterministic": True, "runner.test_episodes": 8})
    assert np.mean([r["agents"] for r in test.episode_returns]) >= 4.5


# ---------------------------------------------------------------------- refusals


def test_continuous_actions_are_refused_before_any_env_starts(tiny):
    with pytest.raises(ConfigError, match=r"agents.QMIX: QMIX needs Discrete actions \(it learns one value per "
                                          r"action\), but group 'agents' has Box"):
        marlkit.run(agent="QMIX", env="mpe_spread", **{**tiny, "env.kwargs.continuous_actions": True})


def test_a_replay_that_cannot_fit_in_memory_is_refused_in_one_line(tiny):
    with pytest.raises(ConfigError, match=r"this run needs about .* GB .* agents.QMIX.buffer_size"):
        marlkit.run(agent="QMIX", env="mpe_spread", **{**tiny, "agents.QMIX.buffer_size": 10 ** 9})
