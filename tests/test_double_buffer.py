"""Double-buffered collection (``runner.double_buffer``): two parts of the envs step by turns while
the policies act on the other; the same training as acting on blocks of a part's size without it,
bit for bit; the vector env's stepping of a part alone; the settings it refuses."""
import numpy as np
import pytest

import marlkit
from conftest import assert_same_training
from marlkit.config import ConfigError, RunnerConfig
from marlkit.api import build_config
from marlkit.envs.factory import make_env_vector
from marlkit.envs.vector.subprocess import SubprocVectorEnv

WORKERS = {"runner.vectorize": "subprocess", "runner.workers": 2, "runner.act_in_workers": False}
GRU = {"name": "gru", "hidden_sizes": [32], "rnn_hidden": 32}


@pytest.fixture
def part_steps(monkeypatch):
    """The ``envs`` of every ``SubprocVectorEnv.step_async`` of one part, as the runs make them."""
    calls = []
    step_async = SubprocVectorEnv.step_async

    def spy(self, actions, envs=None):
        if envs is not None:
            calls.append(envs)
        return step_async(self, actions, envs)
    monkeypatch.setattr(SubprocVectorEnv, "step_async", spy)
    return calls


def _pair(agent, env, tiny, part_steps, seed=3, double_settings=None, **settings):
    """The same run, collected with the envs stepped as one (acting on blocks of ``act_batch``) and
    double-buffered (with ``double_settings`` on top), which stepped its parts by turns."""
    common = {**tiny, **WORKERS, **settings}
    plain = marlkit.run(agent=agent, env=env, seed=seed, **common)
    assert not part_steps
    double = marlkit.run(agent=agent, env=env, seed=seed,
                         **{**common, "runner.double_buffer": True, **(double_settings or {})})
    parts = sorted(set(part_steps))
    assert len(parts) == 2 and parts[0][0] == 0 and parts[0][1] == parts[1][0]
    # a step of each part per vector step (an overlapped run collects one rollout more)
    assert len(part_steps) >= 2 * double.steps // sum(count for _, count in parts)
    return plain, double


@pytest.mark.slow
@pytest.mark.exact
@pytest.mark.parametrize("agent", ["MAPPO", "MAT"])
@pytest.mark.parametrize("overlap", [True, False])
def test_double_buffered_collection_trains_as_acting_on_each_part_alone(tiny, part_steps, agent, overlap):
    """4 envs over 2 workers: a part is a worker's 2 envs, so ``act_batch: 2`` acts on the same
    batches without double buffering, and the runs are the same bit for bit."""
    plain, double = _pair(agent, "mpe_spread", tiny, part_steps, **{"runner.parallels": 4, "runner.horizon": 25,
                                                        "runner.total_steps": 400, "runner.overlap": overlap,
                                                        "runner.act_batch": 2})
    assert plain.episode_returns and plain.steps == double.steps == 400
    assert_same_training(plain, double)


@pytest.mark.exact
def test_double_buffered_without_act_batch_acts_on_each_part_in_one_pass(tiny, part_steps):
    """The default ``act_batch: null`` acts on a whole part at once: the run acting on blocks of a
    part's size without double buffering, bit for bit."""
    plain, double = _pair("MAPPO", "mpe_spread", tiny, part_steps, double_settings={"runner.act_batch": None},
                          **{"runner.parallels": 4, "runner.horizon": 25, "runner.total_steps": 300,
                             "runner.act_batch": 2})
    assert plain.episode_returns
    assert_same_training(plain, double)


def test_recurrent_agents_with_dying_agents_and_truncation_double_buffered(tiny, env_yaml, part_steps):
    """A GRU actor and critic on the scripted env (agents die and appear mid-episode, episodes are
    cut by a time limit), 5 envs over 2 workers (parts of 3 and 2 envs), every env acted on alone
    (``act_batch: 1``): hidden states, masks, truncation finals and the episodes' order come out of
    the two parts as one collect makes them."""
    path = env_yaml("toy_envs:scripted", {"length": 7}, env={"max_episode_steps": 5})
    plain, double = _pair("MAPPO", path, tiny, part_steps, **{
        "runner.parallels": 5, "runner.horizon": 10, "runner.total_steps": 100, "agents.MAPPO.actor": GRU,
        "agents.MAPPO.critic": GRU, "agents.MAPPO.chunk_length": 5, "agents.MAPPO.critic_input": "state",
        "runner.act_batch": 1})
    assert plain.episode_returns and plain.steps == double.steps == 100
    assert plain.episode_returns == double.episode_returns
    assert_same_training(plain, double)


