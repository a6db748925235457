"""Typed run configuration, YAML merging and validation.

Precedence, lowest first: dataclass defaults < ``marlkit/configs/<env>.yaml`` < ``--config FILE``
< ``--set key=value``. Everything is validated before any env starts: an unknown key names the
closest valid one, a wrong type or range names the key, the value and what is allowed.
"""
from __future__ import annotations

import copy
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml

from marlkit.errors import ConfigError
from marlkit.registry import closest, get_agent, get_env_type

CONFIG_DIR = Path(__file__).parent / "configs"
WORKER_TIMEOUT = 60.0   # runner.worker_timeout, unless the env type derives another
UPDATE_BOUND_THREADS = 2   # runner.update_threads of a run that learns with convolutions, unless set


def value_range(lo=None, hi=None, **extra) -> dict:
    """A config field's metadata: the smallest and largest values it takes (None: no bound),
    which every layer of a run's config is checked against."""
    return {"min": lo, "max": hi, **extra}


@dataclass
class ModelConfig:
    """A network picked from the model registry (``mlp``, ``gru``, ``cnn`` or a user one)."""

    name: str = "mlp"
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    activation: Literal["relu", "tanh", "gelu", "elu"] = "relu"
    layer_norm: bool = True
    rnn_hidden: int = field(default=64, metadata=value_range(1))
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class EnvConfig:
    """Settings every env type understands; each env type extends it with its own fields."""

    type: str = "pettingzoo"
    groups: Optional[dict[str, list[str]]] = None
    # team name -> its groups: the groups that share a reward, scored, evaluated and mixed as one
    # (groups left out are teams of their own); null: what the env type declares, else the groups
    # whose rewards were equal at every step of the random policy's first steps
    teams: Optional[dict[str, list[str]]] = None
    max_episode_steps: Optional[int] = field(default=None, metadata=value_range(1))
    render_mode: Optional[str] = None
    # observation wrappers for image envs (marlkit/envs/wrappers.py): [H, W], and K frames per obs
    resize: Optional[list[int]] = None
    # without resize, images with a side over this many pixels are shrunk by averaging whole blocks
    # until no side is; null keeps them as they are
    max_image_side: Optional[int] = field(default=64, metadata=value_range(1))
    frame_stack: int = field(default=1, metadata=value_range(1))
    # True only for envs whose whole state pickles (proven by a test that continues a trajectory
    # after a save/load and compares it with the uninterrupted one). Envs whose state lives outside
    # Python (a C engine, a game process) would come back desynchronised, so they resume with
    # fresh episodes instead.
    exact_resume: bool = False


