"""MAPPO/IPPO specifics: critic inputs, continuous actions, the GRU policy, learning progress."""
import numpy as np
import pytest
import torch

import marlkit
from conftest import LEARNING
from marlkit.api import build_config
from marlkit.envs.pettingzoo import PettingZooEnv
from marlkit.registry import get_agent
from mpe2 import simple_spread_v3


def _agent(name, env, **cfg_overrides):
    cfg = build_config(name, "mpe_spread", **cfg_overrides)
    return get_agent(name)(env.groups["agents"], env.spec, cfg.agents[name])


def test_mappo_critic_sees_state_and_ippo_critic_sees_obs():
    env = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25))
    mappo, ippo = _agent("MAPPO", env), _agent("IPPO", env)
    # MAPPO: env.state() (54) + agent id (3), its first layer computed once per env step;
    # IPPO: own obs (18) + agent id (3)
    assert mappo.modules["critic"].net[0].normalized_shape == (57,)
    assert ippo.modules["critic"].net[0].normalized_shape == (21,)
    assert env.spec.state_shape == (54,)
    obs = torch.zeros(1, 2, 3, 18)
    state = torch.randn(1, 2, 54)
    v1, _ = mappo.values(obs, state, None, None)
    v2, _ = mappo.values(obs, torch.randn(1, 2, 54), None, None)
    assert v1.shape == (1, 2, 3) and not torch.allclose(v1, v2)       # depends on the state...
    w1, _ = ippo.values(obs, state, None, None)
    w2, _ = ippo.values(obs, torch.randn(1, 2, 54), None, None)
    torch.testing.assert_close(w1, w2)                                # ...IPPO's does not


def test_agent_id_one_hot_can_be_switched_off():
    env = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25))
    agent = _agent("IPPO", env, **{"agents.IPPO.use_agent_id": False})
    assert agent.modules["critic"].net[0].normalized_shape == (18,)


def test_act_shapes_and_deterministic_mode():
    env = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25))
    agent = _agent("MAPPO", env)
    ob = env.reset(seed=0)
    batch = lambda x: np.stack([x, x])  # noqa: E731
    out = agent.act(batch(ob.obs["agents"]), batch(ob.state), batch(ob.agent_mask["agents"]),
                    batch(ob.action_mask["agents"]), None, explore=False)
    assert out.actions.shape == (2, 3) and out.log_prob.shape == (2, 3) and out.value is None
    np.testing.assert_array_equal(out.actions[0], out.actions[1])     # same input, argmax -> same action


def test_continuous_actions_train_and_stay_in_bounds(tiny):
    run = marlkit.run(agent="MAPPO", env="mpe_spread", **{**tiny, "env.kwargs.continuous_actions": True,
                                                          "runner.total_steps": 200})
    assert np.isfinite(run.metrics["agents/policy_loss"]) and np.isfinite(run.metrics["agents/entropy"])
    env = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=True))
    # Gaussian samples outside [0, 1] are clipped to the Box before they reach the env
    assert np.array_equal(env._env_action("agent_0", np.array([-3.0, 0.5, 2.0, 0.2, 1.5], np.float32)),
                          np.array([0.0, 0.5, 1.0, 0.2, 1.0], np.float32))


def test_gru_policy_trains_on_chunks_and_resets_hidden_state(tiny):
    overrides = {**tiny, "runner.parallels": 2, "runner.horizon": 50, "runner.total_steps": 300,
                 "agents.MAPPO.actor.name": "gru", "agents.MAPPO.critic.name": "gru", "agents.MAPPO.chunk_length": 10}
    run = marlkit.run(agent="MAPPO", env="mpe_spread", **overrides)
    assert np.isfinite(run.metrics["agents/value_loss"])
    env = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25))
    cfg = build_config("MAPPO", "mpe_spread", **{k: v for k, v in overrides.items()
                                                 if k.startswith("agents.") or k == "runner.horizon"})
    agent = get_agent("MAPPO")(env.groups["agents"], env.spec, cfg.agents["MAPPO"])
    assert agent.recurrent and agent.chunk_length(50) == 10
    gru = agent.modules["actor"]
    x = torch.randn(4, 3, 21)
    start = torch.tensor([[False] * 3, [False] * 3, [True] * 3, [False] * 3])
    h0 = torch.randn(3, 64)
    seq, _ = gru(x, h0, start)
    # from the reset on, the output equals a fresh run from a zero hidden state
    fresh, _ = gru(x[2:], torch.zeros(3, 64), None)
    torch.testing.assert_close(seq[2:], fresh)
    # and before it, the given hidden state matters
    other, _ = gru(x, torch.zeros(3, 64), start)
    assert not torch.allclose(seq[:2], other[:2])


