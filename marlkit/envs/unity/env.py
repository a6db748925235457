"""Unity ML-Agents scenes (a build, or the Editor) as a :class:`MultiAgentEnv`.

Built on ``mlagents_envs.environment.UnityEnvironment`` directly (``get_steps``, ``set_actions``,
behaviour specs). Python is the gRPC server; a build is launched with ``--mlagents-port N``, the
Editor connects when Play is pressed.

- One group per behaviour: ``SoccerTwos?team=0`` -> ``team_0`` (``Name?team=T`` -> ``team_T`` when
  every behaviour shares one name, else ``Name_team_T``; a behaviour without a team -> ``Name``).
- Agent slots: the agent ids present after the first reset, sorted, then new ids in order of
  appearance, up to ``env.max_agents[group]`` slots; an agent keeps its slot for the whole run.
- ``agent_mask`` is True for agents that ask for a decision this step; actions are sent for
  exactly those. ``action_mask`` comes from the behaviour's branch masks (ML-Agents' True =
  forbidden is inverted to marlkit's True = allowed).
- Actions: one branch -> ``Discrete``, several -> ``MultiDiscrete``, continuous -> ``Box(-1, 1)``
  (clipped there), continuous and branches together -> ``Tuple((Box, MultiDiscrete))`` (hybrid,
  one float vector per agent: see :func:`marlkit.spec.hybrid_parts`).
- Observations: an agent's sensors, flattened and concatenated: image sensors (3-D) first, then
  the others, each kind in the behaviour's order; the group spec lists the sensors' shapes
  (``obs_parts``), so that the ``mixed`` model takes the images apart for its ``cnn``. A behaviour
  with a single image sensor keeps its shape (for the ``cnn`` model). Images are ``[C, H, W]``,
  as mlagents-envs decodes them (camera PNGs and uncompressed sensors alike), and declared so.
- Rewards: the agent's reward plus ``group_reward_weight`` times its group reward.
- Group ids (``group_ids``): ML-Agents' group ids tell apart the copies of one game in a scene (the
  fields of SoccerTwos: each field's team is a group). The group spec lists each slot's group id at
  the first reset (``GroupSpec.subteams``), so that a centralised critic reads the agents of the
  same group id alone (one per field, weights shared across the behaviour); agents of group id 0
  keep reading the whole behaviour. The ids must stay as they were at the first reset.
- Per-agent episodes: an agent in the terminal steps ends its own episode (``terminated``, or
  ``truncated`` when ML-Agents says it was interrupted at its max step) and carries its final
  observation in ``Observation.final``; when the same agent is also in the decision steps of the
  same call it goes on at once in its new episode (the terminal reward is kept; the decision
  step's reward, earned before the new episode's first action, belongs to no action, as in
  ML-Agents' own trainer). The scene itself never ends: fields restart on their own.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import socket
import traceback
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from gymnasium import spaces

from marlkit.config import ConfigError, EnvConfig, value_range
from marlkit.envs import ports
from marlkit.envs.core import EnvAPIError, EnvSpec, EnvWorkerError, GroupSpec, MultiAgentEnv, Observation
from marlkit.registry import register_env

log = logging.getLogger("marlkit.unity")

ENGINE_SETTINGS = ("width", "height", "quality_level", "time_scale", "target_frame_rate", "capture_frame_rate")
INTEGER_SETTINGS = ("width", "height", "quality_level", "target_frame_rate", "capture_frame_rate")
STOP_GRACE = 5.0      # seconds a failed scene gets to quit on its own before its processes are killed
WORKER_SLACK = 30.0   # seconds an env worker's command may take beyond its scene's longest call


@dataclass
class UnityConfig(EnvConfig):
    type: str = "unity"
    file_name: Optional[str] = None              # a build; None waits for the Editor's Play button
    no_graphics: bool = True
    time_scale: float = 20.0                     # engine settings through the engine side channel
    engine: dict[str, float] = field(default_factory=dict)   # width, height, quality_level, target_frame_rate, ...
    parameters: dict[str, float] = field(default_factory=dict)  # environment parameters side channel
    base_port: Optional[int] = None              # None: a free port per env; else base_port + worker_id + env index
    worker_id: int = 0
    timeout_wait: int = 60                       # seconds to wait for the scene to connect / answer
    additional_args: list[str] = field(default_factory=list)   # launch arguments for the build
    seed: int = 0
    group_reward_weight: float = 1.0
    group_ids: bool = True                       # one centralised critic per ML-Agents group id (field)
    flatten_actions: bool = False                # MultiDiscrete -> one Discrete with the joint action mask
    max_agents: dict[str, int] = field(default_factory=dict)   # slots per group for agents that appear later
    restart_on_failure: bool = True              # relaunch a scene that exits or stops answering (counted, logged)
    max_failures: int = field(default=3, metadata=value_range(1))   # scene failures in a row that stop the run


class UnityEnvError(EnvWorkerError):
    """The scene did not connect, stopped answering or exited; its process is gone when this is raised.

    A scene is the env's worker process: its failure is reported as an env worker's is, in one line,
    with the stack where it was raised in ``worker_traceback`` (which a failed run keeps in its
    ``error.log``), also when the scene is stepped in this process."""

    def __init__(self, message: str, worker_traceback: str | None = None):
        if worker_traceback is None:
            stack = traceback.format_stack()[:-1]
            worker_traceback = "".join(["Traceback (most recent call last):\n", *stack,
                                        f"{type(self).__name__}: {message}\n"])
        super().__init__(message, worker_traceback)


def _import_mlagents():
    try:
        from mlagents_envs import environment
    except ImportError as exc:
        raise ImportError("the unity env needs mlagents-envs 1.1.0; `make install` installs it on Python 3.11 "
                          f"(see the Makefile's install recipe) ({exc})") from None
    except TypeError as exc:  # "Descriptors cannot be created directly": protobuf modules not regenerated
        raise ImportError("mlagents-envs' protobuf modules predate the installed protobuf; run "
                          f"`python -m marlkit.envs.unity.protos` once (`make install` does) ({exc})") from None
    return environment


def engine_config(cfg: UnityConfig) -> dict:
    """The engine settings to send, checked: known names, whole numbers where the engine takes
    integers, width and height together."""
    unknown = [k for k in cfg.engine if k not in ENGINE_SETTINGS]
    if unknown:
        raise ConfigError(f"env.engine.{unknown[0]}: unknown engine setting; valid: {', '.join(ENGINE_SETTINGS)}")
    settings = {"time_scale": float(cfg.time_scale), **cfg.engine}
    for key in INTEGER_SETTINGS:
        if key in settings:
            if float(settings[key]) != int(settings[key]):
                raise ConfigError(f"env.engine.{key}={settings[key]}: must be a whole number")
            settings[key] = int(settings[key])
    if ("width" in settings) != ("height" in settings):
        raise ConfigError("env.engine: set width and height together (the screen resolution)")
    return settings


def longest_call(cfg: UnityConfig) -> float:
    """The longest one reset or step of a scene takes before it returns or raises: an exchange that
    times out and the stop of that scene, then the relaunches ``max_failures`` allows, each a
    handshake and a reset that may time out, and a stop."""
    first = cfg.timeout_wait + STOP_GRACE
    return first + (cfg.max_failures - 1) * (2 * cfg.timeout_wait + STOP_GRACE) if cfg.restart_on_failure else first


def worker_timeout(cfg: UnityConfig) -> float:
    """The shortest ``runner.worker_timeout`` that lets the scene's own timeout and relaunches come
    first: :func:`longest_call`, and time for the worker's other work in that command (its other
    envs' steps, acting on its envs)."""
    return longest_call(cfg) + WORKER_SLACK


