"""The pooled critic (per-agent encoder shared by the group, pooled over the agents present) and
images of any size: what MAPPO's critic reads when the env has no compact state of its own."""
import numpy as np
import pytest
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv
from torch.utils.flop_counter import FlopCounterMode

import marlkit
from conftest import empty_rollout
from marlkit.api import build_config
from marlkit.config import ModelConfig
from marlkit.envs.factory import make_env, make_env_vector
from marlkit.envs.pettingzoo import PettingZooEnv
from marlkit.errors import ConfigError
from marlkit.networks.pooled import PooledValueHead
from marlkit.networks.base import Encoder
from marlkit.registry import get_agent, register_model
from marlkit.spec import EnvSpec, GroupSpec
from mpe2 import simple_spread_v3


def _group(obs_shape, n_agents, dtype=np.float32):
    low, high = (0, 255) if dtype == np.uint8 else (-1, 1)
    return GroupSpec("agents", [f"agent_{i}" for i in range(n_agents)], spaces.Box(low, high, obs_shape, dtype),
                     spaces.Discrete(4))


def _mappo(group, state_shape, state_from_obs, **cfg):
    agent_cfg = build_config("MAPPO", "mpe_spread").agents["MAPPO"]
    agent_cfg.critic_input = "auto"   # the default; mpe_spread.yaml names its compact state
    for key, value in cfg.items():
        setattr(agent_cfg, key, value)
    return get_agent("MAPPO")(group, EnvSpec({group.name: group}, state_shape, state_from_obs=state_from_obs),
                              agent_cfg, seed=0)


def test_auto_pools_where_the_state_was_built_from_observations_and_stores_no_state():
    group = _group((18,), 3)
    pooled = _mappo(group, (54,), state_from_obs=True)
    assert isinstance(pooled.modules["critic_head"], PooledValueHead)
    assert empty_rollout(pooled, 2, 4).state.nbytes == 0                     # the state is not stored
    assert "critic" not in pooled.modules                                    # critic_encoder auto: the actor's
    own = _mappo(group, (54,), state_from_obs=True, critic_encoder="own")
    assert own.modules["critic"].net[0].normalized_shape == (18,)      # one agent's obs (its id joins the head)
    recurrent = _mappo(group, (54,), state_from_obs=True, actor=ModelConfig(name="gru"))
    assert recurrent.modules["critic"].net[0].normalized_shape == (18,)      # auto: its own beside a gru actor
    own = _mappo(group, (54,), state_from_obs=False)                         # the env's own state()
    assert own.modules["critic"].net[0].normalized_shape == (54 + 3,)
    assert empty_rollout(own, 2, 4).state.shape == (4, 2, 54)
    named = _mappo(group, (54,), state_from_obs=True, critic_input="state")  # the concatenation, by name
    assert named.modules["critic"].net[0].normalized_shape == (54 + 3,)
    assert isinstance(_mappo(group, (54,), state_from_obs=False, critic_input="pooled").modules["critic_head"],
                      PooledValueHead)


@pytest.mark.parametrize("pool", ["mean", "max", "attention"])
def test_values_pool_over_present_agents_only(pool):
    agent = _mappo(_group((6,), 4), (24,), state_from_obs=True, pool=pool)
    obs = torch.randn(1, 2, 4, 6)
    mask = torch.tensor([[[True, True, True, False], [True, True, True, True]]])
    v, _ = agent.values(obs, None, None, None, mask)
    assert v.shape == (1, 2, 4)
    moved = obs.clone()
    moved[0, 0, 3] = 3 * torch.randn(6)        # the absent agent of env 0: no present agent's value moves
    w, _ = agent.values(moved, None, None, None, mask)
    torch.testing.assert_close(w[0, 0, :3], v[0, 0, :3])
    moved[0, 1, 3] = 3 * torch.randn(6)        # a present agent of env 1: every other agent's value moves
    w, _ = agent.values(moved, None, None, None, mask)
    assert not torch.isclose(w[0, 1, :3], v[0, 1, :3]).any()
    none = torch.zeros_like(mask)              # no one present: finite values
    assert torch.isfinite(agent.values(obs, None, None, None, none)[0]).all()