@pytest.mark.exact
def test_a_group_that_does_not_learn_is_double_buffered_too(tiny, part_steps):
    """mpe_tag with a random policy for the fleeing agent: both groups act on each part."""
    plain, double = _pair("MAPPO", "mpe_tag", tiny, part_steps, **{"runner.parallels": 4, "runner.horizon": 25,
                                                       "runner.total_steps": 300, "groups.agent.agent": "random",
                                                       "runner.act_batch": 2})
    assert_same_training(plain, double, group="adversary")


def test_a_part_steps_alone_and_writes_only_its_own_rows():
    """``step_async`` of one part leaves the other part's envs where they were: stepping part 0
    twice and part 1 once gives part 1 the result of stepping all envs once, and episode lengths
    count per part."""
    cfg = build_config("MAPPO", "mpe_spread", overrides={"runner": {"vectorize": "subprocess", "parallels": 4,
                                                                     "workers": 2}})
    venv = make_env_vector(cfg.env, cfg.runner)
    try:
        assert venv.splits(2) == [(0, 2), (2, 2)]
        obs = venv.reset(seed=5)
        n_actions = venv.spec.groups["agents"].n_actions
        actions = {"agents": np.full((2, 3), n_actions - 1)}
        venv.step_async(actions, (0, 2))
        first = venv.step_wait((0, 2))
        assert first.next.obs["agents"].shape == (2, 3) + obs.obs["agents"].shape[2:]
        venv.step_async(actions, (0, 2))
        venv.step_wait((0, 2))
        venv.step_async(actions, (2, 2))
        other = venv.step_wait((2, 2))
        # envs 2-3 moved once, as envs 0-1 did in their first step (the same seeds' layouts differ,
        # so compare with a fresh vector env stepped whole)
        reference = make_env_vector(cfg.env, cfg.runner)
        try:
            reference.reset(seed=5)
            whole = reference.step({"agents": np.full((4, 3), n_actions - 1)})
        finally:
            reference.close()
        np.testing.assert_array_equal(other.next.obs["agents"], whole.next.obs["agents"][2:])
        np.testing.assert_array_equal(first.next.obs["agents"], whole.next.obs["agents"][:2])
        np.testing.assert_array_equal(venv.counter.length, [2, 2, 1, 1])
        with pytest.raises(RuntimeError, match=r"step_wait of envs \(2, 2\), which step_async did not start"):
            venv.step_wait((2, 2))
        venv.step_async(actions, (0, 2))
        with pytest.raises(RuntimeError, match=r"step_async of envs \(0, 2\) while their step is in flight"):
            venv.step_async(actions, (0, 2))
        with pytest.raises(RuntimeError, match=r"'state_dict' while the workers \[0\] have a step in flight"):
            venv.workers.state_dict()
        venv.step_wait((0, 2))
        assert len(venv.workers.state_dict()) == 4
        with pytest.raises(ValueError, match=r"envs 1-2 are not whole workers' envs"):
            venv.step_async({"agents": np.zeros((2, 3), int)}, (1, 2))
        with pytest.raises(ValueError, match=r"3 parts of the envs of 2 env workers"):
            venv.splits(3)
    finally:
        venv.close()


@pytest.mark.parametrize("settings, named", [
    ({"runner.vectorize": "sync"}, r"runner.vectorize: sync with runner.parallels: 4\b.* has none"),
    ({"runner.vectorize": "subprocess", "runner.workers": 1},
     r"runner.vectorize: subprocess with runner.parallels: 4 and runner.workers: 1 has one env worker"),
    ({"runner.vectorize": "auto", "runner.parallels": 1}, r"runner.parallels: 1\b.* has none"),
])
def test_double_buffering_without_two_env_workers_is_refused_naming_the_fix(tiny, settings, named):
    with pytest.raises(ConfigError, match=r"runner.double_buffer: true steps two parts.*" + named
                       + r".*set runner.vectorize: subprocess with runner.parallels and runner.workers 2 or more, "
                         r"or runner.double_buffer: false"):
        marlkit.run(agent="MAPPO", env="mpe_spread", **{**tiny, "runner.parallels": 4, **settings,
                                                         "runner.double_buffer": True})