def free_port() -> int:
    """A TCP port for the gRPC server on localhost (see ``marlkit.envs.ports``)."""
    return ports.free_port(socket.SOCK_STREAM, "localhost")


def scene_teams(names: dict[str, str]) -> dict[str, list[str]] | None:
    """The teams a scene declares (behaviour name -> group name, ``group_names``): the groups of
    behaviours with ``?team=T`` play in team ``team_T``; a behaviour without a team is a team of
    its own. None where no behaviour has a team."""
    teams: dict[str, list[str]] = {}
    for b, g in names.items():
        team = re.search(r"(?:^|&|\?)team=(\d+)", b.partition("?")[2])
        teams.setdefault(f"team_{team.group(1)}" if team else g, []).append(g)
    return teams if any(re.search(r"(?:^|&|\?)team=\d+", b.partition("?")[2]) for b in names) else None


def group_names(behaviours: list[str]) -> dict[str, str]:
    """Behaviour name -> group name (``SoccerTwos?team=0`` -> ``team_0``)."""
    parsed = {}
    for b in behaviours:
        name, _, query = b.partition("?")
        team = re.search(r"(?:^|&|\?)team=(\d+)", query)
        parsed[b] = (re.sub(r"\W+", "_", name).strip("_") or "behaviour", team.group(1) if team else None)
    one_name = len({name for name, _ in parsed.values()}) == 1
    out = {b: (f"team_{team}" if one_name else f"{name}_team_{team}") if team is not None else name
           for b, (name, team) in parsed.items()}
    if len(set(out.values())) != len(out):
        raise EnvAPIError(f"behaviours {sorted(behaviours)} map to clashing group names {sorted(out.values())}")
    return out