def _critic_flops_per_agent(n_agents: int, pool: str, model: str = "mlp") -> float:
    """Matmul and convolution FLOPs of the critic per agent, forward and backward."""
    agent = _mappo(_group((13, 13, 5), n_agents, np.uint8), (5 * n_agents, 13, 13), state_from_obs=True,
                   pool=pool, critic_encoder="own", critic=ModelConfig(name=model, hidden_sizes=[32]))
    obs = torch.randint(0, 256, (1, 8, n_agents, 13, 13, 5), dtype=torch.uint8)
    with FlopCounterMode(display=False) as counter:
        value, _ = agent.values(obs, None, None, None, torch.ones(1, 8, n_agents, dtype=torch.bool))
        value.sum().backward()
    return counter.get_total_flops() / (8 * n_agents)


@pytest.mark.parametrize("pool,model", [("mean", "mlp"), ("max", "mlp"), ("mean", "cnn")])
def test_pooled_critic_costs_no_more_per_agent_at_any_number_of_agents(pool, model):
    """The cost is a part per agent, the same at any A, plus the pool's share of the hidden layer,
    once per env step: a [32, 32] matmul forward and its two gradients, 6 x 32 x 32 FLOPs."""
    per_step = {a: a * _critic_flops_per_agent(a, pool, model) for a in (4, 12, 48)}
    per_agent = (per_step[48] - per_step[12]) / 36
    assert per_agent > 0
    assert per_step[12] - per_step[4] == 8 * per_agent
    assert per_step[4] - 4 * per_agent == 6 * 32 * 32


def test_attention_pool_grows_per_agent_only_in_its_small_term():
    small, large = _critic_flops_per_agent(4, "attention"), _critic_flops_per_agent(48, "attention")
    assert small < large < 1.2 * small


def test_images_reach_a_cnn_pooled_critic_and_train(tmp_path, battle_yaml):
    """The grid battle (13x13x5 views, no state()) with a cnn critic: each view through the cnn."""
    result = marlkit.run(agent="MAPPO", env=battle_yaml(), logger="none", **{
        "agents.MAPPO.critic": {"name": "cnn", "hidden_sizes": [32]}, "agents.MAPPO.epochs": 2,
        "agents.MAPPO.pool": "max", "runner.run_root": str(tmp_path / "runs"), "runner.progress": False,
        "runner.parallels": 2, "runner.horizon": 12, "runner.total_steps": 48})
    assert result.steps == 48
    assert np.isfinite(result.metrics["red/value_loss"]) and np.isfinite(result.metrics["blue/value_loss"])


class Screens(ParallelEnv):
    """Two agents seeing ``(H, W, 3)`` uint8 screens with an image ``state()``; a third agent
    ``odd_0`` with a smaller view when ``odd`` (for grouping errors)."""

    metadata = {"name": "screens_v0"}

    def __init__(self, shape=(280, 480, 3), odd=False, state_shape=None):
        self.possible_agents = ["paddle_0", "paddle_1"] + (["paddle_2"] if odd else [])
        self.shapes = {a: shape for a in self.possible_agents}
        if odd:
            self.shapes["paddle_2"] = (shape[0] // 2, shape[1], 3)
        self.state_space = spaces.Box(0, 255, state_shape or shape, np.uint8)

    def observation_space(self, agent):
        return spaces.Box(0, 255, self.shapes[agent], np.uint8)

    def action_space(self, agent):
        return spaces.Discrete(3)

    def _obs(self):
        return {a: (np.arange(np.prod(s)) % 251).astype(np.uint8).reshape(s) for a, s in self.shapes.items()}

    def state(self):
        return np.zeros(self.state_space.shape, np.uint8)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        zero = {a: 0.0 for a in self.agents}
        return self._obs(), zero, {a: False for a in self.agents}, {a: False for a in self.agents}, \
            {a: {} for a in self.agents}


def screens(**kwargs):
    return Screens(**kwargs)


def test_an_image_state_gives_way_to_the_pooled_design_and_a_compact_one_stays():
    env = PettingZooEnv(Screens())
    assert env.spec.state_from_obs and env.spec.state_shape == (6, 31, 32)   # built from the views
    own = PettingZooEnv(Screens(), state="env")
    assert not own.spec.state_from_obs and own.spec.state_shape == (280, 480, 3)
    compact = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25))
    assert not compact.spec.state_from_obs and compact.spec.state_shape == (54,)
    concat = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25), state="concat")
    assert concat.spec.state_from_obs
    from grid_battle import make_env as battle                                  # no state(): as auto
    assert PettingZooEnv(battle(4), state="env").spec.state_shape == (20, 13, 13)