@pytest.mark.parametrize("overrides,message", [
    ({"agents.MAPPO.actor.name": "gru", "agents.MAPPO.chunk_length": 7},
     "agents.MAPPO.chunk_length=7 must divide runner.horizon=25"),
    ({"agents.MAPPO.actor.name": "grux"}, "agents.MAPPO.actor.name: unknown model 'grux' (did you mean 'gru'?)"),
    ({"agents.MAPPO.critic.name": "gru", "agents.MAPPO.critic.kwargs.encoder": "cnnn"},
     "agents.MAPPO.critic.kwargs.encoder: unknown model 'cnnn' (did you mean 'cnn'?)"),
    ({"agents.MAPPO.actor.name": "gru", "agents.MAPPO.critic.name": "gru", "agents.MAPPO.critic.rnn_hidden": 32},
     "agents.MAPPO: a recurrent actor and critic need the same rnn_hidden, got actor.rnn_hidden=64 and "
     "critic.rnn_hidden=32"),
    ({"agents.MAPPO": 5}, "agents.MAPPO: expected a mapping of MAPPO settings, got 5"),
])
def test_agent_settings_that_cannot_work_fail_before_any_env(overrides, message):
    from marlkit.config import ConfigError
    with pytest.raises(ConfigError) as err:
        build_config("MAPPO", "mpe_spread", **overrides)
    assert message in str(err.value)


def test_advantage_refresh_is_refused_where_advantages_are_not_gae_over_the_values():
    from marlkit.config import ConfigError
    with pytest.raises(ConfigError, match=r"agents\.COMA\.advantage_refresh: COMA computes its advantages its own way"):
        build_config("COMA", "mpe_spread", **{"agents.COMA.advantage_refresh": "epoch"})


def test_vtrace_clip_without_a_refresh_is_refused():
    from marlkit.config import ConfigError
    with pytest.raises(ConfigError, match=r"agents\.MAPPO\.vtrace_clip=1\.0 weighs .* set it to minibatch"):
        build_config("MAPPO", "mpe_spread", **{"agents.MAPPO.vtrace_clip": 1.0})


def _refreshed_update(tiny, monkeypatch, **overrides):
    """One MAPPO update of 3 epochs x 4 minibatches with ``advantage_refresh`` and raw advantages:
    -> (the advantages and returns each epoch began with, [(agent, its weights, minibatch)] per
    gradient step)."""
    import copy

    from marlkit.agents import on_policy
    from marlkit.agents.mappo import MAPPO
    epochs, steps = [], []
    real_minibatches, real_loss = on_policy.minibatches, MAPPO.loss

    def recording_minibatches(data, *args, **kwargs):
        epochs.append({key: data[key].copy() for key in ("advantages", "returns")})
        yield from real_minibatches(data, *args, **kwargs)

    def recording_loss(self, batch):
        steps.append((self, copy.deepcopy(self.modules.state_dict()), batch))
        return real_loss(self, batch)

    monkeypatch.setattr(on_policy, "minibatches", recording_minibatches)
    monkeypatch.setattr(MAPPO, "loss", recording_loss)
    marlkit.run(agent="MAPPO", env="mpe_spread", **{**tiny, "runner.total_steps": 20,
                                                     "agents.MAPPO.advantage_refresh": "epoch", "agents.MAPPO.epochs": 3,
                                                     "agents.MAPPO.minibatches": 4,
                                                     "agents.MAPPO.advantage_norm": False, **overrides})
    assert len(epochs) == 3 and len(steps) == 12
    return epochs, steps