class _Behaviour:
    """One behaviour: its group, agent slots, spaces and the ids that asked for a decision."""

    def __init__(self, name: str, group: str, spec, agent_ids: np.ndarray, capacity: int):
        self.name, self.group, self.spec = name, group, spec
        self.capacity = capacity
        self.slot: dict[int, int] = {}
        self._slots_of: dict[bytes, tuple] = {}
        self.rebind(agent_ids)
        shapes = [tuple(int(n) for n in o.shape) for o in spec.observation_specs]
        self.order = sorted(range(len(shapes)), key=lambda i: len(shapes[i]) != 3)   # images first
        self.obs_shape = shapes[0] if len(shapes) == 1 and len(shapes[0]) == 3 \
            else (int(sum(np.prod(s) for s in shapes)),)
        # the sensors of a flat observation, in its order; images are [C, H, W] as mlagents gives them
        self.obs_parts = tuple(shapes[i] for i in self.order) if len(shapes) > 1 else None
        self.has_images = any(len(shape) == 3 for shape in shapes)
        action = spec.action_spec
        self.n_continuous, self.branches = action.continuous_size, tuple(int(b) for b in action.discrete_branches)
        if self.n_continuous and self.branches:
            self.action_space = spaces.Tuple((spaces.Box(-1.0, 1.0, (self.n_continuous,), np.float32),
                                              spaces.MultiDiscrete(list(self.branches))))
        elif self.branches:
            self.action_space = spaces.Discrete(self.branches[0]) if len(self.branches) == 1 \
                else spaces.MultiDiscrete(list(self.branches))
        else:
            self.action_space = spaces.Box(-1.0, 1.0, (self.n_continuous,), np.float32)
        self.deciding = np.zeros(0, np.int64)   # slots of the agents whose action the scene awaits
        self.deciding_index: np.ndarray | slice = self.deciding
        self.group_ids: np.ndarray | None = None   # [A]: each slot's group id at the first reset (env.group_ids)

    def rebind(self, agent_ids: np.ndarray) -> None:
        """Slots for the agents present at a (re)launch: in the order of their ids."""
        ids = sorted(int(i) for i in agent_ids)
        if self.capacity < len(ids):
            raise ConfigError(f"env.max_agents.{self.group}={self.capacity} is smaller than the {len(ids)} agents "
                              f"of behaviour {self.name!r} at reset")
        self.slot = {i: s for s, i in enumerate(ids)}
        self._slots_of.clear()

    def slots(self, agent_ids: np.ndarray) -> np.ndarray:
        """Slots of ``agent_ids``, giving new ids the next free slots; the answer for an id list
        is kept, since scenes ask for the same agents step after step."""
        return self.indexed(agent_ids)[0]

    def indexed(self, agent_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray | slice]:
        """(slots, an index into ``[A, ...]`` arrays): ``slice(None)`` when the ids fill every
        slot in order (the usual step), which numpy copies far faster than a scatter."""
        key = agent_ids.tobytes()
        out = self._slots_of.get(key)
        if out is None:
            if len(self._slots_of) >= 4096:
                self._slots_of.clear()
            slots = self._assign(agent_ids)
            every = len(slots) == self.capacity and bool((slots == np.arange(self.capacity)).all())
            out = self._slots_of[key] = (slots, slice(None) if every else slots)
        return out

    def _assign(self, agent_ids: np.ndarray) -> np.ndarray:
        out = np.empty(len(agent_ids), np.int64)
        for k, agent_id in enumerate(agent_ids.tolist()):
            slot = self.slot.get(agent_id)
            if slot is None:
                if len(self.slot) >= self.capacity:
                    raise EnvAPIError(
                        f"behaviour {self.name!r}: agent id {agent_id} appeared but all {self.capacity} slots of "
                        f"group {self.group!r} are taken; raise env.max_agents.{self.group}")
                slot = self.slot[agent_id] = len(self.slot)
            out[k] = slot
        return out

    def read_group_ids(self, decision, terminal) -> np.ndarray:
        """``[A]``: the group id of each slot's agent in the steps of a reset (0: no group, or no
        agent in the slot yet)."""
        out = np.zeros(self.capacity, np.int64)
        for steps in (terminal, decision):
            if len(steps):
                out[self.slots(steps.agent_id)] = steps.group_id
        return out

    def check_group_ids(self, decision) -> None:
        """The deciding agents' group ids are those of the first reset, which the critics were
        built on; one that differs is an error naming the agent."""
        was = self.group_ids[self.deciding_index]
        changed = np.flatnonzero(decision.group_id != was)
        if len(changed):
            k = changed[0]
            raise EnvAPIError(
                f"behaviour {self.name!r}: agent id {decision.agent_id[k]} has group id {decision.group_id[k]}, but "
                f"{was[k]} at the first reset (0: no group, or not there yet); each group id gets its own "
                "centralised critic from the group ids of the first reset, so they must not change; set "
                "env.group_ids=false to ignore group ids (one critic reads the whole behaviour)")

    def agent_obs(self, obs_list: list[np.ndarray]) -> np.ndarray:
        """ML-Agents' per-sensor ``[n, *sensor_shape]`` arrays -> ``[n, *obs_shape]``."""
        n = len(obs_list[0])
        if len(obs_list) == 1:
            return obs_list[0].reshape((n,) + self.obs_shape)
        return np.concatenate([obs_list[i].reshape(n, -1) for i in self.order], axis=1)

    def agent_names(self) -> list[str]:
        by_slot = {s: i for i, s in self.slot.items()}
        return [f"{self.name}?agent_id={by_slot[s]}" if s in by_slot else f"{self.name}?slot={s}"
                for s in range(self.capacity)]


