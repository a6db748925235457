"""mettagrid as a PettingZoo env of images (``marlkit/envs/mettagrid.py``): the token-to-image
conversion against hand-built tokens and against a plain reference on the real game's tokens, the
spec marlkit reads, the episode's end, and MAPPO training through the packaged YAML."""
import math
import sys

import numpy as np
import pytest
import yaml

import marlkit
from marlkit.config import ConfigError
from marlkit.envs.factory import make_env
from marlkit.envs.mettagrid import GLOBAL, PADDING, TokenGrid, parallel_env
from marlkit.envs.pettingzoo import PettingZooConfig

pytest.importorskip("mettagrid")

FACTORY = "marlkit.envs.mettagrid:parallel_env"
SMALL = {"num_agents": 2, "width": 10, "height": 10, "hearts": 6, "walls": 4, "max_steps": 16}


def coord(row: int, col: int) -> int:
    return row << 4 | col


def test_tokens_land_at_their_cell_and_channel_scaled_by_their_normalisation():
    # 5 rows x 7 columns, features 0..3; feature 2's normalisation below 1 counts as 1
    grid = TokenGrid(5, 7, {0: 1.0, 1: 10.0, 2: 0.5, 3: 100.0})
    tokens = np.full((2, 8, 3), PADDING, np.uint8)
    tokens[0, :6] = [[coord(1, 2), 1, 5],     # 5 / 10 -> 0.5
                     [coord(4, 6), 0, 1],     # the last cell: 1 / 1
                     [GLOBAL, 3, 40],         # a global token: the centre cell (2, 3), 40 / 100
                     [coord(0, 0), 1, 30],    # 30 / 10 = 3, clipped to 1
                     [coord(5, 0), 1, 9],     # row 5 of 5: outside the view, dropped
                     [coord(2, 2), 9, 9]]     # feature 9: no such channel, dropped
    tokens[0, 6] = [PADDING, 2, 200]          # padding, whatever its feature and value
    tokens[1, 0] = [coord(3, 1), 2, 1]        # the second agent's own token
    images = grid(tokens)   # [A, H, W, C]
    assert images.shape == (2, 5, 7, 4) and images.dtype == np.uint8
    expected = np.zeros((2, 5, 7, 4))
    expected[0, 1, 2, 1] = 0.5
    expected[0, 4, 6, 0] = 1.0
    expected[0, 2, 3, 3] = 0.4
    expected[0, 0, 0, 1] = 1.0
    expected[1, 3, 1, 2] = 1.0
    # the cnn model reads uint8 as value / 255: within one step of 255 of value / normalisation
    np.testing.assert_allclose(images / 255.0, expected, atol=0.5 / 255)


def test_a_category_gets_a_plane_per_value_beside_its_scaled_channel():
    # feature 1 is a category of 3 values (agent 0, heart 1, wall 2): planes 2, 3, 4 after the 2 features
    grid = TokenGrid(3, 3, {0: 1.0, 1: 10.0}, categories={1: 3})
    tokens = np.full((1, 6, 3), PADDING, np.uint8)
    tokens[0, :4] = [[coord(0, 0), 1, 0],     # an agent: value 0, unseen in the scaled channel
                     [coord(1, 1), 1, 1],     # a heart
                     [coord(2, 2), 1, 2],     # a wall
                     [coord(2, 0), 1, 7]]     # no such category: the scaled channel alone
    images = grid(tokens)   # [A, H, W, C]
    assert images.shape == (1, 3, 3, 5)
    assert images[0, 0, 0, 2] == images[0, 1, 1, 3] == images[0, 2, 2, 4] == 255
    assert images[0, ..., 2:].sum() == 3 * 255
    np.testing.assert_array_equal(images[0, ..., 1], np.rint(np.array([[0, 0, 0], [0, 25.5, 0], [178.5, 0, 51]])))


def test_tag_planes_show_each_object_kind_on_the_real_game():
    scaled, planes = parallel_env(**SMALL), parallel_env(**SMALL, tags="planes")
    a, b = scaled.reset_arrays(seed=3)[0], planes.reset_arrays(seed=3)[0]
    n_tags = b.shape[-1] - a.shape[-1]
    assert n_tags == 3                                       # type:agent, type:heart, type:wall
    np.testing.assert_array_equal(b[..., :a.shape[-1]], a)  # the scaled channels unchanged
    agent_plane = b[..., a.shape[-1]]
    assert (agent_plane[:, 6, 6] == 255).all()               # every agent sees itself at the centre
    with pytest.raises(ConfigError, match="env.kwargs.tags"):
        parallel_env(tags="onehot")