@dataclass
class RunnerConfig:
    parallels: int = field(default=16, metadata=value_range(1))
    # auto: worker processes from two envs on (collection then overlaps the update on another core),
    # in process for one; measured faster than sync for user YAMLs of MLPs and CNNs (docs/benchmarks.md)
    vectorize: Literal["sync", "subprocess", "auto", "ray"] = "auto"
    workers: Optional[int] = field(default=None, metadata=value_range(1))   # ray: actors (null: the cluster's room)
    # ray: null joins RAY_ADDRESS if set, else starts a Ray of this run; 'auto' or host:port joins a cluster
    ray_address: Optional[str] = None
    ray_cpus_per_worker: float = field(default=1.0, metadata=value_range(0.01))
    ray_max_restarts: int = field(default=3, metadata=value_range(0))   # lost actors replaced per run
    # auto: fork on Linux where this process has no other thread (workers start at once, torch
    # already imported), else spawn
    start_method: Literal["auto", "spawn", "forkserver", "fork"] = "auto"
    # seconds an env worker may take for one command; null: what the env type derives (Unity: from
    # env.timeout_wait and env.max_failures, so that a scene is relaunched before its worker is given up)
    worker_timeout: Optional[float] = field(default=WORKER_TIMEOUT, metadata=value_range(0.1))
    worker_start_timeout: float = field(default=120.0, metadata=value_range(0.1))
    horizon: int = field(default=25, metadata=value_range(1))
    total_steps: int = field(default=500_000, metadata=value_range(1))
    eval_interval: int = field(default=50_000, metadata=value_range(1))
    eval_episodes: int = field(default=32, metadata=value_range(1))
    eval_parallels: int = field(default=8, metadata=value_range(1))
    eval_deterministic: bool = False
    test_episodes: int = field(default=10, metadata=value_range(1))
    episode_step_limit: int = field(default=100_000, metadata=value_range(1))
    save_interval: int = field(default=50_000, metadata=value_range(1))
    log_interval: int = field(default=5_000, metadata=value_range(1))
    torch_threads: Optional[int] = field(default=1, metadata=value_range(1))
    # torch threads of the update (null: torch_threads); acting keeps torch_threads. 2 pays where the
    # update bounds the run, most with nothing collected beside it (overlap: false), docs/benchmarks.md
    update_threads: Optional[int] = field(default=None, metadata=value_range(1))
    run_root: str = "runs"
    progress: bool = True
    video_fps: Optional[int] = field(default=None, metadata=value_range(1))
    # Which evaluation return picks best.pt: a team's (env.teams) or a group's name (its team's
    # return), or None for the mean over the learning teams, each against the random policy playing
    # the other teams where several learn
    best_metric: Optional[str] = None

    # collect the next rollout while the update runs (policy lag 1); null: on where the envs step
    # in worker processes (vectorize subprocess or ray, or auto with two envs or more). With the envs
    # in this process nothing runs beside the update (they would take turns for the interpreter
    # lock): the next rollout is collected after it, with the same weights, so the run learns the
    # same bits as with one env worker, on one core and without the worker's copies
    overlap: Optional[bool] = None
    # the env worker processes act on their own envs, on the CPU, and send whole rollouts (no round
    # trip per step; the same draws and actions); null: on where they are processes of this machine
    # (vectorize subprocess, or auto with two envs or more), whatever device the update runs on
    act_in_workers: Optional[bool] = None
    # envs per acting pass: null acts on all the envs of the runner (or of a worker) in one pass,
    # the fastest; a number k acts on blocks of k consecutive envs (env k * i onwards), and env
    # workers hold whole blocks, so that every env is acted on in the same batch wherever acting
    # runs: the same bits whatever runner.workers, act_in_workers or vectorize are, on any CPU
    # (torch's matrix kernels round a batch of another size differently, docs/envs.md)
    act_batch: Optional[int] = field(default=None, metadata=value_range(1))
    # double-buffered collection: the envs in two parts of whole env workers that take turns, one
    # stepping while the policies act (here) on the other, so that acting leaves the envs' critical
    # path; for acting with a processor of its own (a GPU; on 2 CPU cores doom_coop gained nothing,
    # docs/benchmarks.md). Needs env worker processes and two workers or more; the workers then do
    # not act (act_in_workers null)
    double_buffer: bool = False

    def settle_update_bound(self) -> None:
        """Resolve, for a run that learns with convolutions (``Encoder.update_bound``), what its
        config leaves null: ``overlap`` off and ``update_threads`` 2. Each rollout is then collected
        on both cores and updated on both, faster than a one-thread update beside collection where
        convolutions bound the update (docs/benchmarks.md, "The update on both cores"). From the
        config alone, never from timing: the count decides the update's bits."""
        if self.overlap is None:
            self.overlap = False
        if self.update_threads is None and not self.overlap and self.torch_threads == 1:
            self.update_threads = UPDATE_BOUND_THREADS

    def envs_in_workers(self) -> bool:
        """Whether the training envs step outside this process."""
        return self.vectorize in ("subprocess", "ray") or (self.vectorize == "auto" and self.parallels > 1)

    def overlapped(self) -> bool:
        """Whether collection overlaps the update (``overlap``, null resolved)."""
        return self.envs_in_workers() if self.overlap is None else self.overlap

    def envs_in_processes(self) -> bool:
        """Whether the training envs step in worker processes of this machine."""
        return self.envs_in_workers() and self.vectorize != "ray"

    def acts_in_workers(self) -> bool:
        """Whether the env workers act on their own envs (``act_in_workers``, null resolved); they act
        on the CPU whatever device the update runs on."""
        if self.act_in_workers is None:
            return self.envs_in_processes() and not self.double_buffer
        return self.act_in_workers

    def check(self) -> None:
        """Refuse runner settings that contradict each other."""
        if self.double_buffer and not (self.envs_in_processes() and self.parallels > 1 and self.workers != 1):
            raise ConfigError(
                f"runner.double_buffer: true steps two parts of the envs in env worker processes by turns, but "
                f"runner.vectorize: {self.vectorize} with runner.parallels: {self.parallels}"
                + (f" and runner.workers: {self.workers}" if self.workers is not None else "")
                + (" steps them in Ray actors, whose steps this process does not split" if self.vectorize == "ray"
                   else " has " + ("one env worker" if self.envs_in_processes() else "none"))
                + "; set runner.vectorize: subprocess with runner.parallels and runner.workers 2 or more, "
                  "or runner.double_buffer: false")
        if self.double_buffer and self.act_batch is not None and self.act_batch >= self.parallels:
            raise ConfigError(
                f"runner.double_buffer: true steps two parts of whole env workers by turns, but runner.act_batch: "
                f"{self.act_batch} puts all runner.parallels: {self.parallels} envs in one block, which one worker "
                f"holds; set runner.act_batch below runner.parallels (half of it, for parts of one block each), "
                f"or runner.double_buffer: false")
        if self.double_buffer and self.act_in_workers:
            raise ConfigError("runner.double_buffer: true acts in this process while env workers step, but "
                              "runner.act_in_workers: true acts in the workers; set one of them false")
        if self.act_in_workers and not self.envs_in_processes():
            raise ConfigError(
                f"runner.act_in_workers: true needs env worker processes of this machine, but runner.vectorize: "
                f"{self.vectorize} with runner.parallels: {self.parallels} "
                + ("steps the envs in Ray actors, which take the actions of this process" if self.vectorize == "ray"
                   else "steps them in this process")
                + "; set runner.vectorize: subprocess, or runner.act_in_workers: false")

    def test_envs(self, render: bool) -> int:
        """Envs of ``--test``: one when recording (a video follows env 0), else up to one per episode."""
        return 1 if render else min(self.eval_parallels, self.test_episodes)


