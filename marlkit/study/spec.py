"""What a study is: agents x envs x seeds with settings for every run, read from study.yaml or the
command line, checked run by run before anything starts, and kept in ``study.json`` so that the same
study name always means the same runs."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from marlkit.config import deep_merge, load_yaml, nest, parse_set, to_plain
from marlkit.errors import BAD_INPUT_ERRORS, ConfigError, EnvAPIError, UnknownNameError
from marlkit.registry import closest

KEYS = ("name", "agents", "envs", "seeds", "set", "reference", "jobs", "backend")
BACKENDS = ("local", "ray")
# env types whose envs are plain Python objects, cheap to build once to read their spec; the others
# (game engines, Unity scenes) are asked through ``probe_spec`` only
CHEAP_ENV_TYPES = ("pettingzoo", "gymma")


@dataclass
class StudySpec:
    """``set``: nested overrides for every run (what ``--set`` gives); ``reference``: per env the
    score that normalises to 1 (unset: the best agent's mean final score there)."""

    name: str
    agents: list[str]
    envs: list[str]
    seeds: list[int]
    set: dict = field(default_factory=dict)
    reference: dict[str, float] = field(default_factory=dict)
    jobs: int | None = None
    backend: str = "local"

    @property
    def run_root(self) -> Path:
        return Path((self.set.get("runner") or {}).get("run_root", "runs"))

    @property
    def root(self) -> Path:
        """``<runner.run_root>/studies/<name>``: the study's files and every run directory."""
        return self.run_root / "studies" / self.name

    def run_dir(self, env: str, agent: str, seed: int) -> Path:
        return self.root / Path(env).stem / agent / f"seed{seed}"

    def runs(self) -> list[tuple[str, str, int]]:
        """Every (env, agent, seed), seeds innermost: the first seeds of every pair run first, so an
        interrupted study has something to compare on every env."""
        return [(env, agent, seed) for seed in self.seeds for env in self.envs for agent in self.agents]

    def defining(self) -> dict:
        """What decides the runs' results; ``jobs``, ``backend`` and ``reference`` may change between
        invocations of the same study."""
        return {"agents": self.agents, "envs": self.envs, "seeds": self.seeds, "set": self.set}


def _names(value, key: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{key}: expected a list of names, e.g. {key}: [MAPPO, IPPO], got {value!r}")
    duplicate = next((v for v in value if value.count(v) > 1), None)
    if duplicate:
        raise ConfigError(f"{key}: {duplicate!r} is listed twice; list each once")
    return list(value)


def _seeds(value) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
        raise ConfigError(f"seeds: expected a list of integers >= 0, e.g. seeds: [1, 2, 3], got {value!r}")
    duplicate = next((v for v in value if value.count(v) > 1), None)
    if duplicate is not None:
        raise ConfigError(f"seeds: {duplicate} is listed twice; each seed is one run per agent and env")
    return list(value)


def _overrides(value) -> dict:
    """``set:`` as a mapping of dotted or nested keys, or a list of ``key=value`` strings."""
    if value is None:
        return {}
    if isinstance(value, list):
        return parse_set([str(v) for v in value])
    if not isinstance(value, dict):
        raise ConfigError(f"set: expected a mapping of settings for every run, e.g. set: {{runner.total_steps: "
                          f"200000}}, got {value!r}")
    out: dict = {}
    for key, item in value.items():
        out = deep_merge(out, nest(str(key), item))
    return out


def parse_spec(data: dict, default_name: str | None = None) -> StudySpec:
    """A validated StudySpec from study.yaml's mapping (command-line values already merged in)."""
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise ConfigError(f"study: unknown key {unknown[0]!r}{closest(str(unknown[0]), KEYS)}; a study has "
                          f"{', '.join(KEYS)}")
    for key in ("agents", "envs", "seeds"):
        if data.get(key) is None:
            raise ConfigError(f"study: {key} is missing; give it in study.yaml or as --{key}")
    agents, envs, seeds = _names(data["agents"], "agents"), _names(data["envs"], "envs"), _seeds(data["seeds"])
    stems = [Path(e).stem for e in envs]
    twin = next((e for e, stem in zip(envs, stems) if stems.count(stem) > 1), None)
    if twin:
        raise ConfigError(f"envs: two envs are named {Path(twin).stem!r} (their runs would share a folder); rename "
                          "one of the YAML files")
    name = data.get("name") or default_name or "_".join(["-".join(agents), "-".join(Path(e).stem for e in envs)])
    if not isinstance(name, str) or "/" in name or name.startswith("."):
        raise ConfigError(f"name: {name!r} is not a folder name; use letters, digits, '-' and '_'")
    reference = data.get("reference") or {}
    if not isinstance(reference, dict):
        raise ConfigError(f"reference: expected a mapping of env -> score, got {reference!r}")
    for env, score in reference.items():
        if str(env) not in stems and str(env) not in envs:
            raise ConfigError(f"reference: {env!r} is not an env of this study{closest(str(env), stems)}; "
                              f"its envs are {', '.join(stems)}")
        if not isinstance(score, (int, float)) or isinstance(score, bool):
            raise ConfigError(f"reference.{env}: expected a number (the score that normalises to 1), got {score!r}")
    jobs = data.get("jobs")
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        raise ConfigError(f"jobs: expected an integer >= 1 (runs at once), or null to size it to the machine, "
                          f"got {jobs!r}")
    backend = data.get("backend") or "local"
    if backend not in BACKENDS:
        raise ConfigError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    return StudySpec(name=name, agents=agents, envs=envs, seeds=seeds, set=_overrides(data.get("set")),
                     reference={Path(str(k)).stem: float(v) for k, v in reference.items()}, jobs=jobs,
                     backend=backend)


def load_spec(path: str | None, cli: dict) -> StudySpec:
    """study.yaml (if any) with the command line's values over it; ``cli['set']`` is merged over the
    file's ``set``, every other key replaces the file's."""
    data = load_yaml(path) if path else {}
    default_name = Path(path).stem if path else None
    for key, value in cli.items():
        if value is None:
            continue
        if key == "set":
            data["set"] = deep_merge(_overrides(data.get("set")), value)
        else:
            data[key] = value
    return parse_spec(data, default_name)


# ---------------------------------------------------------------------- the runs, checked


@dataclass
class PlannedRun:
    """One (env, agent, seed) of the study: ``cfg`` its resolved RunConfig, ``memory`` the bytes its
    agents estimate for their storage and update (None where the env's spec is not known without
    starting it)."""

    env: str
    agent: str
    seed: int
    run_dir: Path
    cfg: object
    memory: int | None = None

    @property
    def label(self) -> str:
        return f"{self.agent} on {Path(self.env).stem}, seed {self.seed}"

    @property
    def key(self) -> str:
        return f"{Path(self.env).stem}/{self.agent}/seed{self.seed}"


def plan_runs(spec: StudySpec) -> list[PlannedRun]:
    """Every run of the study, its config resolved with marlkit's own resolution and its agents
    checked against the env's spec; every problem is collected and raised together as one
    ConfigError, a line each, before anything starts."""
    from marlkit.api import build_config
    from marlkit.config import env_yaml_path, import_modules
    from marlkit.registry import get_agent

    problems: list[str] = []
    import_modules(list(spec.set.get("imports") or []))
    agents = []
    for agent in spec.agents:
        try:
            get_agent(agent)
            agents.append(agent)
        except UnknownNameError as exc:
            problems.append(f"agents: {exc}")
    envs = []
    for env in spec.envs:
        try:
            path = env_yaml_path(env)
            if not path.is_file():
                raise ConfigError(f"env file {str(path)!r} does not exist")
            envs.append(env)
        except ConfigError as exc:
            problems.append(f"envs: {exc}")

    failed: dict[str, list[str]] = {}   # message -> the pairs it holds for
    configs = {}
    specs: dict[str, object] = {}
    for env in envs:
        for agent in agents:
            pair = f"{agent} on {Path(env).stem}"
            try:
                cfg = build_config(agent, env, "benchmark",
                                   overrides=deep_merge(spec.set, {"seed": spec.seeds[0]}))
                _check_groups(cfg, specs)
                configs[(env, agent)] = cfg
            except (*BAD_INPUT_ERRORS, EnvAPIError, ImportError) as exc:
                failed.setdefault(str(exc), []).append(pair)
    every = len(envs) * len(agents)
    for message, pairs in failed.items():
        # a bad --set key fails every pair alike: said once
        problems.append(f"every run: {message}" if len(pairs) == every > 1 else f"{', '.join(pairs)}: {message}")
    if problems:
        raise ConfigError("\n".join(problems))

    runs = []
    for env, agent, seed in spec.runs():
        cfg = configs[(env, agent)]
        cfg = build_config(agent, env, "benchmark", overrides=deep_merge(spec.set, {"seed": seed})) \
            if seed != cfg.seed else cfg
        runs.append(PlannedRun(env, agent, seed, spec.run_dir(env, agent, seed), cfg,
                               _memory(cfg, specs.get(_env_key(cfg)))))
    return runs


def _env_key(cfg) -> str:
    return json.dumps(to_plain(cfg.env), sort_keys=True, default=str)


def env_spec(cfg, cache: dict):
    """The env's spec without a vector env: the env type's ``probe_spec``, else one env built and
    closed where that is cheap (CHEAP_ENV_TYPES), else None."""
    key = _env_key(cfg)
    if key not in cache:
        from marlkit.envs.factory import make_env
        from marlkit.registry import get_env_type
        spec = get_env_type(cfg.env.type).probe_spec(cfg.env)
        if spec is None and cfg.env.type in CHEAP_ENV_TYPES:
            env = make_env(cfg.env)
            try:
                spec = env.spec
            finally:
                env.close()
        cache[key] = spec
    return cache[key]


def _check_groups(cfg, cache: dict) -> None:
    """The agents' ``check_group`` on each group of the env they would drive (QMIX refuses Box
    actions, COMA MultiDiscrete), and the config's group names against the env's."""
    from marlkit.registry import get_agent
    from marlkit.runners.group_agents import group_agent_names
    spec = env_spec(cfg, cache)
    if spec is None:
        return
    for g, name in group_agent_names(cfg, spec.groups).items():
        get_agent(name).check_group(spec.groups[g])


def _memory(cfg, spec) -> int | None:
    if spec is None:
        return None
    from marlkit.registry import get_agent
    from marlkit.runners.group_agents import group_agent_names
    from marlkit.storage import StorageLayout
    rc = cfg.runner
    names = group_agent_names(cfg, spec.groups)
    return sum(get_agent(names[g]).memory_estimate(StorageLayout(gs, spec, rc.parallels, rc.horizon,
                                                                 double=rc.overlapped()),
                                                   cfg.agents[names[g]], key=f"agents.{names[g]}").total
               for g, gs in spec.groups.items())


# ---------------------------------------------------------------------- study.json


def resolved(spec: StudySpec, runs: list[PlannedRun]) -> dict:
    """What study.json keeps: the spec, and each agent's resolved config per env (the seed aside),
    so that an env YAML changed since is caught as well as a changed ``set``."""
    configs = {}
    for run in runs:
        plain = to_plain(run.cfg)
        plain.pop("seed", None)
        configs.setdefault(f"{Path(run.env).stem}/{run.agent}", plain)
    return {"name": spec.name, **spec.defining(), "reference": spec.reference, "configs": configs}


def check_unchanged(saved: dict, now: dict, where: Path) -> None:
    """Refuse, naming the first difference, to continue a study under settings other than those
    its runs were started with."""
    for key in ("agents", "envs", "seeds", "set", "configs"):
        diff = first_difference(key, saved.get(key), now.get(key))
        if diff is None:
            continue
        name, old, new = diff
        raise ConfigError(f"study {now['name']!r} in {where} was started with {name}={_short(old)}, now "
                          f"{_short(new)}; give it the same settings to continue it, or another --name for a "
                          f"new study")


def first_difference(key: str, old, new):
    """(dotted key, old, new) of the innermost difference of two plain values, or None."""
    if old == new:
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        for k in dict.fromkeys([*old, *new]):
            if old.get(k) != new.get(k):
                return first_difference(f"{key}.{k}", old.get(k), new.get(k))
    return key, old, new


def _short(value) -> str:
    text = json.dumps(value) if value is not None else "(unset)"
    return text if len(text) <= 80 else text[:77] + "..."


def read_saved(root: Path) -> dict | None:
    path = root / "study.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); move it aside to start the study anew") from None


def write_saved(root: Path, data: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / "study.json.tmp"
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(root / "study.json")


def spec_from_saved(saved: dict, root: Path) -> StudySpec:
    """The StudySpec study.json describes (``--report --name``); the root is where it was found."""
    spec = StudySpec(name=saved["name"], agents=saved["agents"], envs=saved["envs"], seeds=saved["seeds"],
                     set=saved.get("set") or {}, reference=saved.get("reference") or {})
    spec.set = deep_merge(spec.set, {"runner": {"run_root": str(root.parent.parent)}})
    return spec
