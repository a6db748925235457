"""Small PettingZoo ParallelEnvs with known behaviour, for the tests (factories usable from YAML as
``toy_envs:<function>`` because pytest puts this folder on sys.path, and spawned workers inherit it)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class ScriptedEnv(ParallelEnv):
    """Agents with scripted lifetimes: ``lifetimes[agent] = (first_step, last_step)``.

    Every present agent gets reward ``reward_of[agent]`` per step; an agent leaves with
    terminated=True after its last step; the episode lasts ``length`` steps (truncation at the end).
    Observations encode (agent index, step, random noise) and are deterministic given the seed.
    """

    metadata = {"name": "scripted_v0", "render_fps": 5}

    def __init__(self, length=10, lifetimes=None, reward_of=None, n_actions=3, obs_dim=4, render_mode=None):
        self.possible_agents = ["agent_0", "agent_1", "agent_2"]
        self.length = length
        self.lifetimes = lifetimes or {"agent_0": (0, length - 1), "agent_1": (0, 3), "agent_2": (3, length - 1)}
        self.reward_of = reward_of or {"agent_0": 1.0, "agent_1": 2.0, "agent_2": 3.0}
        self.n_actions, self.obs_dim = n_actions, obs_dim
        self.render_mode = render_mode
        self._obs_space = spaces.Box(-10, 10, (obs_dim,), np.float32)
        self._act_space = spaces.Discrete(n_actions)
        self.actions_seen: list[dict] = []

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def _alive(self, t):
        return [a for a in self.possible_agents if self.lifetimes[a][0] <= t <= self.lifetimes[a][1]]

    def _obs(self, agent):
        i = self.possible_agents.index(agent)
        noise = self.np_random.uniform(-1, 1, self.obs_dim - 2)
        return np.concatenate([[i, self.t / self.length], noise]).astype(np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None or not hasattr(self, "np_random"):
            self.np_random = np.random.default_rng(seed)
        self.t = 0
        self.agents = self._alive(0)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        acting = list(self.agents)
        self.actions_seen.append(dict(actions))
        rewards = {a: self.reward_of[a] for a in acting}
        terminations = {a: self.t >= self.lifetimes[a][1] and self.t < self.length - 1 for a in acting}
        truncations = {a: self.t >= self.length - 1 for a in acting}
        self.t += 1
        obs = {a: self._obs(a) for a in acting}
        infos = {a: {} for a in acting}
        survivors = [a for a in acting if not terminations[a] and not truncations[a]]
        newcomers = [a for a in self._alive(self.t) if a not in acting] if self.t < self.length else []
        for a in newcomers:
            obs[a], infos[a] = self._obs(a), {}
        self.agents = survivors + newcomers
        return obs, rewards, terminations, truncations, infos

    def render(self):
        frame = np.zeros((32, 32, 3), np.uint8)
        frame[:, : 3 * self.t % 32] = 200
        return frame


def scripted(**kwargs):
    return ScriptedEnv(**kwargs)


class MaskedChoiceEnv(ScriptedEnv):
    """All agents live the whole episode; each step only a rotating half of the actions is legal
    (given in the observation dict). An illegal action raises at once."""

    def __init__(self, length=20, n_actions=6, obs_dim=4):
        super().__init__(length=length, lifetimes={a: (0, length - 1) for a in ["agent_0", "agent_1", "agent_2"]},
                         n_actions=n_actions, obs_dim=obs_dim)
        self._obs_space = spaces.Dict({"observation": spaces.Box(-10, 10, (obs_dim,), np.float32),
                                       "action_mask": spaces.MultiBinary(n_actions)})

    def legal(self, agent, t):
        i = self.possible_agents.index(agent)
        return np.array([(k + i + t) % 2 == 0 for k in range(self.n_actions)], np.int8)

    def _obs(self, agent):
        return {"observation": super()._obs(agent), "action_mask": self.legal(agent, self.t)}

    def step(self, actions):
        for agent, action in actions.items():
            if not self.legal(agent, self.t)[action]:
                raise AssertionError(f"illegal action {action} for {agent} at step {self.t}")
        return super().step(actions)


def masked_choice(**kwargs):
    return MaskedChoiceEnv(**kwargs)


class TwoTeamEnv(ParallelEnv):
    """Two groups with different spaces: ``predator_0`` (Discrete(4), obs 3) and ``prey_0``,
    ``prey_1`` (Box(-1, 1, (2,)) actions, obs 5). Prey are rewarded for actions near +0.5,
    the predator for action 2."""

    metadata = {"name": "two_team_v0"}

    def __init__(self, length=8):
        self.possible_agents = ["predator_0", "prey_0", "prey_1"]
        self.length = length
        self.spaces_obs = {"predator_0": spaces.Box(-1, 1, (3,), np.float32)}
        self.spaces_obs.update({p: spaces.Box(-1, 1, (5,), np.float32) for p in ("prey_0", "prey_1")})
        self.spaces_act = {"predator_0": spaces.Discrete(4)}
        self.spaces_act.update({p: spaces.Box(-1, 1, (2,), np.float32) for p in ("prey_0", "prey_1")})
        self.last_actions = {}

    def observation_space(self, agent):
        return self.spaces_obs[agent]

    def action_space(self, agent):
        return self.spaces_act[agent]

    def _obs(self):
        return {a: self.np_random.uniform(-1, 1, self.spaces_obs[a].shape).astype(np.float32) for a in self.agents}

    def reset(self, seed=None, options=None):
        if seed is not None or not hasattr(self, "np_random"):
            self.np_random = np.random.default_rng(seed)
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        self.last_actions = dict(actions)
        self.t += 1
        rewards = {"predator_0": float(actions["predator_0"] == 2)}
        for p in ("prey_0", "prey_1"):
            assert self.spaces_act[p].contains(np.asarray(actions[p], np.float32)), actions[p]
            rewards[p] = -float(np.abs(np.asarray(actions[p]) - 0.5).sum())
        done = self.t >= self.length
        obs = self._obs()
        term = {a: False for a in self.agents}
        trunc = {a: done for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, term, trunc, {a: {} for a in obs}


def two_team(**kwargs):
    return TwoTeamEnv(**kwargs)


class StatsEnv(ScriptedEnv):
    """Reports, per finished episode, its number and the sum of agent_0's actions in it
    (``episode_stats``, what a game reports as kills or deaths)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.episodes, self.action_sum = 0, 0

    def reset(self, seed=None, options=None):
        self.action_sum = 0
        return super().reset(seed, options)

    def step(self, actions):
        self.action_sum += int(actions.get("agent_0", 0))
        out = super().step(actions)
        if not self.agents:
            self.episodes += 1
        return out

    def episode_stats(self):
        return {"episode": float(self.episodes), "agent_0_actions": float(self.action_sum)}


