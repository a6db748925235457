"""Groups with different spaces, a different agent per group, and frozen opponents."""
import numpy as np
import pytest

import marlkit
from marlkit.config import ConfigError
from marlkit.envs.pettingzoo import PettingZooEnv
from toy_envs import TwoTeamEnv


def test_groups_by_prefix_with_their_own_spaces():
    env = PettingZooEnv(TwoTeamEnv())
    assert {g: gs.agents for g, gs in env.groups.items()} == {"predator": ["predator_0"], "prey": ["prey_0", "prey_1"]}
    assert env.groups["predator"].n_actions == 4 and env.groups["prey"].n_actions == 0
    ob = env.reset(seed=0)
    assert ob.obs["predator"].shape == (1, 3) and ob.obs["prey"].shape == (2, 5)
    assert ob.state.shape == (3 + 5 + 5,)            # concatenated observations
    np.testing.assert_array_equal(ob.state, np.concatenate([ob.obs["predator"].ravel(), ob.obs["prey"].ravel()]))


def test_explicit_group_patterns_and_their_errors():
    env = PettingZooEnv(TwoTeamEnv(), groups={"hunters": ["predator_*"], "herd": ["prey_*"]})
    assert list(env.groups) == ["hunters", "herd"]
    with pytest.raises(ConfigError, match="agent 'prey_1' matches no group"):
        PettingZooEnv(TwoTeamEnv(), groups={"hunters": ["predator_*"], "herd": ["prey_0"]})
    with pytest.raises(ConfigError, match="have different spaces.*or set env.pad_spaces: true"):
        PettingZooEnv(TwoTeamEnv(), groups={"everyone": ["*"]})


def _speaker_listener(**kwargs):
    from mpe2 import simple_speaker_listener_v4
    return simple_speaker_listener_v4.parallel_env(max_cycles=25, **kwargs)


