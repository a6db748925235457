"""Observations of any shape, image critics and the default global state: what many agents with
small images need (the synthetic grid battle of ``benchmarks/scaling.py`` is the env)."""

from dataclasses import replace

import numpy as np
import pytest
import torch
import yaml
from gymnasium import spaces
from pettingzoo import ParallelEnv

import marlkit
from conftest import empty_rollout, learn_from
from marlkit.api import build_config
from marlkit.config import ModelConfig
from marlkit.errors import ConfigError
from marlkit.envs.factory import make_env_vector
from marlkit.envs.pettingzoo import PettingZooEnv, default_state
from marlkit.networks.cnn import CNN
from marlkit.networks.mlp import MLP
from marlkit.registry import get_agent
from marlkit.spec import EnvSpec, GroupSpec
from marlkit.storage import Bootstrap, Transition
from toy_envs import ScriptedEnv

from grid_battle import make_env

TEAMS = {"red": ["red_*"], "blue": ["blue_*"]}


def _group(obs_shape, n_agents=3, dtype=np.float32, n_actions=4):
    low, high = (0, 255) if dtype == np.uint8 else (-1, 1)
    return GroupSpec("agents", [f"agent_{i}" for i in range(n_agents)],
                     spaces.Box(low, high, obs_shape, dtype), spaces.Discrete(n_actions))


def _agent(name, group, state_shape, state_dtype=np.float32, state_channels_last=None, **cfg):
    agent_cfg = build_config(name, "mpe_spread").agents[name]
    for key, value in cfg.items():
        setattr(agent_cfg, key, value)
    env = EnvSpec({group.name: group}, state_shape, state_dtype=state_dtype, state_channels_last=state_channels_last)
    return get_agent(name)(group, env, agent_cfg, seed=0)


def _fill_and_update(agent, obs_shape, state_shape, state_dtype=np.float32, obs_dtype=np.float32):
    """Four steps of random data for 2 envs, one update -> (metrics, bootstrap values)."""
    rng = np.random.default_rng(0)
    A = agent.n_agents

    def sample(shape, dtype):
        return rng.integers(0, 256, shape).astype(dtype) if dtype == np.uint8 else rng.normal(size=shape).astype(dtype)

    transitions = []
    for t in range(4):
        obs, state = sample((2, A, *obs_shape), obs_dtype), sample((2, *state_shape), state_dtype)
        mask = np.ones((2, A), bool)
        out = agent.act(obs, state, mask, np.ones((2, A, 4), bool), None)
        assert out.actions.shape == (2, A)
        transitions.append(Transition(obs, state, mask, np.ones((2, A, 4), bool), out.actions, out.log_prob, out.value,
                               rng.normal(size=(2, A)).astype(np.float32), np.zeros((2, A), bool),
                               np.zeros((2, A), bool), np.zeros(2, bool), obs, state))
    bootstrap = Bootstrap(sample((2, A, *obs_shape), obs_dtype), sample((2, *state_shape), state_dtype),
                          np.ones((2, A), bool), np.ones((2, A, 4), bool), None)
    values = agent.value_of(bootstrap.obs, bootstrap.state, bootstrap.agent_mask, None)
    return learn_from(agent, transitions, bootstrap), values


@pytest.mark.parametrize("use_agent_id", [True, False])
def test_mlp_takes_non_flat_vector_observations(use_agent_id):
    """(27, 5) observations and state: flattened by mlp, the agent id joins the features."""
    agent = _agent("MAPPO", _group((27, 5)), (3, 27, 5), use_agent_id=use_agent_id)
    assert agent.modules["actor"].net[0].normalized_shape == (135,)
    metrics, values = _fill_and_update(agent, (27, 5), (3, 27, 5))
    assert np.isfinite(metrics["policy_loss"]) and values.shape == (2, 3)
    ipp = _agent("IPPO", _group((27, 5)), (3, 27, 5), use_agent_id=use_agent_id)
    metrics, values = _fill_and_update(ipp, (27, 5), (3, 27, 5))
    assert np.isfinite(metrics["value_loss"]) and values.shape == (2, 3)


