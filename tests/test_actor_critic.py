"""The off-policy actor-critics of continuous actions (IDDPG, MADDPG, MATD3, ISAC, MASAC): actions
within the Box, the replay of transitions, absent agents out of both losses, learning, resume, the
refusals."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

import marlkit
from conftest import assert_same_training
from marlkit.agents.base import Progress
from marlkit.api import build_config
from marlkit.config import ConfigError
from marlkit.random_streams import GeneratorNoise
from marlkit.registry import get_agent
from marlkit.spec import EnvSpec, GroupSpec
from marlkit.storage import Bootstrap, Collected, StorageLayout, TransitionReplay

FAMILY = ["IDDPG", "MADDPG", "MATD3", "ISAC", "MASAC"]


def _two_team(env_yaml, agent: str) -> str:
    """The prey of ``toy_envs:two_team`` (two agents, Box(-1, 1, (2,)) actions, paid ``-|a - 0.5|``
    summed, 8 steps: random play earns about -10, the best 0) run by ``agent``."""
    return env_yaml("toy_envs:two_team", {"length": 8}, env={"exact_resume": True},
                    groups={"predator": {"agent": "random"}, "prey": {"agent": agent}})


def _quick(agent: str) -> dict:
    return {"runner.parallels": 4, "runner.horizon": 8, "runner.vectorize": "sync",
            f"agents.{agent}.learning_starts": 256, f"agents.{agent}.batch_size": 64,
            f"agents.{agent}.gradient_steps_per_env_step": 0.5}


def _spec(n_agents=3, low=0.0, high=1.0, obs=4, state=6) -> tuple[GroupSpec, EnvSpec]:
    group = GroupSpec("agents", [f"a{i}" for i in range(n_agents)], spaces.Box(-5, 5, (obs,), np.float32),
                      spaces.Box(low, high, (2,), np.float32))
    return group, EnvSpec({"agents": group}, (state,))


# ---------------------------------------------------------------------- acting


@pytest.mark.parametrize("agent", FAMILY)
def test_actions_stay_within_the_box_and_evaluation_is_deterministic(agent):
    group, env = _spec(low=0.0, high=1.0)
    cfg = build_config(agent, "mpe_spread").agents[agent]
    cfg.learning_starts = 100
    if hasattr(cfg, "exploration_noise"):
        cfg.exploration_noise = 5.0   # noise far wider than the box: every action is clipped into it
    policy = get_agent(agent)(group, env, cfg, seed=1)
    obs, mask = np.random.default_rng(0).normal(size=(64, 3, 4)).astype(np.float32), np.ones((64, 3), bool)
    state, allowed = np.zeros((64, 6), np.float32), np.ones((64, 3, 0), bool)
    for steps in (0, 1000):   # uniform before learning_starts, the policy's noise after
        actions = policy.act(obs, state, mask, allowed, None, True, Progress(steps, 10 ** 6)).actions
        assert actions.shape == (64, 3, 2) and actions.dtype == np.float32
        assert actions.min() >= 0.0 and actions.max() <= 1.0
        assert (actions < 0.25).mean() > 0.1 and (actions > 0.75).mean() > 0.1, "exploration spans the box"
    greedy = [policy.act(obs, state, mask, allowed, None, False, None).actions for _ in range(2)]
    np.testing.assert_array_equal(*greedy)
    assert 0.0 <= greedy[0].min() and greedy[0].max() <= 1.0


# ---------------------------------------------------------------------- the replay of transitions


def test_the_replay_keeps_what_followed_each_step_and_whether_its_value_counts():
    """Env 0's episode is cut by a time limit at step 1 (its next observation is the final one, and
    it counts); env 1's agent 1 terminates at step 0 (its next value does not count) and both of
    env 1's agents are absent at step 2 (no transition)."""
    group, env = _spec(n_agents=2, obs=1, state=1)
    replay = TransitionReplay(StorageLayout(group, env, num_envs=2, horizon=3), capacity=4, stores_state=True)
    rollout = replay.next_rollout()
    rollout.obs[..., 0] = np.arange(12).reshape(3, 2, 2)           # obs of step t, env e, agent a: 4t + 2e + a
    rollout.state[..., 0] = np.arange(6).reshape(3, 2)
    rollout.agent_mask[:] = True
    rollout.agent_mask[2, 1] = False
    rollout.reward[..., :] = np.arange(6).reshape(3, 2, 1)
    rollout.episode_end[1, 0] = True
    rollout.truncated[1, 0] = True
    rollout.terminated[0, 1, 1] = True
    rollout.agent_end[0, 1, 1] = True
    rollout.finals.append((1, 0, np.full((2, 1), 100.0, np.float32), np.array([50.0], np.float32), None, None))
    after = Bootstrap(np.full((2, 2, 1), -1.0, np.float32), np.full((2, 1), -2.0, np.float32),
                      np.ones((2, 2), bool), np.ones((2, 2, 0), bool), None)
    batch = replay.finish(Collected(rollout, after))
    assert batch.new_episodes == 1 and batch.env_steps == 6
    # five transitions into four slots: the first, (t=0, e=0), gives way; the rest in time order
    assert replay.transitions == 5 and len(replay) == 4
    rows = replay.take(np.arange(4))
    np.testing.assert_array_equal(rows["obs"][:, :, 0], [[2, 3], [4, 5], [6, 7], [8, 9]])
    np.testing.assert_array_equal(rows["next_obs"][:, :, 0], [[6, 7], [100, 100], [10, 11], [-1, -1]])
    np.testing.assert_array_equal(rows["next_state"][:, 0], [3, 50, 5, -2])
    np.testing.assert_array_equal(rows["bootstrap"], [[True, False], [True, True], [False, False], [True, True]])
    np.testing.assert_array_equal(rows["reward"][:, 0], [1, 2, 3, 4])

    kept = replay.state_dict()
    assert all(len(v) == 4 for v in kept["held"].values())
    again = TransitionReplay(StorageLayout(group, env, 2, 3), capacity=4, stores_state=True)
    again.load_state_dict(kept)
    for name, value in replay.take(np.arange(4)).items():
        np.testing.assert_array_equal(again.take(np.arange(4))[name], value)
    assert again.next_slot == replay.next_slot == 0 and again.transitions == 5