def test_large_images_are_shrunk_by_block_means_to_the_default_side(env_yaml):
    cfg = build_config("MAPPO", env_yaml("test_pooled_critic:screens"))
    env = make_env(cfg.env)
    try:
        ob = env.reset(seed=0)
        assert env.spec.groups["agents"].obs_shape == (56, 60, 3)             # 280x480 in blocks of 5x8
        raw = Screens()._obs()["paddle_0"].astype(np.float64)
        expected = np.floor(raw.reshape(56, 5, 60, 8, 3).mean(axis=(1, 3)) + 0.5)
        np.testing.assert_array_equal(ob.obs["agents"][0], expected)
    finally:
        env.close()
    cfg = build_config("MAPPO", env_yaml("test_pooled_critic:screens", {"shape": [3, 60, 200]}))
    env = make_env(cfg.env)                                                   # channels first: 60x200 -> 60x50
    assert env.spec.groups["agents"].obs_shape == (3, 60, 50)
    env.close()
    for kept in ({"env.max_image_side": None}, {"env.resize": [70, 120]}):
        cfg = build_config("MAPPO", env_yaml("test_pooled_critic:screens", {"shape": [3, 280, 480]}), **kept)
        env = make_env(cfg.env)
        assert env.spec.groups["agents"].obs_shape == (3, 280, 480) if not kept.get("env.resize") else (3, 70, 120)
        env.close()


def test_a_group_of_mismatched_views_is_refused_before_training(env_yaml, tmp_path):
    path = env_yaml("test_pooled_critic:screens", {"odd": True}, env={"groups": {"paddles": ["paddle_*"]}})
    with pytest.raises(ConfigError, match=r"env\.groups: agents of group 'paddles' .* split them"):
        marlkit.run(agent="MAPPO", env=path, logger="none", **{"runner.run_root": str(tmp_path),
                                                                "runner.total_steps": 8})


def _image_agent(agent_name: str, critic: str | None, n_agents: int = 8):
    """``agent_name`` on a group of 13x13x5 views; ``critic``: MAPPO's critic_input, or ``shared``
    (pooled on the actor's encoder)."""
    agent_cfg = build_config(agent_name, "mpe_spread").agents[agent_name]
    if critic:
        agent_cfg.critic_input = "pooled" if critic == "shared" else critic
        agent_cfg.critic_encoder = "actor" if critic == "shared" else "own"
    group = _group((13, 13, 5), n_agents, np.uint8)
    return get_agent(agent_name)(group, EnvSpec({group.name: group}, (5 * n_agents, 13, 13), state_from_obs=True),
                                 agent_cfg, seed=0)


def _image_batch(n_agents: int, absent_share: float) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    L, B, A = 6, 4, n_agents
    return {"obs": torch.randint(0, 256, (L, B, A, 13, 13, 5), dtype=torch.uint8, generator=gen),
            "state": torch.randint(0, 256, (L, B, 5 * A, 13, 13), dtype=torch.uint8, generator=gen).float() / 255,
            "agent_mask": torch.rand(L, B, A, generator=gen) > absent_share,
            "action_mask": torch.ones(L, B, A, 4, dtype=torch.bool),
            "actions": torch.randint(0, 4, (L, B, A), generator=gen), "log_prob": torch.full((L, B, A), -1.4),
            "advantages": torch.randn(L, B, A, generator=gen), "returns": torch.randn(L, B, A, generator=gen),
            "old_value": torch.randn(L, B, A, generator=gen), "episode_start": torch.zeros(L, B, A, dtype=torch.bool)}