def reference_images(tokens: np.ndarray, height: int, width: int, normalisation: dict[int, float]) -> np.ndarray:
    """A plain loop over every token, as mettagrid's GridObsWrapper defines the image, clipped at 1:
    ``[A, H, W, C]``."""
    channels = max(normalisation) + 1
    out = np.zeros((tokens.shape[0], height, width, channels))
    for a, agent_tokens in enumerate(tokens):
        for c, fid, value in agent_tokens.tolist():
            if c == PADDING:
                continue
            row, col = (height // 2, width // 2) if c == GLOBAL else (c >> 4, c & 0x0F)
            if row < height and col < width and fid < channels:
                out[a, row, col, fid] += value / max(normalisation[fid], 1.0)
    return np.minimum(out, 1.0)


def test_the_real_games_tokens_match_the_reference_at_every_step():
    from mettagrid.policy.policy_env_interface import PolicyEnvInterface
    env = parallel_env(**{**SMALL, "max_steps": 40})
    info = PolicyEnvInterface.from_mg_cfg(env.cfg)
    normalisation = {int(f.id): f.normalization for f in info.obs_features}
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(30):
        env.step({a: int(rng.integers(5)) for a in env.agents})
        tokens = env._game.observations()
        expected = reference_images(tokens, info.obs_height, info.obs_width, normalisation)
        np.testing.assert_allclose(env.grid(tokens) / 255.0, expected, atol=0.5 / 255)
    # walls and hearts in view, and the global tokens at the centre
    assert (tokens[:, :, 0] == GLOBAL).any() and expected.any(axis=(0, 1, 2)).sum() >= 4


def test_the_game_built_from_one_converted_config_plays_the_game_of_mettagrids_simulation():
    """The env builds each episode's C++ game from a config converted once and steps the C++ game
    alone; mettagrid's own Simulation, given the same config and seed, converts it anew and steps
    through its timers. The same views, rewards and ends at every step, through three episodes. A
    game with an event handler (a game-stat threshold ends its episodes) keeps the Simulation."""
    from mettagrid.config.mettagrid_config import MettaGridConfig
    from mettagrid.policy.policy_env_interface import PolicyEnvInterface
    from mettagrid.simulator import Simulation
    from marlkit.envs.mettagrid import MettaGridEnv, forage_config
    env = parallel_env(**SMALL, tags="planes")
    names = PolicyEnvInterface.from_mg_cfg(env.cfg).action_names   # the policy's actions, by name
    rng = np.random.default_rng(1)
    for episode in range(3):
        views = env.reset_arrays(seed=episode if episode < 2 else None)[0]
        seed = env.cfg.game.map_builder.seed   # the episode's, drawn from reset's
        sim = Simulation(MettaGridConfig.model_validate(env.cfg.model_dump()), seed=seed)
        np.testing.assert_array_equal(views, env.grid(sim._c_sim.observations()))
        for t in range(SMALL["max_steps"]):
            actions = rng.integers(5, size=SMALL["num_agents"])
            for i, a in enumerate(actions):
                sim.agent(i).set_action(names[a])
            sim.step()
            game = sim._c_sim
            expected = (env.grid(game.observations()), game.rewards(), game.terminals(), game.truncations())
            for a, b in zip(env.step_arrays(actions)[:4], expected):
                np.testing.assert_array_equal(a, b)
        assert a.all() and sim.is_done()   # truncated at max_steps on both
        sim.close()
    assert env._sim is None and env._step == env._game.step
    cfg = forage_config(**SMALL)
    cfg.game.end_episode_on_game_stats = {"heart.gained": 3.0}
    watched = MettaGridEnv(MettaGridConfig.model_validate(cfg.model_dump()))
    watched.reset_arrays(seed=0)
    assert watched._step == watched._sim.step


def test_the_spec_marlkit_reads_and_an_episode_that_ends_as_a_truncation():
    env = make_env(PettingZooConfig(factory=FACTORY, kwargs=SMALL))
    group = env.spec.groups["agents"]
    assert list(env.spec.groups) == ["agents"] and group.agents == ["agent_0", "agent_1"]
    channels = group.obs_shape[-1]
    # [H, W, C], as the env declares it (the shape alone would read as channels first)
    assert group.obs_shape == (13, 13, channels) and channels >= 10 and group.n_actions == 5
    assert group.channels_last and group.observation_space.dtype == np.uint8
    # no state() of its own: the agents' views stacked along the channels, channels first
    assert env.spec.state_shape == (2 * channels, 13, 13) and env.spec.state_from_obs
    assert env.spec.state_channels_last is False
    first = env.reset(seed=7)
    assert first.obs["agents"].shape == (2, 13, 13, channels)
    np.testing.assert_array_equal(first.state, first.obs["agents"].transpose(0, 3, 1, 2).reshape(2 * channels, 13, 13))
    rng = np.random.default_rng(0)
    team_return = 0.0
    for t in range(1, 17):
        _, reward, terminated, truncated, done = env.step({"agents": rng.integers(0, 5, 2)})
        team_return += float(reward["agents"].sum())
        assert done == (t == 16) and not terminated["agents"].any()
        assert truncated["agents"].tolist() == [t == 16] * 2
        assert set(reward["agents"].tolist()) <= {0.0, 1.0}   # a heart picked up pays 1
    assert 0 <= team_return <= SMALL["hearts"]
    # the map comes from the seed: the same seed, the same first views; another, another map
    np.testing.assert_array_equal(env.reset(seed=7).obs["agents"], first.obs["agents"])
    assert not np.array_equal(env.reset(seed=8).obs["agents"], first.obs["agents"])
    env.close()


def test_walking_into_a_heart_picks_it_up_and_pays_one():
    """A scripted forager, greedy on the hearts channel of its own view, collects far more than
    random moves: the reward is there for a policy to learn."""
    env = parallel_env(num_agents=1, width=16, height=16, hearts=12, walls=0, max_steps=64)
    heart = int(env.cfg.game.id_map().feature_id("inv:heart"))
    moves = {(-1, 0): 1, (1, 0): 2, (0, -1): 3, (0, 1): 4}   # north, south, west, east

    def greedy(view):
        cells = np.argwhere(view[..., heart] > 0)   # view: [H, W, C]
        cells = cells[(cells != (6, 6)).any(axis=1)]   # the agent's own inventory, at the centre
        if not len(cells):
            return 4
        dy, dx = cells[np.abs(cells - 6).sum(axis=1).argmin()] - 6
        return moves[(int(np.sign(dy)), 0)] if dy else moves[(0, int(np.sign(dx)))]

    def play(policy, seed):
        obs, _ = env.reset(seed=seed)
        total = 0.0
        while env.agents:
            obs, reward, *_ = env.step({"agent_0": policy(obs["agent_0"])})
            total += reward["agent_0"]
        return total

    rng = np.random.default_rng(0)
    scripted = [play(greedy, s) for s in range(5)]
    random = [play(lambda _: int(rng.integers(5)), s) for s in range(5)]
    assert np.mean(scripted) >= 4 and np.mean(scripted) > 2 * np.mean(random) + 1


def test_mappo_with_a_cnn_and_a_gru_trains_on_the_packaged_yaml(tiny):
    kwargs = {f"env.kwargs.{k}": v for k, v in SMALL.items()}
    result = marlkit.run(agent="MAPPO", env="mettagrid", seed=1,
                         **{**tiny, **kwargs, "runner.parallels": 2, "runner.horizon": 32,
                            "runner.total_steps": 64, "runner.overlap": False})
    assert result.steps == 64
    losses = {k: v for k, v in result.metrics.items() if k.endswith(("_loss", "entropy"))}
    assert {"agents/policy_loss", "agents/value_loss", "agents/entropy"} <= set(losses)
    assert all(math.isfinite(v) for v in losses.values())
    returns = [r["agents"] for r in result.episode_returns]
    assert len(returns) == 4 and all(0 <= r <= SMALL["hearts"] for r in returns)   # 2 envs x 2 episodes
    saved = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert saved["agents"]["MAPPO"]["actor"]["name"] == "gru"
    assert saved["agents"]["MAPPO"]["actor"]["kwargs"]["encoder"] == "cnn"


def test_a_missing_package_or_an_unknown_map_is_a_config_error(monkeypatch):
    with pytest.raises(ConfigError, match="not a mettagrid map marlkit builds; choose one of"):
        parallel_env(map="arena")
    with pytest.raises(ConfigError, match="do not fit"):
        parallel_env(width=5, height=5)
    monkeypatch.setitem(sys.modules, "mettagrid", None)
    with pytest.raises(ConfigError, match=r"pip install -e \.\[mettagrid\]"):
        parallel_env()