def stats(**kwargs):
    return StatsEnv(**kwargs)


class BrokenEnv(ScriptedEnv):
    """Breaks the API from its ``break_at``-th step on (counted across episodes): ``how`` = 'missing_obs' drops agent_1's observation,
    'out_of_space' returns an observation outside the Box, 'nan_reward' returns NaN rewards."""

    def __init__(self, how="missing_obs", break_at=3, **kwargs):
        super().__init__(lifetimes={a: (0, 9) for a in ["agent_0", "agent_1", "agent_2"]}, **kwargs)
        self.how, self.break_at, self.total_steps = how, break_at, 0

    def step(self, actions):
        obs, rewards, term, trunc, infos = super().step(actions)
        self.total_steps += 1
        if self.total_steps >= self.break_at:
            if self.how == "missing_obs":
                obs.pop("agent_1", None)
            elif self.how == "out_of_space":
                obs["agent_2"] = np.full(self.obs_dim, 99.0, np.float32)
            elif self.how == "nan_reward":
                rewards = {a: float("nan") for a in rewards}
        return obs, rewards, term, trunc, infos


def broken(**kwargs):
    return BrokenEnv(**kwargs)


class FailingStateEnv(ScriptedEnv):
    """Has a ``state()`` of 5 values (the step and each agent's presence) that, as sisl multiwalker's
    does when a walker falls, fails at the episode's last step: ``how`` = 'raise' or 'shape' (a
    wrong-sized array)."""

    def __init__(self, how="raise", **kwargs):
        super().__init__(**kwargs)
        self.how = how
        self.state_space = spaces.Box(-10, 10, (5,), np.float32)

    def state(self):
        if self.t >= self.length:
            if self.how == "raise":
                raise AttributeError("'NoneType' object has no attribute 'position'")
            return np.zeros(7, np.float32)
        return np.array([self.t, 1.0, *(a in self.agents for a in self.possible_agents)], np.float32)