# ---------------------------------------------------------------------- masks


@pytest.mark.parametrize("agent", ["IDDPG", "MATD3", "MASAC"])
def test_absent_agents_add_nothing_to_either_loss(agent):
    """Whatever an absent agent's slots hold (its observation, action and reward; its next
    observation where its value after the step does not count), the critic's and the actor's losses
    and their gradients are the same."""
    group, env = _spec(n_agents=3, low=-2.0, high=2.0)
    policy = get_agent(agent)(group, env, build_config(agent, "mpe_spread").agents[agent], seed=3)
    rng = np.random.default_rng(0)
    B = 16
    sample = {"obs": rng.normal(size=(B, 3, 4)), "next_obs": rng.normal(size=(B, 3, 4)),
              "actions": rng.uniform(-2, 2, size=(B, 3, 2)), "reward": rng.normal(size=(B, 3)),
              "state": rng.normal(size=(B, 6)), "next_state": rng.normal(size=(B, 6)),
              "agent_mask": rng.random((B, 3)) < 0.6, "bootstrap": rng.random((B, 3)) < 0.6}
    sample["agent_mask"][:, 0] = True
    sample["bootstrap"] &= sample["agent_mask"]
    absent, gone = ~sample["agent_mask"], ~sample["bootstrap"]
    corrupt = {k: v.copy() for k, v in sample.items()}
    corrupt["obs"][absent] = 1e3
    corrupt["actions"][absent] = 7.0
    corrupt["reward"][absent] = -1e3
    corrupt["next_obs"][gone] = -1e3

    def losses(s):
        x = policy.inputs({k: torch.as_tensor(v, dtype=torch.bool if v.dtype == bool else torch.float32)
                           for k, v in s.items()})
        params = [p for m in policy.modules.values() for p in m.parameters() if p.requires_grad]
        out = []
        for loss in (policy.critic_loss(x, GeneratorNoise(torch.Generator().manual_seed(0)))[0],
                     policy.actor_loss(x, GeneratorNoise(torch.Generator().manual_seed(1)))[0]):
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            out.append((loss.detach(), [g for g in grads if g is not None]))
        return out

    for (loss, grads), (loss_c, grads_c) in zip(losses(sample), losses(corrupt)):
        torch.testing.assert_close(loss, loss_c, rtol=1e-6, atol=1e-6)
        assert len(grads) == len(grads_c) > 0
        for g, g_c in zip(grads, grads_c):
            torch.testing.assert_close(g, g_c, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- learning and the runner's modes


@pytest.mark.parametrize("agent", FAMILY)
def test_learns_to_act_near_the_paid_point(tiny, env_yaml, agent):
    """Random play earns about -9.5 per episode, the best 0 (seeds 1-3 ended between -1.8 and -0.2
    after 2,000 env steps)."""
    run = marlkit.run(agent=agent, env=_two_team(env_yaml, agent), mode="benchmark", seed=1, **{
        **tiny, **_quick(agent), "runner.total_steps": 2000, "runner.eval_interval": 1000,
        "runner.eval_episodes": 8, "runner.eval_parallels": 4})
    first, last = run.evaluations[0]["mean"]["prey"], run.evaluations[-1]["mean"]["prey"]
    assert run.baseline["mean"]["prey"] < -8 and first < -7
    assert last >= -2.5, [e["mean"]["prey"] for e in run.evaluations]
    assert run.metrics["prey/gradient_steps"] > 0 and run.metrics["prey/replay_transitions"] > 0


@pytest.mark.exact
@pytest.mark.parametrize("agent", ["MATD3", "MASAC"])
def test_resume_continues_exactly_with_the_replay(tiny, env_yaml, agent):
    """Saved at 320 env steps with the replay, the optimisers, the temperature and the learner's
    generator, extended to 640: the run ends where an uninterrupted one does."""
    path = _two_team(env_yaml, agent)
    common = {**tiny, **_quick(agent), "runner.save_interval": 320}
    full = marlkit.run(agent=agent, env=path, seed=4, **{**common, "runner.total_steps": 640})
    half = marlkit.run(agent=agent, env=path, seed=4, **{**common, "runner.total_steps": 320})
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 640})
    assert resumed.steps == 640 and full.metrics["prey/gradient_steps"] > 0
    assert_same_training(full, resumed, group="prey")