@dataclass
class GroupConfig:
    """Who controls one agent group: a registered agent (default: the run's ``--agent``),
    ``random``, or a frozen checkpoint (``load`` with ``train: false``, e.g. self-play)."""

    agent: Optional[str] = None
    load: Optional[str] = None
    train: bool = True


@dataclass
class SelfPlayConfig:
    """Self-play between two teams (``runner/self_play.py``), with ML-Agents' keys and meanings. One
    team learns while the other plays a snapshot from the pool of past policies; every count is in
    env steps of every env, as ``runner.total_steps`` is."""

    save_steps: int = field(default=20_000, metadata=value_range(1))    # a snapshot of the learner into the pool
    team_change: int = field(default=100_000, metadata=value_range(1))  # the other team learns from then on
    swap_steps: int = field(default=2_000, metadata=value_range(1))     # a new opponent is drawn
    window: int = field(default=10, metadata=value_range(1))            # snapshots kept in the pool
    play_against_latest_model_ratio: float = field(default=0.5, metadata=value_range(0.0, 1.0))
    initial_elo: float = 1200.0
    k: float = field(default=16.0, metadata=value_range(0.0))           # Elo's K factor
    # who won a match: auto, an env's winner statistic (won_<agent>), else the team with the higher
    # return where rewards are zero-sum (others are refused); final_reward, ML-Agents' convention for
    # its scenes: the sign of the team's reward at the match's last step (> 0 a win, < 0 a loss)
    outcome: Literal["auto", "final_reward"] = "auto"
    # the fixed opponents each evaluation plays, in each seat: random, a registered agent that does
    # not learn (a scripted opponent), or a checkpoint (a frozen reference)
    opponents: list[str] = field(default_factory=lambda: ["random"])