@pytest.mark.parametrize("agent_name,critic_input", [("MAPPO", "pooled"), ("MAPPO", "shared"), ("MAPPO", "state"),
                                                     ("IPPO", None)])
def test_absent_slots_are_skipped_with_the_same_loss_and_gradients(agent_name, critic_input):
    """The feed-forward encoders read the present slots alone: the loss and every gradient are
    those of encoding every slot, and the arithmetic follows the agents present."""
    n_agents, absent_share = 8, 0.5
    agent = _image_agent(agent_name, critic_input, n_agents)
    batch = _image_batch(n_agents, absent_share)
    present = batch["agent_mask"]

    def loss_and_grads(skip: bool):
        actor = agent.actor
        encode = type(actor).encode
        actor.encode = lambda *args, present=None, **kw: encode(actor, *args, present=present if skip else None, **kw)
        agent.modules.zero_grad(set_to_none=True)
        try:
            with FlopCounterMode(display=False) as counter:
                loss, _ = agent.loss(batch)
                loss.backward()
        finally:
            del actor.encode
        return loss.detach(), [p.grad.clone() for p in agent.modules.parameters() if p.grad is not None], \
            counter.get_total_flops()

    loss_all, grads_all, flops_all = loss_and_grads(skip=False)
    loss_skip, grads_skip, flops_skip = loss_and_grads(skip=True)
    torch.testing.assert_close(loss_skip, loss_all, rtol=1e-5, atol=1e-6)
    assert len(grads_skip) == len(grads_all)
    for g_skip, g_all in zip(grads_skip, grads_all):
        torch.testing.assert_close(g_skip, g_all, rtol=1e-4, atol=1e-6)
    share = present.float().mean().item()
    # the per-agent encoders' arithmetic follows the present share; a state critic's does not
    assert flops_skip < flops_all * (share + 0.1 if critic_input != "state" else 0.8)


def _silenced_policy_update_flops(agent, batch) -> int:
    """One backward pass of ``agent.loss(batch)`` from zeroed gradients -> its FLOPs; the batch's
    zero advantages leave the policy loss at 0 (asserted), so gradients come from the value loss."""
    agent.modules.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as counter:
        loss, info = agent.loss(batch)
        loss.backward()
    assert info["policy_loss"] == 0.0
    return counter.get_total_flops()


def test_a_critic_on_the_actors_encoder_adds_a_head_alone_and_the_value_loss_trains_the_encoder():
    """``critic_encoder: actor``: no critic encoder is built, every parameter is optimised once,
    the value loss alone moves the actor's encoder (advantages of zero: no policy gradient), and
    the update's arithmetic is that of the actor and a small head, under 0.6 of a pooled critic
    with an encoder of its own."""
    shared, own = _image_agent("MAPPO", "shared"), _image_agent("MAPPO", "pooled")
    assert "critic" not in shared.modules and "critic" in own.modules
    optimised = [p for group in shared.optimizer.param_groups for p in group["params"]]
    assert len(optimised) == len({id(p) for p in optimised}) == len(list(shared.modules.parameters()))

    batch = {**_image_batch(8, 0.3), "advantages": torch.zeros(6, 4, 8)}
    flops = {}
    for name, agent in (("shared", shared), ("own", own)):
        agent.cfg.entropy_coef = 0.0
        flops[name] = _silenced_policy_update_flops(agent, batch)
        encoder_grad = sum(p.grad.abs().sum() for p in agent.modules["actor"].parameters() if p.grad is not None)
        assert (encoder_grad > 0) == (name == "shared"), name
    assert flops["shared"] < 0.6 * flops["own"], flops