def failing_state(**kwargs):
    return FailingStateEnv(**kwargs)


class CrashingEnv(ScriptedEnv):
    """'exit': the process dies at step ``at`` (as a segfaulting game would); 'hang': it sleeps;
    'raise_on_create': the env cannot even be built (as a game whose engine is missing)."""

    def __init__(self, mode="exit", at=3, **kwargs):
        if mode == "raise_on_create":
            raise RuntimeError("no engine here")
        super().__init__(**kwargs)
        self.mode, self.at, self.steps = mode, at, 0

    def step(self, actions):
        self.steps += 1
        if self.steps == self.at:
            if self.mode == "exit":
                os._exit(3)
            time.sleep(3600)
        return super().step(actions)


def crashing(**kwargs):
    return CrashingEnv(**kwargs)


class SlowEnv(ScriptedEnv):
    """Every step takes ``seconds`` (a slow game)."""

    def __init__(self, seconds=0.1, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds

    def step(self, actions):
        time.sleep(self.seconds)
        return super().step(actions)


def slow(**kwargs):
    return SlowEnv(**kwargs)


class ChildProcessEnv(ScriptedEnv):
    """Starts a child process of its own (as a game engine does) and writes its pid to ``pid_file``;
    with ``hang_at`` it stops answering at that step."""

    def __init__(self, pid_file, hang_at=None, **kwargs):
        super().__init__(**kwargs)
        self.hang_at, self.steps = hang_at, 0
        self.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(pid_file, "a") as fh:
            fh.write(f"{self.child.pid}\n")

    def step(self, actions):
        self.steps += 1
        if self.steps == self.hang_at:
            time.sleep(3600)
        return super().step(actions)

    def close(self):
        if self.child.poll() is None:
            self.child.kill()
            self.child.wait()


def child_process(**kwargs):
    return ChildProcessEnv(**kwargs)


def not_parallel(**kwargs):
    """A factory that returns something that is not a ParallelEnv."""
    return {"hello": "world"}


# -- an env of per-agent episodes (registered as env type ``fields``) -------------------------------

from dataclasses import dataclass, field  # noqa: E402

from marlkit.config import EnvConfig  # noqa: E402
from marlkit.envs.core import MultiAgentEnv, Observation  # noqa: E402
from marlkit.registry import register_env  # noqa: E402
from marlkit.spec import EnvSpec, GroupSpec  # noqa: E402


@dataclass
class FieldsConfig(EnvConfig):
    type: str = "fields"
    lengths: list = field(default_factory=lambda: [3, 5, 7])   # each agent's episode length
    length: int = 40                                           # the env's episode (truncated there)


@register_env("fields")
class FieldsEnv(MultiAgentEnv):
    """Agents on fields of their own, as in a Unity scene with several fields: agent i's episode
    ends (terminated) every ``lengths[i]`` of its steps and it starts the next one at once, while the
    env goes on; the env's episode is truncated after ``length`` steps. Reward 1 for action 0 in the
    first step of an episode, else action 1 in later steps, so a policy needs to know where its episode
    began; observations are noise."""

    config_cls = FieldsConfig
    exact_resume = True

    @classmethod
    def from_config(cls, cfg: FieldsConfig, render: bool = False, index: int = 0) -> "FieldsEnv":
        return cls(list(cfg.lengths), cfg.length)

    def __init__(self, lengths, length):
        self.lengths, self.length = np.array(lengths), length
        names = [f"agent_{i}" for i in range(len(lengths))]
        group = GroupSpec("agents", names, spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(3))
        self.spec = EnvSpec({"agents": group}, (4 * len(names),))
        self.rng = np.random.default_rng(0)

    def _observation(self) -> Observation:
        obs = self.rng.uniform(-1, 1, (len(self.lengths), 4)).astype(np.float32)
        n = len(self.lengths)
        return Observation({"agents": obs}, obs.reshape(-1), {"agents": np.ones(n, bool)},
                           {"agents": np.ones((n, 3), bool)})

    def reset(self, seed=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t, self.age = 0, np.zeros(len(self.lengths), int)
        return self._observation()

    def step(self, actions):
        action = actions["agents"]
        reward = np.where(self.age == 0, action == 0, action == 1).astype(np.float32)
        self.t += 1
        self.age += 1
        over = self.t >= self.length
        terminated = (self.age >= self.lengths) & ~over
        truncated = np.full(len(self.lengths), over)
        final = self._observation()
        if over or not terminated.any():
            return final, {"agents": reward}, {"agents": terminated}, {"agents": truncated}, over
        self.age[terminated] = 0
        ob = self._observation()
        ob.final = final
        return ob, {"agents": reward}, {"agents": terminated}, {"agents": truncated}, False


class TrajectoryJob:
    """A job for ``SubprocVectorEnv.install_jobs``: ``run(steps)`` steps the worker's envs with
    actions fixed by the step and env index -> the observations, rewards and finished episodes."""

    def install(self, venv) -> None:
        self.venv = venv

    def run(self, steps: int) -> list:
        out = []
        for t in range(steps):
            actions = (np.arange(self.venv.num_envs)[:, None] + t + np.arange(3)) % 3
            res = self.venv.step({"agents": actions})
            out += [res.next.obs["agents"].copy(), res.reward["agents"].copy()]
            out += [(t, e, info["episode"]) for e, info in enumerate(res.infos) if "episode" in info]
        return out


class SignalEnv(ParallelEnv):
    """Two agents see the same signal ``s`` (one of ``n`` values, one-hot, drawn anew every step) and
    are paid 1 each when both pick action ``s``, else 0: a team that coordinates earns ``length``
    per episode, a random one ``length / n ** 2``. Episodes end by the time limit (truncation)."""

    metadata = {"name": "signal_v0", "render_fps": 5}

    def __init__(self, n=3, length=5):
        self.possible_agents = ["agent_0", "agent_1"]
        self.n, self.length = n, length
        self._obs_space = spaces.Box(0, 1, (n,), np.float32)
        self._act_space = spaces.Discrete(n)

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def _observe(self):
        self.signal = int(self.np_random.integers(self.n))
        return {a: np.eye(self.n, dtype=np.float32)[self.signal] for a in self.agents}

    def reset(self, seed=None, options=None):
        if seed is not None or not hasattr(self, "np_random"):
            self.np_random = np.random.default_rng(seed)
        self.t, self.agents = 0, list(self.possible_agents)
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        acting = list(self.agents)
        paid = float(all(actions[a] == self.signal for a in acting))
        self.t += 1
        done = self.t >= self.length
        obs = self._observe()
        if done:
            self.agents = []
        return (obs, {a: paid for a in acting}, {a: False for a in acting}, {a: done for a in acting},
                {a: {} for a in acting})


def signal(**kwargs):
    return SignalEnv(**kwargs)


class DuelEnv(ParallelEnv):
    """A zero-sum game of two teams of one agent, ``red_0`` and ``blue_0`` (Discrete(2) each): every
    step red is paid ``a_red - a_blue`` and blue the opposite, so both learn to play 1, their returns
    against each other sum to 0 whatever they learn, and each earns up to ``length / 2`` per episode
    against a random opponent. ``stakes`` 0 pays nothing: no reward tells the two apart."""

    metadata = {"name": "duel_v0"}

    def __init__(self, length=6, stakes=1.0):
        self.possible_agents = ["red_0", "blue_0"]
        self.length, self.stakes = length, stakes

    def observation_space(self, agent):
        return spaces.Box(0, 1, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: np.array([self.t / self.length, 1.0], np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        red = self.stakes * float(actions["red_0"] - actions["blue_0"])
        self.t += 1
        done = self.t >= self.length
        obs = {a: np.array([self.t / self.length, 1.0], np.float32) for a in self.agents}
        self.agents = [] if done else self.agents
        return (obs, {"red_0": red, "blue_0": -red}, {a: False for a in obs}, {a: done for a in obs},
                {a: {} for a in obs})


def duel(**kwargs):
    return DuelEnv(**kwargs)