@dataclass
class RunConfig:
    agent: str = "MAPPO"
    env_name: str = "mpe_spread"
    mode: Literal["train", "test", "benchmark"] = "train"
    seed: int = field(default=1, metadata=value_range(0))
    device: str = "cpu"
    logger: Literal["tensorboard", "wandb", "console", "none"] = "tensorboard"
    wandb_project: str = "marlkit"
    load: Optional[str] = None
    resume: Optional[str] = None
    render: bool = False
    description: str = ""
    imports: list[str] = field(default_factory=list)   # modules registering user agents/envs/models
    env: EnvConfig = field(default_factory=EnvConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    agents: dict[str, Any] = field(default_factory=dict)
    groups: dict[str, GroupConfig] = field(default_factory=dict)
    self_play: Optional[SelfPlayConfig] = None

    def to_dict(self) -> dict:
        return to_plain(self)


# --------------------------------------------------------------------------- typed building


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp, key: str) -> Any:
    """Check ``value`` against annotation ``tp`` (converting where lossless); raise naming ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} does not fit {_type_name(tp)}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not allowed; choose one of {', '.join(map(repr, args))}"
                              f"{closest(str(value), map(str, args))}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} settings, got {value!r}")
        return build(tp, value, key)
    if origin in (list, tuple):
        if isinstance(value, (list, tuple)):
            inner = args[0] if args else Any
            return [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        raise ConfigError(f"{key}: expected a list, got {value!r}")
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        inner = args[1] if len(args) == 2 else Any
        return {k: _coerce(v, inner, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, (float, str)):
            try:
                as_float = float(value)
            except ValueError:
                as_float = None
            if as_float is not None and as_float.is_integer():
                return int(as_float)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def build(cls, data: dict | None, prefix: str = ""):
    """Build dataclass ``cls`` from a (possibly partial) mapping, validating every key."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping of {cls.__name__} settings, got {data!r}")
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in by_name:
            raise ConfigError(f"unknown key {path!r}{closest(str(key), by_name)}; valid keys here: "
                              f"{', '.join(by_name)}")
        value = _coerce(value, hints[key], path)
        meta = by_name[key].metadata
        if value is not None and isinstance(value, (int, float)):
            lo, hi = meta.get("min"), meta.get("max")
            span = f" (allowed: {lo} to {hi})" if lo is not None and hi is not None else ""
            if lo is not None and value < lo:
                raise ConfigError(f"{path}: {value!r} is below the minimum {lo}{span}")
            if hi is not None and value > hi:
                raise ConfigError(f"{path}: {value!r} is above the maximum {hi}{span}")
        kwargs[key] = value
    return cls(**kwargs)


def to_plain(obj) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


# --------------------------------------------------------------------------- YAML + overrides


def deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        with path.open() as stream:  # a stream, so that parse errors name the file, not <unicode string>
            data = yaml.safe_load(stream) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top, got {type(data).__name__}")
    return data


def load_env_yaml(path: str | Path, _seen: tuple = ()) -> dict:
    """An env YAML merged over the YAML its ``base:`` key names, if any: a packaged env's name or a
    path relative to this file (bases may have bases of their own)."""
    path = Path(path)
    data = load_yaml(path)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: base: expected an env name (doom_coop) or a YAML path, got {base!r}")
    try:
        base_path = path.parent / base if base.endswith((".yaml", ".yml")) else env_yaml_path(base)
        if not base_path.is_file():
            raise ConfigError(f"{str(base_path)!r} does not exist (a path is relative to this file)")
    except ConfigError as exc:
        raise ConfigError(f"{path}: base: {exc}") from None
    if base_path.resolve() in _seen + (path.resolve(),):
        raise ConfigError(f"{path}: base: {base!r} leads back to {path.name}; bases must not form a cycle")
    return deep_merge(load_env_yaml(base_path, _seen + (path.resolve(),)), data)