@pytest.mark.parametrize("layer_norm", [True, False])
@pytest.mark.parametrize("scale", [1.0, 255.0])
@pytest.mark.parametrize("shared", [True, False])
def test_mlp_values_all_ids_at_once_as_if_each_were_appended(layer_norm, scale, shared):
    """MAPPO's mlp critic on ``[state, one-hot id]`` computes its first layer once per env step
    (``shared``, for wide inputs) or copies the input per id (narrow ones): either way the features
    equal those of the n explicit inputs (state-sized pixels included)."""
    torch.manual_seed(0)
    S, n = 40, 5
    mlp = MLP((S + n,), ModelConfig(name="mlp", hidden_sizes=[16, 16], layer_norm=layer_norm))
    mlp.share_ids_from = 0 if shared else S * n + 1
    with torch.no_grad():
        for p in mlp.parameters():
            p.add_(torch.randn_like(p) * 0.1)    # LayerNorm gains and shifts away from 1 and 0
    x = torch.rand(6, S) * scale
    explicit = torch.cat([x.unsqueeze(1).expand(-1, n, -1), torch.eye(n).expand(6, -1, -1)], -1)
    expected = mlp.encode(explicit.reshape(6 * n, -1)).reshape(6, n, -1)
    torch.testing.assert_close(mlp.encode(x, n_ids=n), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n_ids", [0, 5])
def test_mlp_folds_its_input_norm_into_the_first_layer_with_the_same_values_and_gradients(n_ids):
    """The input LayerNorm's gain and shift are folded into the first Linear (on ``[x, id]`` for
    every id at once too): the features and every parameter's gradient are those of the layers
    applied one by one, and the backward needs no gradient of the wide input, so its matrix
    arithmetic is the first layer's weight gradient alone."""
    from torch.utils.flop_counter import FlopCounterMode
    torch.manual_seed(0)
    S, N = 400, 32
    mlp = MLP((S + n_ids,), ModelConfig(name="mlp", hidden_sizes=[64, 8]))
    mlp.share_ids_from = 0
    with torch.no_grad():
        for p in mlp.parameters():
            p.add_(torch.randn_like(p) * 0.1)    # LayerNorm gains and shifts away from 1 and 0
    x = torch.rand(N, S)
    explicit = torch.cat([x.unsqueeze(1).expand(-1, n_ids, -1), torch.eye(n_ids).expand(N, -1, -1)], -1) if n_ids else x
    params = list(mlp.parameters())

    def backward_flops(features):
        with FlopCounterMode(display=False) as counter:
            grads = torch.autograd.grad(features.square().sum(), params)
        return grads, counter.get_total_flops()

    folded, folded_flops = backward_flops(mlp.encode(x, n_ids=n_ids))
    plain, plain_flops = backward_flops(mlp.net(explicit))
    torch.testing.assert_close(mlp.encode(x, n_ids=n_ids), mlp.net(explicit), rtol=1e-4, atol=1e-4)
    for got, want in zip(folded, plain):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
    first = 2 * N * S * 64   # one [N, S] x [S, 64] product
    assert plain_flops >= 2 * first and folded_flops < 1.5 * first   # no second product of that size


def test_mappo_mlp_critic_is_one_network_on_state_and_id():
    agent = _agent("MAPPO", _group((6,)), (10,))
    assert agent.modules["critic"].net[0].normalized_shape == (13,)      # state 10 + 3 ids
    state = torch.randn(1, 2, 10)
    values, _ = agent.values(None, state, None, None)
    explicit = torch.cat([state.unsqueeze(2).expand(-1, -1, 3, -1), torch.eye(3).expand(1, 2, 3, 3)], -1)
    features = agent.modules["critic"].encode(explicit.reshape(6, 13)).reshape(1, 2, 3, -1)
    torch.testing.assert_close(values, agent.modules["critic_head"].out(features).squeeze(-1))


@pytest.mark.parametrize("shape, convs, out_side", [((13, 13, 5), 2, 4), ((7, 7, 3), 2, 3), ((4, 84, 84), 3, 7),
                                                    ((5, 40, 30), 3, 4)])
def test_cnn_fits_small_and_large_images(shape, convs, out_side):
    cnn = CNN(shape, ModelConfig(name="cnn", hidden_sizes=[32]))
    layers = [m for m in cnn.conv if isinstance(m, torch.nn.Conv2d)]
    assert len(layers) == convs
    channels = shape[2] if cnn.channels_last else shape[0]
    x = torch.zeros(2, *shape, dtype=torch.uint8)
    image = x.permute(0, 3, 1, 2) if cnn.channels_last else x
    feature_map = cnn.conv[:-1](image.float())
    assert layers[0].in_channels == channels and feature_map.shape[-1] == out_side
    assert cnn.encode(x).shape == (2, 32)


def test_cnn_channels_set_the_convolutions_widths_and_a_wrong_list_is_named():
    cnn = CNN((4, 30, 80), ModelConfig(name="cnn", hidden_sizes=[64], kwargs={"channels": [16, 32, 24]}))
    assert [m.out_channels for m in cnn.conv if isinstance(m, torch.nn.Conv2d)] == [16, 32, 24]
    assert cnn.encode(torch.zeros(2, 4, 30, 80, dtype=torch.uint8)).shape == (2, 64)
    with pytest.raises(ConfigError, match=r"kwargs.channels=\[16, 32\] must give 3 positive widths.*\[16, 32, 32\]"):
        CNN((4, 30, 80), ModelConfig(name="cnn", kwargs={"channels": [16, 32]}))


def test_cnn_convs_replace_the_layout_and_run_in_channels_last_memory():
    cnn = CNN((13, 13, 5), ModelConfig(name="cnn", hidden_sizes=[32], kwargs={"convs": [[16, 3, 2], [8, 3, 1]]}))
    layers = [m for m in cnn.conv if isinstance(m, torch.nn.Conv2d)]
    assert [(m.out_channels, m.kernel_size, m.stride) for m in layers] == [(16, (3, 3), (2, 2)), (8, (3, 3), (1, 1))]
    assert all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in layers)
    assert cnn.head[0].in_features == 8 * 4 * 4   # 13 -> 6 -> 4
    # the same numbers as the convolutions in NCHW memory
    x = torch.rand(3, 13, 13, 5)
    nchw = [torch.nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, m.stride) for m in layers]
    for plain, m in zip(nchw, layers):
        plain.load_state_dict({k: v.contiguous() for k, v in m.state_dict().items()})
    y = x.permute(0, 3, 1, 2).contiguous()
    for plain in nchw:
        y = torch.relu(plain(y))
    torch.testing.assert_close(cnn.encode(x), cnn.head(y.flatten(1)))
    with pytest.raises(ConfigError, match=r"kwargs.convs=\[\[16, 3\]\] must be a list of \[out channels, kernel, stride\]"):
        CNN((13, 13, 5), ModelConfig(name="cnn", kwargs={"convs": [[16, 3]]}))
    with pytest.raises(ConfigError, match=r"convolutions \[\(32, 8, 4\), \(64, 4, 2\)\] leave nothing of a 13x13 image"):
        CNN((13, 13, 5), ModelConfig(name="cnn", kwargs={"convs": [[32, 8, 4], [64, 4, 2]]}))