def test_refreshed_advantages_are_gae_over_the_values_the_critic_gave_in_the_epoch_before(tiny, monkeypatch):
    """Before each later epoch, returns - advantages (GAE's identity) are the values the critic gave
    each sample in the epoch before, with its weights of that minibatch, computed again here."""
    epochs, steps = _refreshed_update(tiny, monkeypatch)
    agent = steps[0][0]
    for epoch in (1, 2):
        values = np.zeros_like(epochs[epoch]["returns"]).reshape(20, -1)   # [T * E, A]
        for _, weights, batch in steps[4 * (epoch - 1):4 * epoch]:
            agent.modules.load_state_dict(weights)
            with torch.no_grad():
                value, _ = agent.values(batch["obs"], batch["state"], None, batch["episode_start"],
                                        batch["agent_mask"])
                values[batch["rows"].reshape(-1).numpy()] = agent._denormalize(value).reshape(-1, 3).numpy()
        fresh = epochs[epoch]["returns"] - epochs[epoch]["advantages"]
        np.testing.assert_allclose(fresh.reshape(20, -1), values, atol=1e-5)
        # the critic moved, and the advantages with it
        assert np.abs(epochs[epoch]["advantages"] - epochs[epoch - 1]["advantages"]).max() > 1e-3


@pytest.mark.parametrize("model", [{}, {"agents.MAPPO.actor.name": "gru", "agents.MAPPO.chunk_length": 5}],
                         ids=["feed-forward", "gru-chunks"])
def test_refreshed_advantages_are_the_rollouts_own_while_the_critic_stands_still(tiny, monkeypatch, model):
    """With no learning, every sample's refreshed value is the one it was collected with: the
    refresh puts each value back in its own (t, e) slot, also from chunks of a recurrent actor.
    (Without value normalisation, whose statistics take in the update's returns and so move every
    real-scale value.)"""
    epochs, _ = _refreshed_update(tiny, monkeypatch, **{"agents.MAPPO.lr": 0.0, "agents.MAPPO.value_norm": False,
                                                        **model})
    for later in epochs[1:]:
        np.testing.assert_allclose(later["advantages"], epochs[0]["advantages"], atol=1e-5)
        np.testing.assert_allclose(later["returns"], epochs[0]["returns"], atol=1e-5)


@pytest.mark.parametrize("vtrace", [False, True], ids=["values", "values-and-vtrace"])
def test_minibatch_refresh_recomputes_gae_before_every_minibatch_from_the_latest_values(tiny, monkeypatch, vtrace):
    """``advantage_refresh: minibatch``: each minibatch after the first sees GAE over the values (and
    with ``vtrace_clip`` 1, the ratios min(1, ratio)) each sample got in its latest minibatch, with
    that minibatch's weights, computed again here; a sample not yet seen keeps its rollout value and
    a weight of 1; the value clip is centred on the latest values."""
    import copy

    from marlkit.agents import on_policy
    from marlkit.agents.mappo import MAPPO
    from marlkit.storage.returns import compute_gae
    steps, refreshes = [], []
    real_loss, real_init = MAPPO.loss, on_policy.AdvantageRefresh.__init__

    def recording_loss(self, batch):
        steps.append((self, copy.deepcopy(self.modules.state_dict()), {k: v.clone() for k, v in batch.items()}))
        return real_loss(self, batch)

    def recording_init(self, *args):
        real_init(self, *args)
        refreshes.append(self)

    monkeypatch.setattr(MAPPO, "loss", recording_loss)
    monkeypatch.setattr(on_policy.AdvantageRefresh, "__init__", recording_init)
    marlkit.run(agent="MAPPO", env="mpe_spread", **{**tiny, "runner.total_steps": 20, "agents.MAPPO.epochs": 2,
                                                     "agents.MAPPO.minibatches": 4, "agents.MAPPO.advantage_norm": False,
                                                     "agents.MAPPO.value_norm": False,
                                                     "agents.MAPPO.advantage_refresh": "minibatch",
                                                     "agents.MAPPO.vtrace_clip": 1.0 if vtrace else None})
    assert len(refreshes) == 1 and len(steps) == 8
    refresh, agent = refreshes[0], steps[0][0]
    r = refresh.rollout
    value, ratio = r.value.reshape(20, 3).copy(), np.ones((20, 3), np.float32)
    first_old_value = steps[0][2]["old_value"]
    seen = np.zeros(20, bool)
    for j, (_, weights, batch) in enumerate(steps):
        rows = batch["rows"].reshape(-1).numpy()
        if j:
            importance = np.minimum(ratio, 1.0).reshape(r.value.shape) if vtrace else None
            adv, ret = compute_gae(r.reward, value.reshape(r.value.shape), r.terminated, r.truncated, r.episode_end,
                                   r.agent_mask, refresh.truncation_value, refresh.last_value, agent.cfg.gamma,
                                   agent.cfg.gae_lambda, importance)
            np.testing.assert_allclose(batch["advantages"].reshape(-1, 3), adv.reshape(20, 3)[rows], atol=1e-5)
            np.testing.assert_allclose(batch["returns"].reshape(-1, 3), ret.reshape(20, 3)[rows], atol=1e-5)
            old = batch["old_value"].reshape(-1, 3).numpy()
            np.testing.assert_allclose(old[seen[rows]], value[rows][seen[rows]], atol=1e-5)
        else:
            np.testing.assert_array_equal(batch["old_value"], first_old_value)
        agent.modules.load_state_dict(weights)
        with torch.no_grad():
            v, _ = agent.values(batch["obs"], batch["state"], None, batch["episode_start"], batch["agent_mask"])
            dist, _ = agent.policy(batch["obs"], batch["state"], None, batch["episode_start"], batch["action_mask"],
                                   batch["agent_mask"])
            log_prob = dist.log_prob(batch["actions"])
        value[rows] = v.reshape(-1, 3).numpy()
        ratio[rows] = (log_prob - batch["log_prob"]).exp().reshape(-1, 3).numpy()
        seen[rows] = True
    # the critic and the policy moved within the update, and the advantages with them
    assert np.abs(value - r.value.reshape(20, 3)).max() > 1e-3
    if vtrace:
        assert np.abs(ratio - 1.0).max() > 1e-3