def with_agent_section(data: dict, agent: str, path: Path) -> dict:
    """An env YAML with its ``per_agent.<agent>`` settings merged in: settings of any section
    (``runner`` too) that hold only when that agent runs, e.g. MAT's larger rollouts."""
    per_agent = data.pop("per_agent", None) or {}
    if not isinstance(per_agent, dict) or not all(isinstance(v, dict) for v in per_agent.values()):
        raise ConfigError(f"{path}: per_agent: expected agent name -> settings, e.g. "
                          f"{{MAT: {{runner: {{parallels: 64}}}}}}, got {per_agent!r}")
    for name in per_agent:   # a misspelt agent would otherwise hold settings that never apply
        try:
            get_agent(name)
        except KeyError as exc:
            raise ConfigError(f"{path}: per_agent.{name}: {exc.args[0]}") from None
    return deep_merge(data, per_agent.get(agent, {}))


def available_envs() -> dict[str, str]:
    """Env name -> one-line description, for every YAML in ``marlkit/configs``."""
    return {p.stem: str(load_yaml(p).get("description", "")).strip() for p in sorted(CONFIG_DIR.glob("*.yaml"))}


def config_file_path(name: str) -> Path:
    """``--config``: a YAML file, or the name of a packaged profile in ``marlkit/configs/profiles``."""
    if Path(name).is_file() or name.endswith((".yaml", ".yml")):
        return Path(name)
    profiles = sorted(p.stem for p in (CONFIG_DIR / "profiles").glob("*.yaml"))
    if name not in profiles:
        raise ConfigError(f"--config {name!r}: no such file, and no packaged profile of that name"
                          f"{closest(name, profiles)}; profiles: {', '.join(profiles)}")
    return CONFIG_DIR / "profiles" / f"{name}.yaml"


def env_yaml_path(env: str) -> Path:
    """A bare name is a packaged config; anything ending in .yaml/.yml is a user file."""
    if env.endswith((".yaml", ".yml")):
        return Path(env)
    path = CONFIG_DIR / f"{env}.yaml"
    if not path.is_file():
        names = available_envs()
        raise ConfigError(f"unknown env {env!r}{closest(env, names)}; valid envs: {', '.join(names)} "
                          "(or pass the path of your own YAML file)")
    return path


def nest(key: str, value) -> dict:
    """``"runner.parallels", 8`` -> ``{"runner": {"parallels": 8}}``."""
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"{key!r}: empty part in a dotted key")
    for part in reversed(parts):
        value = {part: value}
    return value


def parse_set(items: list[str]) -> dict:
    """``["runner.parallels=8", "agents.MAPPO.lr=3e-4"]`` -> nested dict, values parsed as YAML."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set runner.parallels=8")
        key, raw = item.split("=", 1)
        try:
            out = deep_merge(out, nest(key, yaml.safe_load(raw) if raw.strip() else None))
        except ConfigError as exc:
            raise ConfigError(f"--set {item!r}: {exc}") from None
    return out


def import_modules(modules: list[str]) -> None:
    """``--import``: modules that register a user's agents, envs or models."""
    import importlib
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"--import {module}: {exc}") from None