@register_env("unity")
class UnityEnv(MultiAgentEnv):
    config_cls = UnityConfig

    @classmethod
    def from_config(cls, cfg: UnityConfig, render: bool = False, index: int = 0) -> MultiAgentEnv:
        env = cls(cfg, index)
        if cfg.flatten_actions:
            from marlkit.envs.wrappers import FlattenMultiDiscrete
            env = FlattenMultiDiscrete(env)
        return env

    @classmethod
    def probe_spec(cls, cfg: UnityConfig) -> EnvSpec:
        """The scene's spec from its behaviour specs: one scene launched, read and closed."""
        from marlkit.envs.factory import make_env
        with make_env(cfg) as env:
            return env.spec

    @classmethod
    def check_config(cls, cfg) -> None:
        cls._order_timeouts(cfg)
        if cfg.env.file_name is not None:
            # on a Ray cluster the build is opened on the nodes that host the envs, which may be all
            # the machines that have it; evaluation (--benchmark) and --test play on this one
            if not (cfg.runner.vectorize == "ray" and cfg.mode == "train"):
                cls._check_build(cfg.env.file_name)
            return
        # the Editor is one scene on one port: one env, and no second one to evaluate on
        if cfg.mode == "benchmark":
            raise ConfigError("env.file_name is null, so the env is the Unity Editor, which is one scene; "
                              "--benchmark needs a second one for its evaluation episodes: point "
                              "env.file_name at a build, or train without --benchmark")
        rc = cfg.runner
        key, used = ("runner.parallels", rc.parallels) if cfg.mode != "test" else \
            ("runner.eval_parallels", rc.test_envs(cfg.render))
        if used > 1:
            raise ConfigError(f"env.file_name is null, so the env is the Unity Editor, which is one scene, but "
                              f"{key} is {used}: set {key}=1, or point env.file_name at a build")

    @staticmethod
    def _order_timeouts(cfg) -> None:
        """An env worker waits ``runner.worker_timeout`` seconds for a step before it gives the run
        up, so it must wait out the scene's own timeout and relaunches (:func:`longest_call`): null
        (the packaged YAML's) is derived from them, and a shorter setting is refused."""
        rc, needed = cfg.runner, worker_timeout(cfg.env)
        if rc.worker_timeout is None:
            rc.worker_timeout = needed
        elif rc.worker_timeout < needed and rc.envs_in_workers() and cfg.mode != "test":
            env = cfg.env
            settings, parts = f"env.timeout_wait={env.timeout_wait}", "its stop"
            if env.restart_on_failure:
                settings += f" and env.max_failures={env.max_failures}"
                parts = f"its stop and {env.max_failures - 1} relaunches"
            raise ConfigError(
                f"runner.worker_timeout={rc.worker_timeout:g} is less than the {needed:g} s an env worker may need "
                f"for one step of a Unity scene with {settings} (the scene's timeout, {parts}, plus "
                f"{WORKER_SLACK:g} s for the worker's other work), so the worker would be given up first; set "
                f"runner.worker_timeout to null (derived) or at least {needed:g}, or lower env.timeout_wait")

    @staticmethod
    def _check_build(file_name: str) -> None:
        """A build that is not there, not executable, or not a program at all is a configuration
        error found before any launch."""
        _import_mlagents()
        from marlkit.envs.unity.player import launch_path
        launch_path(file_name)

    def __init__(self, cfg: UnityConfig, index: int = 0):
        _import_mlagents()
        from mlagents_envs.side_channel.engine_configuration_channel import EngineConfigurationChannel
        from mlagents_envs.side_channel.environment_parameters_channel import EnvironmentParametersChannel

        engine_settings = engine_config(cfg)
        if cfg.file_name is None and index > 0:
            raise ConfigError("env.file_name is empty, so the env is the Unity Editor, which is one env: "
                              "set runner.parallels=1 (and eval_parallels=1), or point env.file_name at a build")
        self.cfg, self.index = cfg, index
        engine = EngineConfigurationChannel()
        engine.set_configuration_parameters(**engine_settings)
        parameters = EnvironmentParametersChannel()
        for key, value in cfg.parameters.items():
            parameters.set_float_parameter(key, float(value))
        self._side_channels = [engine, parameters]
        self._env = None
        self.restarts = 0          # scenes relaunched after a failure, over the env's life
        self._failures = 0         # failures since the last exchange that went through
        self._last: Observation | None = None   # what the agents saw last: the final obs of a cut episode
        self._connect()
        try:
            self._call(self._env.reset, "resetting")
            self._build_spec()
        except BaseException:
            self.close()
            raise

    def _connect(self) -> None:
        """Launch the build (or wait for the Editor) and complete ML-Agents' handshake."""
        from marlkit.envs.unity.player import Player
        from mlagents_envs.exception import UnityEnvironmentException, UnityTimeOutException, UnityWorkerInUseException
        cfg, index = self.cfg, self.index
        for attempt in range(5):
            if cfg.base_port is None:
                port = free_port() if cfg.file_name is not None else None
            else:
                port = cfg.base_port + cfg.worker_id + index
            try:
                self._env = Player(cfg.file_name, port, seed=cfg.seed + index, no_graphics=cfg.no_graphics,
                                   timeout_wait=cfg.timeout_wait, additional_args=list(cfg.additional_args),
                                   side_channels=self._side_channels)
                break
            except UnityWorkerInUseException:
                if cfg.base_port is not None:
                    raise ConfigError(
                        f"unity env {index}: port {port} (env.base_port={cfg.base_port} + env.worker_id="
                        f"{cfg.worker_id} + env index {index}) is in use, by another run or program; leave "
                        "env.base_port null for free ports, or pick another env.worker_id") from None
                if cfg.file_name is None:
                    raise ConfigError(f"unity env {index}: port {port or 5004}, where the Unity Editor connects, "
                                      "is in use, by another run or program; stop that one first") from None
                if attempt == 4:
                    raise UnityEnvError(f"unity env {index}: every free port drawn was taken by another program "
                                        "before its server could bind it, 5 times; start the run again") from None
            except UnityTimeOutException:  # the player's process group is gone
                where = f"build {cfg.file_name!r}" if cfg.file_name else "the Unity Editor (press Play)"
                raise UnityEnvError(f"unity env {index}: {where} did not connect to port {port or 5004} "
                                    f"within env.timeout_wait={cfg.timeout_wait} s") from None
            except UnityEnvironmentException as exc:  # no such file, or the process exited before connecting
                raise UnityEnvError(f"unity env {index}: env.file_name={cfg.file_name!r} could not be started "
                                    f"or exited before connecting: {exc}") from None
        self.port = self._env._port

    def _call(self, fn, what: str):
        """Run one exchange with the scene; a scene that stops answering or exits becomes a
        :class:`UnityEnvError` (after its process is stopped)."""
        from mlagents_envs.exception import UnityCommunicatorStoppedException, UnityEnvironmentException, \
            UnityTimeOutException
        try:
            return fn()
        except UnityTimeOutException:
            problem = f"did not answer within env.timeout_wait={self.cfg.timeout_wait} s"
        except (UnityEnvironmentException, UnityCommunicatorStoppedException) as exc:
            problem = f"is gone ({exc})"
        self.close()
        raise UnityEnvError(f"unity env {self.index} (port {self.port}, file_name {self.cfg.file_name!r}) "
                            f"{problem} while {what}")

    # ------------------------------------------------------------------ spec

    def _build_spec(self) -> None:
        specs = self._env.behavior_specs
        names = group_names(sorted(specs))
        unknown = [g for g in self.cfg.max_agents if g not in names.values()]
        if unknown:
            raise ConfigError(f"env.max_agents.{unknown[0]}: no such group; this scene's groups are "
                              f"{', '.join(names.values())}")
        self.behaviours: list[_Behaviour] = []
        for b in sorted(specs):
            decision, terminal = self._env.get_steps(b)
            present = np.union1d(decision.agent_id, terminal.agent_id)
            g = names[b]
            beh = _Behaviour(b, g, specs[b], present, self.cfg.max_agents.get(g, len(present)))
            if self.cfg.group_ids:
                beh.group_ids = beh.read_group_ids(decision, terminal)
            self.behaviours.append(beh)
        groups = {}
        for beh in self.behaviours:
            space = spaces.Box(-np.inf, np.inf, beh.obs_shape, np.float32)
            subteams = tuple(beh.group_ids.tolist()) if beh.group_ids is not None and beh.group_ids.any() else None
            groups[beh.group] = GroupSpec(beh.group, beh.agent_names(), space, beh.action_space,
                                          channels_last=False if beh.has_images else None, obs_parts=beh.obs_parts,
                                          subteams=subteams)
        state_dim = sum(beh.capacity * int(np.prod(beh.obs_shape)) for beh in self.behaviours)
        self.spec = EnvSpec(groups, (state_dim,), state_from_obs=True, teams=scene_teams(names))
        self._first = self._last = self._observe()[0]

    # ------------------------------------------------------------------ contract

    def reset(self, seed: int | None = None) -> Observation:
        """The scene restarts its episodes on its own; the first call hands over the observation
        of the reset done at connection, later calls reset the scene."""
        if self._first is None and self._exchange(self._env.reset, "resetting"):
            self._last = self._observe()[0]
            return self._last
        first, self._first = self._first, None
        return first

    def step(self, actions: dict[str, np.ndarray]):
        from mlagents_envs.base_env import ActionTuple
        self._first = None
        for beh in self.behaviours:
            if not len(beh.deciding):
                continue
            chosen = np.asarray(actions[beh.group])[beh.deciding_index].reshape(len(beh.deciding), -1)
            n = beh.n_continuous
            # continuous actions clipped to the declared [-1, 1], as ML-Agents' trainer does
            continuous = np.clip(chosen[:, :n], -1.0, 1.0).astype(np.float32) if n else None
            discrete = None
            if beh.branches:
                discrete = chosen[:, n:] if chosen.dtype.kind in "iu" else np.rint(chosen[:, n:])
                discrete = discrete.astype(np.int32)
            self._env.set_actions(beh.name, ActionTuple(continuous=continuous, discrete=discrete))
        if not self._exchange(self._env.step, "stepping"):
            return self._cut()
        ob, reward, terminated, truncated = self._observe()
        self._last = ob
        return ob, reward, terminated, truncated, False

    def episode_stats(self) -> dict[str, float]:
        """Asked when the env's episode ends, which in a scene happens only when it is relaunched."""
        return {"restarts": float(self.restarts)}

    # ------------------------------------------------------------------ failures

    def _exchange(self, fn, what: str) -> bool:
        """One exchange; False when the scene failed and was relaunched instead (``restart_on_failure``)."""
        try:
            self._call(fn, what)
        except UnityEnvError as exc:
            if not self.cfg.restart_on_failure:
                raise
            self._relaunch(exc)
            return False
        self._failures = 0
        return True

    def _relaunch(self, exc: UnityEnvError) -> None:
        """Launch the scene again until it answers, ``max_failures`` failures in a row at most."""
        self._cut_slots = {beh.group: np.fromiter(beh.slot.values(), np.int64) for beh in self.behaviours}
        while True:
            self._failures += 1
            if self._failures >= self.cfg.max_failures:
                raise UnityEnvError(f"{exc}; that is {self._failures} failures in a row (env.max_failures="
                                    f"{self.cfg.max_failures}), so the scene is not relaunched again") from None
            self.restarts += 1
            log.warning("%s; relaunching the scene (restart %d of this env)", exc, self.restarts)
            try:
                self._connect()
                self._call(self._env.reset, "resetting")
            except UnityEnvError as again:
                exc = again
                continue
            self._rebind()
            return

    def _rebind(self) -> None:
        """Agent slots from the relaunched scene, whose behaviours must be the first launch's."""
        specs = self._env.behavior_specs
        if sorted(specs) != [beh.name for beh in self.behaviours] or \
                any(specs[beh.name] != beh.spec for beh in self.behaviours):
            self.close()
            raise EnvAPIError(f"unity env {self.index}: the relaunched scene has other behaviours or spaces "
                              f"({sorted(specs)}) than at the start ({[beh.name for beh in self.behaviours]})")
        for beh in self.behaviours:
            decision, terminal = self._env.get_steps(beh.name)
            beh.rebind(np.union1d(decision.agent_id, terminal.agent_id))
            if beh.group_ids is not None and (beh.read_group_ids(decision, terminal) != beh.group_ids).any():
                self.close()
                raise EnvAPIError(f"unity env {self.index}: the relaunched scene gives the agents of behaviour "
                                  f"{beh.name!r} other group ids than at the start, which the critics were built on")
        self._first = self._observe()[0]

    def _cut(self):
        """The step that met a relaunch: every agent's episode ends truncated on what it saw last,
        and the env's episode ends, so that the next reset hands over the new scene's first
        observation."""
        last = self._last
        cut = dataclasses.replace(last, final=dataclasses.replace(last, final=None))
        reward = {g: np.zeros_like(m, np.float32) for g, m in last.agent_mask.items()}
        terminated = {g: np.zeros_like(m) for g, m in last.agent_mask.items()}
        truncated = {g: np.zeros_like(m) for g, m in last.agent_mask.items()}
        for g, slots in self._cut_slots.items():
            truncated[g][slots] = True
        return cut, reward, terminated, truncated, True

    def _observe(self):
        w = self.cfg.group_reward_weight
        obs, agent_mask, action_mask, reward, terminated, truncated, final = {}, {}, {}, {}, {}, {}, {}
        ended_any = False
        for beh in self.behaviours:
            g, A = beh.group, beh.capacity
            decision, terminal = self._env.get_steps(beh.name)
            ds, di = beh.indexed(decision.agent_id)
            o = np.zeros((A,) + beh.obs_shape, np.float32)
            m = np.zeros(A, bool)
            r = np.zeros(A, np.float32)
            am = np.ones((A, sum(beh.branches)), bool)
            if len(ds):
                o[di] = beh.agent_obs(decision.obs)
                m[di] = True
                r[di] = decision.reward + w * decision.group_reward if w else decision.reward
                if decision.action_mask is not None and beh.branches:
                    am[di] = ~np.concatenate(decision.action_mask, axis=1)
            beh.deciding, beh.deciding_index = ds, di
            if beh.group_ids is not None and len(ds):
                beh.check_group_ids(decision)
            term, trunc = np.zeros(A, bool), np.zeros(A, bool)
            f = None
            if len(terminal):
                ts = beh.slots(terminal.agent_id)
                # overwrites the reward of an agent that also decides (it restarted in this call):
                # that decision's reward predates its new episode's first action
                r[ts] = terminal.reward + w * terminal.group_reward if w else terminal.reward
                trunc[ts] = terminal.interrupted
                term[ts] = ~terminal.interrupted
                f = o.copy()
                f[ts] = beh.agent_obs(terminal.obs)
                ended_any = True
            obs[g], agent_mask[g], action_mask[g], reward[g] = o, m, am, r
            terminated[g], truncated[g], final[g] = term, trunc, f
        state = np.concatenate([obs[beh.group].reshape(-1) for beh in self.behaviours])
        ob = Observation(obs, state, agent_mask, action_mask)
        if ended_any:
            final_obs = {g: f if f is not None else obs[g] for g, f in final.items()}
            ob.final = Observation(final_obs, np.concatenate([final_obs[b.group].reshape(-1) for b in self.behaviours]),
                                   agent_mask, action_mask)
        return ob, reward, terminated, truncated

    def close(self) -> None:
        env, self._env = getattr(self, "_env", None), None
        if env is not None:
            # ML-Agents' own shutdown (status 400 to the scene), with a short grace before the kill
            # rather than timeout_wait: a scene that stopped answering is not waited for twice
            env._close(timeout=STOP_GRACE)

    def __del__(self):
        self.close()