def test_an_agent_absent_after_the_rollout_bootstraps_from_its_refreshed_value():
    """Its bootstrap is its own last value (it is not there to be valued): when the critic's values
    move, that bootstrap moves with them, so a constant shift of every value leaves its advantage
    r + gamma * (V + 2) - (V + 2), not r + gamma * V - (V + 2)."""
    from marlkit.agents.on_policy import AdvantageRefresh
    from marlkit.storage import RolloutBatch
    from marlkit.storage.layout import Bootstrap
    from marlkit.storage.rollout import Rollout
    env = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25))
    agent = _agent("MAPPO", env, **{"agents.MAPPO.value_norm": False, "agents.MAPPO.advantage_norm": False})
    rollout = Rollout(2, 1, 3, (18,), np.float32, (54,), (), np.int64, 5)
    rollout.agent_mask[:] = [[[True, True, True]], [[True, True, False]]]   # agent 2 leaves after t=0
    rollout.value[:] = [[[1.0, 2.0, 3.0]], [[1.5, 2.5, 0.0]]]
    rollout.reward[:] = 0.5
    rollout.reward[1, 0, 2] = 0.0   # an absent step's reward would be owed to its last action
    bootstrap = Bootstrap(np.zeros((1, 3, 18), np.float32), np.zeros((1, 54), np.float32),
                          np.array([[True, True, False]]), np.ones((1, 3, 5), bool), None)
    critic_bootstrap = np.array([[4.0, 5.0, 0.0]], np.float32)
    last_value = np.where(bootstrap.agent_mask, critic_bootstrap, rollout.value[0])   # agent 2: its value at t=0
    refresh = AdvantageRefresh(agent, RolloutBatch(rollout, bootstrap, np.zeros((2, 1, 3), bool)), last_value,
                               np.zeros_like(rollout.value))
    refresh.record(torch.arange(2).reshape(2, 1), torch.from_numpy(rollout.value + 2.0), torch.zeros(2, 1, 3))
    data = {}
    refresh.apply(data)
    gamma = agent.cfg.gamma
    assert data["advantages"][0, 0, 2] == pytest.approx(0.5 + gamma * 5.0 - 5.0)
    assert data["advantages"][1, 0, 2] == 0.0   # absent
    # a present agent still bootstraps from the critic's value after the rollout
    assert data["advantages"][1, 0, 0] == pytest.approx(0.5 + gamma * 4.0 - 3.5)