def test_double_buffering_with_one_act_batch_block_is_refused_naming_the_fix(tiny):
    """Env workers hold whole blocks of ``act_batch`` envs: one block is one worker."""
    with pytest.raises(ConfigError, match=r"runner.act_batch: 4 puts all runner.parallels: 4 envs in one block.*"
                                          r"set runner.act_batch below runner.parallels"):
        marlkit.run(agent="MAPPO", env="mpe_spread", **{**tiny, **WORKERS, "runner.parallels": 4,
                                                         "runner.act_batch": 4, "runner.double_buffer": True})


def test_a_parts_columns_are_views_of_the_rollout_and_hand_over_finals_and_extras():
    """Each part fills its columns of the collect's rollout in place; finals (env indices of the
    whole rollout, in (step, env) order) and the extras a part made come over on adoption."""
    from marlkit.storage import Rollout
    from marlkit.storage.layout import Transition
    rollout = Rollout(horizon=2, num_envs=3, n_agents=1, obs_shape=(2,), obs_dtype=np.float32, state_shape=(1,),
                      action_shape=(), action_dtype=np.int64, n_actions=2)
    parts = [rollout.columns(0, 2), rollout.columns(2, 1)]
    for t in range(2):
        for part, first in zip(parts, (0, 2)):
            n = part.num_envs
            cut = np.zeros((n, 1), bool)
            cut[-1] = t == 0   # the part's last env is cut by a time limit at step 0
            part.add(Transition(np.full((n, 1, 2), 10 * t + first, np.float32), np.zeros((n, 1)), np.ones((n, 1), bool),
                                np.ones((n, 1, 2), bool), np.zeros((n, 1), np.int64), np.zeros((n, 1), np.float32),
                                np.zeros((n, 1), np.float32), np.ones((n, 1), np.float32), np.zeros((n, 1), bool),
                                cut, cut[:, 0], np.full((n, 1, 2), -first, np.float32), np.zeros((n, 1)), None, None,
                                {"aux": np.full((n, 1), first, np.float32)}))
    assert rollout.step == 0 and np.shares_memory(parts[1].obs, rollout.obs)
    rollout.adopt_columns(parts)
    assert rollout.full
    np.testing.assert_array_equal(rollout.obs[:, :, 0, 0], [[0, 0, 2], [10, 10, 12]])
    np.testing.assert_array_equal(rollout.extras["aux"][0, :, 0], [0, 0, 2])
    assert [(t, e) for t, e, *_ in rollout.finals] == [(0, 1), (0, 2)]
    assert rollout.finals[1][2][0, 0] == -2
    with pytest.raises(ValueError, match=r"2 columns of \[2, 1\] envs and \[2, 0\] steps do not make one of 3"):
        rollout.adopt_columns([_full(rollout.columns(0, 2)), rollout.columns(2, 1)])


def _full(rollout):
    rollout.step = rollout.horizon
    return rollout


def test_double_buffering_with_the_workers_acting_is_refused_and_null_means_acting_here(tiny):
    with pytest.raises(ConfigError, match=r"runner.act_in_workers: true acts in the workers; set one of them false"):
        marlkit.run(agent="MAPPO", env="mpe_spread", **{**tiny, "runner.parallels": 4, "runner.vectorize": "subprocess",
                                                         "runner.act_in_workers": True, "runner.double_buffer": True})
    assert not RunnerConfig(vectorize="subprocess", double_buffer=True).acts_in_workers()
    assert RunnerConfig(vectorize="subprocess").acts_in_workers()


@pytest.mark.slow
@pytest.mark.exact
def test_a_double_buffered_run_resumes_exactly_without_it_and_back(tiny, part_steps):
    """Saved double-buffered (the next rollout in flight), resumed stepping the envs as one, then
    double-buffered again: the run ends where an uninterrupted double-buffered one does (acting on
    a worker's 2 envs at a time, ``act_batch: 2``, wherever it is)."""
    common = {**tiny, **WORKERS, "runner.parallels": 4, "runner.horizon": 25, "runner.save_interval": 300,
              "runner.act_batch": 2, "runner.double_buffer": True}
    full = marlkit.run(agent="MAPPO", env="mpe_spread", seed=4, **{**common, "runner.total_steps": 900})
    half = marlkit.run(agent="MAPPO", env="mpe_spread", seed=4, **{**common, "runner.total_steps": 300})
    part_steps.clear()
    marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 600, "runner.double_buffer": False})
    assert not part_steps
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 900, "runner.double_buffer": True})
    assert sorted(set(part_steps)) == [(0, 2), (2, 2)]
    assert resumed.steps == 900
    assert_same_training(full, resumed)