@pytest.mark.exact
def test_acting_in_the_workers_trains_as_acting_here(tiny, env_yaml):
    """The policy's noise drawn in two env workers, each from its block's streams, and in this
    process on the same blocks: the same run."""
    path = _two_team(env_yaml, "MADDPG")
    common = {**tiny, **_quick("MADDPG"), "runner.vectorize": "subprocess", "runner.workers": 2,
              "runner.act_batch": 2, "runner.total_steps": 640}
    here = marlkit.run(agent="MADDPG", env=path, seed=3, **{**common, "runner.act_in_workers": False})
    there = marlkit.run(agent="MADDPG", env=path, seed=3, **{**common, "runner.act_in_workers": True})
    assert here.metrics["prey/gradient_steps"] > 0
    assert_same_training(here, there, group="prey")


def test_multiwalker_trains_with_its_continuous_torques(tiny):
    """SISL's multiwalker as packaged: three walkers, four torques each in [-1, 1]."""
    run = marlkit.run(agent="MATD3", env="multiwalker", seed=1, **{
        **tiny, "runner.vectorize": "sync", "runner.parallels": 2, "runner.horizon": 50, "runner.total_steps": 400,
        "agents.MATD3.learning_starts": 100, "agents.MATD3.batch_size": 32})
    # every env step of the two envs is one transition of the group (while a walker stands)
    assert run.metrics["agents/replay_transitions"] == 400 and run.metrics["agents/gradient_steps"] > 0


# ---------------------------------------------------------------------- refusals


def test_discrete_actions_are_refused_naming_what_fits(tiny):
    with pytest.raises(ConfigError, match=r"agents.MASAC: MASAC needs Box \(continuous\) actions, but group 'agents' "
                                          r"has Discrete\(5\); run it with MAPPO, IPPO or QMIX .*continuous_actions"):
        marlkit.run(agent="MASAC", env="mpe_spread", **tiny)


def test_recurrent_models_and_a_replay_too_big_are_refused_in_one_line(tiny):
    with pytest.raises(ConfigError, match=r"agents.MADDPG.actor.name='gru' is recurrent, but MADDPG learns from "
                                          r"single transitions"):
        marlkit.run(agent="MADDPG", env="mpe_spread_continuous", **{**tiny, "agents.MADDPG.actor": {"name": "gru"}})
    with pytest.raises(ConfigError, match=r"this run needs about .* GB .* agents.ISAC.buffer_size"):
        marlkit.run(agent="ISAC", env="mpe_spread_continuous", **{**tiny, "agents.ISAC.buffer_size": 10 ** 10})