def test_too_small_image_fails_before_training_naming_model_and_shape(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"description": "6x6 images", "env": {
        "type": "pettingzoo", "factory": "test_scaling_models:small_images", "kwargs": {}}}))
    with pytest.raises(ConfigError, match=r"agents\.MAPPO\.actor: model 'cnn' cannot take shape \(6, 6, 3\)"):
        marlkit.run(agent="MAPPO", env=str(path), logger="none", **{
            "agents.MAPPO.actor": {"name": "cnn"}, "runner.run_root": str(tmp_path / "runs"),
            "runner.progress": False, "runner.parallels": 1, "runner.total_steps": 10})
    assert not (tmp_path / "runs").exists()


class SmallImageEnv(ScriptedEnv):
    def __init__(self):
        super().__init__(length=4)
        self._obs_space = spaces.Box(0, 255, (6, 6, 3), np.uint8)

    def _obs(self, agent):
        return self.np_random.integers(0, 256, (6, 6, 3)).astype(np.uint8)


def small_images():
    return SmallImageEnv()


def test_default_state_of_images_is_a_uint8_channel_stack():
    env = PettingZooEnv(make_env(6), groups=TEAMS)
    assert env.spec.state_shape == (30, 13, 13) and env.spec.state_dtype == np.uint8
    ob = env.reset(seed=0)
    # slots in order, red then blue; each agent's (13, 13, 5) view as 5 channels-first planes
    views = np.concatenate([ob.obs["red"], ob.obs["blue"]])
    assert ob.state.dtype == np.uint8
    np.testing.assert_array_equal(ob.state, views.transpose(0, 3, 1, 2).reshape(30, 13, 13))
    # 4 bytes per slot pixel as float32 concatenation; the stack holds 1
    assert ob.state.nbytes == views.nbytes == views.size