def test_unlike_agents_padded_to_one_group():
    """simple_speaker_listener: the speaker observes 3 values and has 3 actions, the listener 11 and
    5. Padded, both are slots of one group: the speaker's observation in its first 3 entries and
    zeros after, its last 2 actions masked; an action outside an agent's own space is refused."""
    env = PettingZooEnv(_speaker_listener(continuous_actions=False), pad_spaces=True)
    (group,) = env.groups.values()
    assert group.agents == ["speaker_0", "listener_0"] and group.obs_shape == (11,) and group.n_actions == 5
    ob = env.reset(seed=4)
    rng = np.random.default_rng(0)
    for _ in range(25):
        speaker, listener = ob.obs["agents"]
        assert not speaker[3:].any() and speaker[:3].any()
        np.testing.assert_array_equal(ob.action_mask["agents"], [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
        actions = np.array([rng.integers(3), rng.integers(5)])
        ob, _, _, _, over = env.step({"agents": actions})
        if over:
            break
    assert over
    env.reset(seed=5)
    with pytest.raises(ValueError, match="agent 'speaker_0' was given action index 4"):
        env.step({"agents": np.array([4, 0])})


def test_padding_refuses_what_it_cannot_pad_naming_the_agent():
    with pytest.raises(ConfigError, match=r"env.pad_spaces: agent 'speaker_0' of group 'agents' acts in Box.*"
                                          r"only Discrete actions are padded"):
        PettingZooEnv(_speaker_listener(continuous_actions=True), pad_spaces=True)


@pytest.mark.slow
@pytest.mark.parametrize("agent,pad_spaces", [("QMIX", True), ("MAPPO", True), ("QMIX", False)])
def test_one_mixer_or_critic_learns_for_a_team_of_unlike_agents(tiny, agent, pad_spaces):
    """mpe_speaker_listener: one QMIX mixer (or one MAPPO critic) over both agents, whether they
    are padded into one group or are two groups of one team; the team learns within 12k env steps
    (random play about -51 per episode; -34 for QMIX at 10k on the 2-core VM)."""
    run = marlkit.run(agent=agent, env="mpe_speaker_listener", mode="benchmark", seed=1, **{
        **tiny, "env.pad_spaces": pad_spaces, "runner.vectorize": "sync", "runner.parallels": 16,
        "runner.horizon": 25, "runner.total_steps": 12_000, "runner.eval_interval": 12_000,
        "runner.eval_episodes": 32, "runner.eval_parallels": 8})
    [team] = run.teams.values()
    random, last = run.baseline["teams"], run.evaluations[-1]["teams"]
    random, last = [float(np.mean([row[t]["mean"] for t in run.teams])) for row in (random, last)]
    assert len(team) == (1 if pad_spaces else 2)
    assert random < -40 and last > random + 12, (random, last)


@pytest.mark.slow
def test_both_groups_learn_their_own_task(env_yaml, tiny):
    """Discrete predator (reward for action 2) and continuous prey (reward -|a - 0.5|) improve (the
    last 20 episodes at 6k env steps: 8.0 and -1.48; at 8k 8.0 and -1.00)."""
    path = env_yaml("toy_envs:two_team", {"length": 8})
    overrides = {**tiny, "runner.parallels": 8, "runner.horizon": 16, "runner.total_steps": 6_000,
                 "agents.MAPPO.lr": 3e-3, "agents.MAPPO.log_std_init": -1.0}
    result = marlkit.run(agent="MAPPO", env=path, seed=3, **overrides)
    last = result.episode_returns[-20:]
    # random play: predator 8 * 1/4 = 2; prey 8 steps * 2 dims * E|U(-1,1) - 0.5| = -10
    assert np.mean([r["predator"] for r in last]) > 6.0
    assert np.mean([r["prey"] for r in last]) > -3.0
    assert {"predator/policy_loss", "prey/policy_loss"} <= result.metrics.keys()


def test_each_group_can_run_a_different_agent(env_yaml, tiny):
    path = env_yaml("toy_envs:two_team", groups={"predator": {"agent": "random"}, "prey": {"agent": "IPPO"}})
    result = marlkit.run(agent="MAPPO", env=path, **{**tiny, "runner.total_steps": 200})
    assert "prey/policy_loss" in result.metrics and "predator/policy_loss" not in result.metrics


def test_unknown_group_name_is_named(env_yaml, tiny):
    path = env_yaml("toy_envs:two_team", groups={"predators": {"agent": "random"}})
    with pytest.raises(ConfigError, match="unknown group 'predators' \\(did you mean 'predator'\\?\\)"):
        marlkit.run(agent="MAPPO", env=path, **tiny)


def test_frozen_checkpoint_opponent(env_yaml, tiny):
    """Self-play style: the predator plays a frozen checkpoint while the prey keeps learning."""
    path = env_yaml("toy_envs:two_team", {"length": 8})
    first = marlkit.run(agent="MAPPO", env=path, **{**tiny, "runner.total_steps": 200})
    frozen = str(first.run_dir / "latest.pt")
    path2 = env_yaml("toy_envs:two_team", {"length": 8}, name="toy2.yaml",
                     groups={"predator": {"load": frozen, "train": False}})
    # the env name must match the checkpoint's, so use the same file name stem
    import shutil
    shutil.copy(path2, path)
    second = marlkit.run(agent="MAPPO", env=path, **{**tiny, "runner.total_steps": 200})
    assert "prey/policy_loss" in second.metrics and "predator/policy_loss" not in second.metrics


def test_concatenated_state_equals_mpe_state():
    """mpe_spread.yaml uses state: concat as a shortcut; it must equal simple_spread's own state()."""
    from mpe2 import simple_spread_v3
    auto = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25), state="auto")
    concat = PettingZooEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25), state="concat")
    assert auto.spec.state_shape == concat.spec.state_shape == (54,)
    a, c = auto.reset(seed=5), concat.reset(seed=5)
    rng = np.random.default_rng(0)
    for _ in range(25):                       # one whole episode, its last step included
        actions = {"agents": rng.integers(0, 5, 3)}
        a, *_ = auto.step(actions)
        c, *_ = concat.step(actions)
        np.testing.assert_array_equal(a.state, c.state)


def test_packaged_competitive_env_has_two_groups(tiny):
    from marlkit.api import build_config
    from marlkit.envs.factory import make_env
    env = make_env(build_config("MAPPO", "mpe_tag").env)
    assert {g: gs.agents for g, gs in env.groups.items()} == {
        "adversary": ["adversary_0", "adversary_1", "adversary_2"], "agent": ["agent_0"]}
    assert env.groups["adversary"].obs_shape != env.groups["agent"].obs_shape
    run = marlkit.run(agent="MAPPO", env="mpe_tag", **{**tiny, "runner.total_steps": 100,
                                                      "groups": {"agent": {"agent": "random"}}})
    assert "adversary/policy_loss" in run.metrics and "agent/policy_loss" not in run.metrics
    assert "agent/episode_return" in run.metrics