def test_critic_encoder_grad_scales_what_the_value_loss_sends_into_the_shared_encoder():
    """With the policy loss silenced (zero advantages, no entropy), the actor's encoder gets the
    value loss's gradient times ``critic_encoder_grad``: all of it at 1, half at 0.5, none at 0, a
    tenth unset (``SHARED_ENCODER_GRAD``), while the value head's own gradient and the loss stay the same."""
    batch = {**_image_batch(8, 0.3), "advantages": torch.zeros(6, 4, 8)}
    grads = {}
    for scale in (1.0, 0.5, 0.0, None):
        agent = _image_agent("MAPPO", "shared")
        agent.cfg.entropy_coef, agent.cfg.critic_encoder_grad = 0.0, scale
        loss, _ = agent.loss(batch)
        loss.backward()
        grads[scale] = (loss.detach(), [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                                        for p in agent.modules["actor"].parameters()],
                        [p.grad.clone() for p in agent.modules["critic_head"].parameters()])
    full_loss, full_encoder, full_head = grads[1.0]
    assert sum(g.abs().sum() for g in full_encoder) > 0
    for scale, share in ((0.5, 0.5), (0.0, 0.0), (None, 0.1)):
        loss, encoder, head = grads[scale]
        torch.testing.assert_close(loss, full_loss)
        for g, g_full in zip(head, full_head):
            torch.testing.assert_close(g, g_full)
        for g, g_full in zip(encoder, full_encoder):
            torch.testing.assert_close(g, share * g_full, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("overrides,message", [
    ({"agents.MAPPO.critic_input": "state"},
     r"agents\.MAPPO\.critic_encoder=actor .* agents\.MAPPO\.critic_input=state; "
     r"set agents\.MAPPO\.critic_input to pooled"),
    ({"agents.MAPPO.actor": {"name": "test_no_trunk"}, "agents.MAPPO.critic_input": "pooled"},
     r"agents\.MAPPO\.critic_encoder=actor shares the feed-forward trunk of a recurrent actor, and "
     r"agents\.MAPPO\.actor\.name=test_no_trunk has none .*; set agents\.MAPPO\.critic_encoder to own"),
])
def test_a_critic_on_the_actors_encoder_that_cannot_work_is_refused_naming_the_keys(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config("MAPPO", "mpe_spread", **{"agents.MAPPO.critic_encoder": "actor", **overrides})


@register_model("test_no_trunk")
class _RecurrentWithoutTrunk(Encoder):
    is_recurrent = True


def _recurrent_image_agent(critic_encoder: str, n_agents: int = 4):
    """MAPPO with a gru over a cnn actor on 13x13x5 views and a pooled critic (``critic_encoder``)."""
    agent_cfg = build_config("MAPPO", "mpe_spread").agents["MAPPO"]
    agent_cfg.critic_input, agent_cfg.critic_encoder = "pooled", critic_encoder
    agent_cfg.actor = ModelConfig(name="gru", hidden_sizes=[32], rnn_hidden=32,
                                  kwargs={"encoder": "cnn", "convs": [[8, 3, 1], [16, 3, 2]]})
    agent_cfg.critic = ModelConfig(name="cnn", hidden_sizes=[32], kwargs={"convs": [[8, 3, 1], [16, 3, 2]]})
    group = _group((13, 13, 5), n_agents, np.uint8)
    return get_agent("MAPPO")(group, EnvSpec({group.name: group}, (5 * n_agents, 13, 13), state_from_obs=True),
                              agent_cfg, seed=0)


def test_a_recurrent_actor_shares_its_trunk_with_the_pooled_critic():
    """``critic_encoder: actor`` beside a gru over a cnn: no critic encoder is built; the critic
    reads the cnn's features, so the value loss trains the cnn and never the gru's memory; one
    pass of the cnn serves both losses, under 0.6 of the arithmetic of a critic cnn of its own;
    and the values taken while acting (from the acting pass) are those valued afterwards."""
    shared, own = _recurrent_image_agent("actor"), _recurrent_image_agent("own")
    assert "critic" not in shared.modules and "critic" in own.modules
    assert shared.modules["actor"].trunk_dim == shared.modules["actor"].encoder.out_dim == 32

    L, B, A = 6, 4, 4
    batch = {**_image_batch(A, 0.0), "advantages": torch.zeros(L, B, A)}
    batch["episode_start"][3, 1] = True
    batch["hidden"] = torch.randn(L, B, A, 2, 32) * 0.1
    flops = {}
    for name, agent in (("shared", shared), ("own", own)):
        agent.cfg.entropy_coef, agent.cfg.critic_encoder_grad = 0.0, (1.0 if name == "shared" else None)
        flops[name] = _silenced_policy_update_flops(agent, batch)
    gru = shared.modules["actor"]
    assert sum(p.grad.abs().sum() for p in gru.encoder.parameters()) > 0
    assert all(p.grad is None or not p.grad.any() for p in gru.gru.parameters())
    assert flops["shared"] < 0.6 * flops["own"], flops

    obs = batch["obs"][0].numpy()
    present = np.ones((B, A), bool)
    out = shared.act(obs, np.zeros((B, 0), np.float32), present, np.ones((B, A, 4), bool),
                     shared.initial_hidden(B), explore=True)
    later = shared.value_of(obs, np.zeros((B, 0), np.float32), present, out.hidden)
    np.testing.assert_allclose(out.value, later, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("overrides,why,fix", [
    ({"agents.MAPPO.critic_input": "pooled", "agents.MAPPO.critic_encoder": "own"},
     r"agents\.MAPPO\.critic_encoder=own", r"set agents\.MAPPO\.critic_encoder to actor"),
    ({"agents.MAPPO.critic_input": "state"},
     r"agents\.MAPPO\.critic_input=state", r"set agents\.MAPPO\.critic_input to pooled"),
    ({"agents.MAPPO.critic_input": "pooled", "agents.MAPPO.actor": {"name": "gru"}},
     r"agents\.MAPPO\.critic_encoder=auto gives a recurrent actor \(agents\.MAPPO\.actor\.name=gru\) a critic "
     r"encoder of its own",
     r"set agents\.MAPPO\.critic_encoder to actor"),
])
def test_a_value_gradient_scale_without_a_shared_encoder_is_refused_naming_the_keys(overrides, why, fix):
    with pytest.raises(ConfigError, match=rf"agents\.MAPPO\.critic_encoder_grad=0\.0 .* {why}; {fix}.*, or leave "
                                          r"agents\.MAPPO\.critic_encoder_grad unset"):
        build_config("MAPPO", "mpe_spread", **{"agents.MAPPO.critic_encoder_grad": 0.0, **overrides})


@pytest.mark.parametrize("pool", ["mean", "max", "attention"])
def test_subteams_pool_apart_and_agents_of_no_subteam_read_the_whole_group(pool):
    """Sub-teams (the fields of a Unity scene, ``GroupSpec.subteams``): an agent's value reads its own
    sub-team alone, to the bit, and an agent of sub-team 0 reads the whole group as without sub-teams."""
    torch.manual_seed(0)
    subteams = (0, 7, 7, 9, 9, 9)
    split, whole = PooledValueHead(8, 6, pool, subteams=subteams), PooledValueHead(8, 6, pool)
    whole.load_state_dict(split.state_dict())                 # the sub-teams are not part of the weights
    features = torch.randn(2, 3, 6, 8)
    mask = torch.ones(2, 3, 6, dtype=torch.bool)
    mask[0, 0, 1] = mask[1, 2, 3:] = False                    # absent: out of their pools; an empty pool is zeros
    values = split(features, mask)
    torch.testing.assert_close(values[..., 0], whole(features, mask)[..., 0])
    assert torch.isfinite(values).all()
    moved = features.clone()
    moved[..., 3:, :] += torch.randn(2, 3, 3, 8)              # sub-team 9 moves
    again = split(moved, mask)
    assert torch.equal(again[..., 1:3], values[..., 1:3])     # sub-team 7 reads nothing of it
    seen = mask[..., 3:].any(-1)                              # where sub-team 9 has someone present
    assert not torch.isclose(again[..., 0][seen], values[..., 0][seen]).any()
    present = mask[..., 3:]
    assert not torch.isclose(again[..., 3:][present], values[..., 3:][present]).any()