def test_a_refresh_with_values_no_loss_recorded_is_an_error_not_zeros():
    from marlkit.agents.on_policy import AdvantageRefresh
    from marlkit.storage import RolloutBatch
    from marlkit.storage.layout import Bootstrap
    from marlkit.storage.rollout import Rollout
    env = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25))
    agent = _agent("MAPPO", env, **{"agents.MAPPO.value_norm": False})
    rollout = Rollout(2, 1, 3, (18,), np.float32, (54,), (), np.int64, 5)
    rollout.agent_mask[:] = True
    bootstrap = Bootstrap(np.zeros((1, 3, 18), np.float32), np.zeros((1, 54), np.float32), np.ones((1, 3), bool),
                          np.ones((1, 3, 5), bool), None)
    refresh = AdvantageRefresh(agent, RolloutBatch(rollout, bootstrap, np.zeros((2, 1, 3), bool)),
                               np.zeros((1, 3), np.float32), np.zeros((2, 1, 3), np.float32))
    refresh.record(torch.arange(1).reshape(1, 1), torch.zeros(1, 1, 3), torch.zeros(1, 1, 3))   # t=1 never recorded
    with pytest.raises(RuntimeError, match="no loss recorded"):
        refresh.apply({})


def test_gru_default_chunk_is_the_whole_rollout():
    cfg = build_config("MAPPO", "mpe_spread", **{"agents.MAPPO.actor.name": "gru"})
    env = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25))
    agent = get_agent("MAPPO")(env.groups["agents"], env.spec, cfg.agents["MAPPO"])
    assert agent.chunk_length(25) == 25


@pytest.mark.slow
@pytest.mark.parametrize("agent,budget", [("MAPPO", 30_000), ("IPPO", 20_000)])
def test_learns_on_mpe_spread(tiny, agent, budget):
    """Clearly better than the random policy (about -26.6, mean over agents) within 30k env steps
    for MAPPO, 20k for IPPO: with the env workers of the packaged YAML (the rollout overlapping the
    update), the last 64 episodes' mean at 30k was -22.0, -22.3 and -23.4 on seeds 1-3 for MAPPO,
    -21.5, -22.0 and -21.4 for IPPO (at 20k one MAPPO seed sat at -24.7 in bfloat16); here, envs
    stepped in this process, MAPPO gives -21.9, -21.8 and -21.4 at 30k (-23.2, -22.5 and -22.1 at
    20k), IPPO -21.3, -22.2 and -21.5 at 20k."""
    common = {**tiny, **LEARNING}
    random = marlkit.run(agent="random", env="mpe_spread", seed=1, **{**common, "runner.total_steps": 2500})
    baseline = np.mean([r["agents"] for r in random.episode_returns])
    assert -28.5 < baseline < -24.5
    run = marlkit.run(agent=agent, env="mpe_spread", seed=1, **{**common, "runner.total_steps": budget})
    late = np.mean([r["agents"] for r in run.episode_returns[-64:]])
    assert late > baseline + 2.0, (late, baseline)


@pytest.mark.parametrize("name", ["MAPPO", "COMA"])
def test_linear_lr_schedule_falls_from_each_groups_lr_to_zero_at_total_steps(name, tmp_path):
    from marlkit.agents.base import Progress
    env = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25))
    agent = _agent(name, env, **{f"agents.{name}.lr_schedule": "linear", f"agents.{name}.critic_lr": 1e-3})
    assert agent.base_lrs == [agent.cfg.lr, 1e-3]
    per_update = 25 * 2
    assert agent.lr_scale(Progress(per_update, 4 * per_update), per_update) == 1.0   # the first update: full lr
    assert agent.lr_scale(Progress(3 * per_update, 4 * per_update), per_update) == pytest.approx(0.5)
    assert agent.lr_scale(Progress(4 * per_update, 4 * per_update), per_update) == pytest.approx(0.25)
    constant = _agent(name, env)
    assert constant.lr_scale(Progress(4 * per_update, 4 * per_update), per_update) == 1.0
    # in a run of 4 rollouts of 50 env steps the updates take 1, 0.75, 0.5 and 0.25 of the lr
    result = marlkit.run(agent=name, env="mpe_spread", seed=1, logger="none", **{
        f"agents.{name}.lr_schedule": "linear", "runner.parallels": 2, "runner.total_steps": 200,
        "runner.run_root": str(tmp_path), "runner.progress": False})
    assert result.metrics["agents/lr_scale"] == pytest.approx(0.25)
    saved = torch.load(result.run_dir / "latest.pt", weights_only=False)["groups"]["agents"]["optimizer"]
    assert [g["lr"] for g in saved["param_groups"]] == pytest.approx([0.25 * lr for lr in constant.base_lrs])