def resolve(agent: str = "MAPPO", env: str = "mpe_spread", config_files: list[str] | None = None,
            overrides: dict | None = None, **top_level) -> RunConfig:
    """Merge defaults, the env YAML, extra YAML files and overrides into a validated RunConfig.

    Each layer is validated as it is merged, so an error names the file (or ``--set``) it came from.
    """
    get_agent(agent)
    env_path = env_yaml_path(env)
    top = {"agent": agent, "env_name": env_path.stem}
    layers = [(str(env_path), with_agent_section(load_env_yaml(env_path), agent, env_path))]
    layers += [(str(config_file_path(p)), load_yaml(config_file_path(p))) for p in config_files or []]
    layers.append(("", deep_merge(overrides or {}, {k: v for k, v in top_level.items() if v is not None})))
    merged: dict = {}
    for i, (source, layer) in enumerate(layers):
        merged = deep_merge(merged, layer)
        last = i == len(layers) - 1
        try:
            # every layer is validated, so that a bad key is blamed on its file; the checks that weigh
            # settings against each other wait for the last layer, which may still change either side
            cfg = from_dict({**merged, **top, "env_name": merged.get("env_name", top["env_name"])}, checks=last)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}" if source else str(exc)) from None
    # settled here, where a run begins, and saved with it: a run dir's config is taken as it is
    learning = {cfg.agent, *(g.agent or cfg.agent for g in cfg.groups.values() if g.train)}
    if any(get_agent(name).update_bound(cfg.agents[name]) for name in learning if name in cfg.agents):
        cfg.runner.settle_update_bound()
    return cfg


def from_dict(data: dict, checks: bool = True) -> RunConfig:
    """Validate a merged mapping (also what a run dir's ``config.yaml`` holds) into a RunConfig;
    ``checks``: also the agents' and the env type's checks of settings against each other."""
    data = dict(data)
    env_section = data.pop("env", None) or {}
    agents_section = data.pop("agents", None) or {}
    if not isinstance(env_section, dict):
        raise ConfigError(f"env: expected a mapping of env settings, got {env_section!r}")
    if not isinstance(agents_section, dict):
        raise ConfigError(f"agents: expected a mapping of agent name -> settings, got {agents_section!r}")
    cfg = build(RunConfig, data)
    cfg.runner.check()
    if cfg.self_play is not None:
        check_self_play(cfg)
    if cfg.render and cfg.mode != "test":
        raise ConfigError("--render records the test episodes of a checkpoint, one video each: use it with "
                          "--test --load CKPT (training and --benchmark record no video)")
    env_cls = get_env_type(str(env_section.get("type", EnvConfig.type)))
    cfg.env = build(env_cls.config_cls, env_section, "env")

    groups_agents = {g.agent for g in cfg.groups.values() if g.agent}
    for name in agents_section:
        try:
            get_agent(name)
        except KeyError as exc:
            raise ConfigError(f"agents.{name}: {exc}") from None
    needed = {cfg.agent, *groups_agents}
    for name in sorted(needed | set(agents_section)):
        try:
            agent_cls = get_agent(name)
        except KeyError as exc:
            raise ConfigError(str(exc)) from None
        section = agents_section.get(name)
        if section is not None and not isinstance(section, dict):
            raise ConfigError(f"agents.{name}: expected a mapping of {name} settings, got {section!r}")
        cfg.agents[name] = build(agent_cls.config_cls, section, f"agents.{name}")
        if checks:
            agent_cls.check_config(cfg.agents[name], cfg.runner, f"agents.{name}")
    if checks:
        env_cls.check_config(cfg)
    if cfg.runner.worker_timeout is None:   # null, and no env type check derived it
        cfg.runner.worker_timeout = WORKER_TIMEOUT
    return cfg


def check_self_play(cfg: RunConfig) -> None:
    """Self-play changes who learns and whom they play at rollout boundaries: a rollout collected
    beside the update (``runner.overlap``) would be learned from by a side that did not play it."""
    if cfg.runner.overlap:
        raise ConfigError("runner.overlap: true collects the next rollout beside the update, but self_play changes "
                          "who learns and whom they play between rollouts; set runner.overlap: false (or null)")
    cfg.runner.overlap = False
    frozen = [g for g, gc in cfg.groups.items() if not gc.train or gc.load]
    if frozen:
        raise ConfigError(f"groups.{frozen[0]}: self_play trains every group and plays the frozen side from its "
                          f"pool of past selves; remove groups.{frozen[0]}'s load and train settings (a fixed opponent "
                          "goes in self_play.opponents)")


def save_config(cfg: RunConfig, path: str | Path) -> None:
    """Atomically: a run dir never holds a half-written config."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    tmp.replace(path)