class Views(ParallelEnv):
    """``n`` agents with image views of ``shape``; agent i's pixel in column c holds
    ``i + 5 * (c // 15)``, plus 15 in the last column of every 15, on every channel. Four (13, 11, 5)
    views stack channels-first to (20, 13, 11), whose shortest side is not the channel axis."""
    metadata = {"name": "views"}

    def __init__(self, shape=(13, 11, 5), n=4, channels_last=None):
        self.shape, self.possible_agents = shape, [f"agent_{i}" for i in range(n)]
        self.agents = []
        self.channels_last = channels_last   # the layout declared, or None: guessed from the shape

    def observation_space(self, agent):
        return spaces.Box(0, 255, self.shape, np.uint8)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def view(self, i):
        channels_last = self.shape[2] < self.shape[0] if self.channels_last is None else self.channels_last
        c = np.arange(self.shape[1] if channels_last else self.shape[2])
        column = 5 * (c // 15) + 15 * (c % 15 == 14)
        return np.broadcast_to(i + (column[None, :, None] if channels_last else column), self.shape).astype(np.uint8)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {a: self.view(i) for i, a in enumerate(self.agents)}, {a: {} for a in self.agents}


def test_the_stacked_state_is_read_channels_first_whatever_its_shape():
    env = PettingZooEnv(Views((13, 11, 5)))
    assert env.spec.state_shape == (20, 13, 11) and env.spec.state_channels_last is False
    ob = env.reset(seed=0)
    np.testing.assert_array_equal(ob.state[5 * 2:5 * 3], 2)          # agent 2's five planes
    group = env.spec.groups["agents"]
    agent = _agent("MAPPO", group, env.spec.state_shape, np.uint8, env.spec.state_channels_last,
                   actor=ModelConfig(name="cnn", hidden_sizes=[16]), critic=ModelConfig(name="cnn", hidden_sizes=[16]))
    assert agent.modules["critic"].conv[0].in_channels == 20          # a guess from the shape would say 11
    assert agent.modules["actor"].conv[0].in_channels == 5
    pinned = _agent("MAPPO", group, env.spec.state_shape, np.uint8, env.spec.state_channels_last,
                    critic=ModelConfig(name="cnn", hidden_sizes=[16], kwargs={"channels_last": True}))
    assert pinned.modules["critic"].conv[0].in_channels == 11         # the user's kwargs win


def test_a_declared_layout_is_read_as_declared_through_the_state_the_wrappers_and_the_cnn():
    """(14, 14, 16) images, declared channels-last, which their shape would read as channels-first
    (mettagrid's (13, 13, 19) views are such): resized, frame-stacked and convolved as [H, W, C]."""
    from marlkit.config import EnvConfig
    from marlkit.envs.wrappers import wrap

    env = PettingZooEnv(Views((14, 14, 16), n=2, channels_last=True))
    group = env.spec.groups["agents"]
    assert group.channels_last is True and env.spec.state_shape == (32, 14, 14)
    ob = env.reset(seed=0)
    np.testing.assert_array_equal(ob.state[16:], 1)                   # agent 1's sixteen planes
    agent = _agent("MAPPO", group, env.spec.state_shape, np.uint8, env.spec.state_channels_last,
                   actor=ModelConfig(name="cnn", hidden_sizes=[16]), critic=ModelConfig(name="cnn", hidden_sizes=[16]))
    assert agent.modules["actor"].conv[0].in_channels == 16           # the shape alone would say 14
    assert agent.modules["critic"].conv[0].in_channels == 32

    wrapped = wrap(env, EnvConfig(resize=[7, 7], frame_stack=2))
    stacked = wrapped.spec.groups["agents"]
    assert stacked.obs_shape == (7, 7, 32) and stacked.channels_last is True
    assert wrapped.spec.state_shape == (32, 7, 7)
    first = wrapped.reset(seed=0).obs["agents"]
    # column c of agent i holds i, plus 15 in column 14, which 14 columns do not reach: means of i
    np.testing.assert_array_equal(first, np.broadcast_to(np.arange(2)[:, None, None, None], (2, 7, 7, 32)))
    frames = wrapped.env                                              # the frame stack's input: resized views
    later = frames.observe(replace(ob, obs={"agents": ob.obs["agents"] + 100}), first=False)
    newest = wrapped.observe(later, first=False).obs["agents"]
    np.testing.assert_array_equal(newest[..., :16], first[..., :16])  # the oldest frame, then the newest
    np.testing.assert_array_equal(newest[..., 16:], first[..., 16:] + 100)
    with pytest.raises(ConfigError, match="channels_last is 'yes'"):
        PettingZooEnv(Views((14, 14, 16), n=2, channels_last="yes"))


def test_the_default_state_of_large_frames_is_shrunk_by_whole_blocks():
    """20 agents with (3, 120, 457) frames: the stacked state keeps every agent's channels but
    averages 4 x 15 blocks (30 x 30 a view, 54,000 values a step instead of 3.3 million)."""
    env = PettingZooEnv(Views((3, 120, 457), n=20))
    assert env.spec.state_shape == (60, 30, 30) and env.spec.state_dtype == np.uint8
    ob = env.reset(seed=0)
    expected = 7 + 5 * np.arange(30) + 1      # agent 7: block k averages columns 15k .. 15k + 14
    np.testing.assert_array_equal(ob.state[3 * 7:3 * 8], np.broadcast_to(expected, (3, 30, 30)))


def test_default_state_falls_back_to_concatenation():
    vec = [spaces.Box(-1, 1, (4,), np.float32), spaces.Box(-1, 1, (3,), np.float64)]
    assert default_state(vec) == ((7,), np.dtype(np.float32), False)
    mixed = [spaces.Box(0, 255, (8, 8, 3), np.uint8), spaces.Box(0, 255, (9, 9, 3), np.uint8)]
    assert default_state(mixed) == ((8 * 8 * 3 + 9 * 9 * 3,), np.dtype(np.uint8), False)
    images = [spaces.Box(0, 255, (2, 9, 9), np.uint8)] * 3
    assert default_state(images) == ((6, 9, 9), np.dtype(np.uint8), True)
    assert default_state(images, "concat") == ((486,), np.dtype(np.uint8), False)


def test_slot_of_an_agent_that_died_this_step_holds_its_last_observation_then_zeros():
    env = PettingZooEnv(ScriptedEnv(length=10))    # agent_1 terminates after its step 3
    env.reset(seed=0)
    for _ in range(3):
        env.step({"agents": np.zeros(3, np.int64)})
    ob, _, terminated, _, _ = env.step({"agents": np.zeros(3, np.int64)})
    assert terminated["agents"][1] and not ob.agent_mask["agents"][1]
    last = ob.obs["agents"][1]
    assert last[0] == 1 and last[1] == pytest.approx(0.4)       # agent index 1, step 4 of 10
    np.testing.assert_array_equal(ob.state.reshape(3, 4)[1], last)
    ob, *_ = env.step({"agents": np.zeros(3, np.int64)})
    assert not ob.obs["agents"][1].any() and not ob.state.reshape(3, 4)[1].any()


def test_ippo_stores_no_state_and_mappo_stores_the_uint8_stack(battle_yaml):
    cfg = build_config("MAPPO", battle_yaml(), **{"runner.parallels": 2})
    venv = make_env_vector(cfg.env, cfg.runner)
    try:
        spec = venv.spec
    finally:
        venv.close()
    red = spec.groups["red"]
    ippo = _agent("IPPO", red, spec.state_shape, spec.state_dtype)
    mappo = _agent("MAPPO", red, spec.state_shape, spec.state_dtype)
    assert empty_rollout(ippo, 2, 4).state.nbytes == 0
    stored = empty_rollout(mappo, 2, 4).state
    assert stored.dtype == np.uint8 and stored.shape == (4, 2, 20, 13, 13)


def test_mappo_cnn_critic_encodes_the_image_state_once_per_env_step(tmp_path):
    """An image state reaches a cnn critic; its encoder runs once per env step, not once per agent,
    and every agent still gets its own value."""
    spec_state = (4 * 5, 13, 13)
    group = _group((13, 13, 5), n_agents=4, dtype=np.uint8)
    agent = _agent("MAPPO", group, spec_state, np.uint8, actor=ModelConfig(name="cnn", hidden_sizes=[32]),
                   critic=ModelConfig(name="cnn", hidden_sizes=[32]))
    batches = []
    agent.modules["critic"].register_forward_hook(lambda m, args, out: batches.append(args[0].shape[:2]))
    metrics, values = _fill_and_update(agent, (13, 13, 5), spec_state, np.uint8, np.uint8)
    assert np.isfinite(metrics["value_loss"])
    assert values.shape == (2, 4) and len(np.unique(values.round(6))) == 8     # one value per agent
    assert all(shape[-1] == 2 * 4 or shape == (1, 2) for shape in batches)     # [L, B] of env steps


def test_mappo_trains_on_the_grid_battle_with_cnn_models(tmp_path, battle_yaml):
    result = marlkit.run(agent="MAPPO", env=battle_yaml(), logger="none", **{
        "agents.MAPPO.actor": {"name": "cnn", "hidden_sizes": [32]},
        "agents.MAPPO.critic": {"name": "cnn", "hidden_sizes": [32]}, "agents.MAPPO.epochs": 2,
        "runner.run_root": str(tmp_path / "runs"), "runner.progress": False, "runner.parallels": 2,
        "runner.horizon": 12, "runner.total_steps": 48})
    assert result.steps == 48
    assert np.isfinite(result.metrics["red/value_loss"]) and np.isfinite(result.metrics["blue/value_loss"])
    assert any(r for r in result.episode_returns)


def test_gru_over_a_cnn_takes_pixels_and_resets_where_episodes_start():
    """``{name: gru, kwargs: {encoder: cnn}}``: convolutions per frame, then the GRU over time."""
    from marlkit.networks.rnn import GRU
    cfg = ModelConfig(name="gru", hidden_sizes=[32], rnn_hidden=16, kwargs={"encoder": "cnn", "channels_last": False})
    gru = GRU((4, 30, 40), cfg)
    assert gru.encoder.conv[0].in_channels == 4 and gru.out_dim == gru.hidden_size == 16
    x = torch.randint(0, 256, (5, 3, 4, 30, 40), dtype=torch.uint8)     # [L, B, C, H, W]
    start = torch.zeros(5, 3, dtype=torch.bool)
    start[2, 1] = True
    out, h = gru(x, torch.zeros(3, 16), start)
    assert out.shape == (5, 3, 16) and h.shape == (3, 16)
    # env 1 restarts at t=2: from there on it matches a fresh pass over its last 3 frames
    fresh, _ = gru(x[2:, 1:2], torch.zeros(1, 16))
    torch.testing.assert_close(out[2:, 1:2], fresh)
    with pytest.raises(ConfigError, match="kwargs.encoder 'gru' is recurrent"):
        GRU((4, 30, 40), ModelConfig(name="gru", kwargs={"encoder": "gru"}))


def test_mappo_trains_a_recurrent_cnn_policy_on_images(tmp_path, battle_yaml):
    result = marlkit.run(agent="MAPPO", env=battle_yaml(), logger="none", **{
        "agents.MAPPO.actor": {"name": "gru", "hidden_sizes": [32], "rnn_hidden": 16, "kwargs": {"encoder": "cnn"}},
        "agents.MAPPO.epochs": 2, "agents.MAPPO.chunk_length": 6,
        "runner.run_root": str(tmp_path / "runs"), "runner.progress": False, "runner.parallels": 2,
        "runner.horizon": 12, "runner.total_steps": 48})
    assert result.steps == 48
    assert np.isfinite(result.metrics["red/policy_loss"]) and np.isfinite(result.metrics["blue/policy_loss"])


def test_every_packaged_model_reads_uint8_pixels_as_values_in_0_1():
    from marlkit.networks.rnn import GRU
    torch.manual_seed(0)
    pixels = torch.randint(0, 256, (3, 2, 5, 13, 13), dtype=torch.uint8)      # [L, B, C, H, W]
    for model in (MLP((5, 13, 13), ModelConfig(layer_norm=False)), CNN((5, 13, 13), ModelConfig(hidden_sizes=[16])),
                  GRU((5, 13, 13), ModelConfig(name="gru", layer_norm=False))):
        scaled, _ = model(pixels.float() / 255.0)
        raw, _ = model(pixels)
        torch.testing.assert_close(raw, scaled)


def test_as_float_scales_pixels_and_never_writes_into_its_input():
    from marlkit.networks.base import as_float
    pixels = torch.randint(0, 256, (4, 5, 5, 3), dtype=torch.uint8)
    kept = pixels.clone()
    torch.testing.assert_close(as_float(pixels), pixels.double().div(255).float(), rtol=0, atol=1e-7)
    assert torch.equal(pixels, kept)
    values = torch.randn(4, 7)
    before = values.clone()
    assert as_float(values) is values and torch.equal(values, before)
