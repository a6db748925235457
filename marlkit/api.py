"""``marlkit.run(...)``: the Python twin of the ``marlkit`` command."""
from __future__ import annotations

from pathlib import Path

from marlkit.config import ConfigError, deep_merge, from_dict, load_yaml, nest, resolve
from marlkit.runners.pettingzoo import Runner, RunResult

MODES = ("train", "test", "benchmark")


def build_config(agent: str | None = None, env: str | None = None, mode: str = "train",
                 config: str | list[str] | None = None, resume: str | None = None, **overrides):
    """Resolve a run config (agent default MAPPO, env default mpe_spread). ``overrides`` are
    top-level keys (``seed=3``), sections (``runner={"parallels": 8}``) or dotted keys given as a
    dict (``**{"runner.parallels": 8}``). With ``resume``, the run directory's saved config is the
    base and only overrides apply."""
    if mode not in MODES:
        raise ConfigError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    nested: dict = {}
    for key, value in overrides.items():
        nested = deep_merge(nested, nest(key, value))
    files = [config] if isinstance(config, str) else list(config or [])
    if resume:
        saved = Path(resume) / "config.yaml"
        if not saved.is_file():
            raise FileNotFoundError(f"--resume {resume!r}: no config.yaml there; pass a run directory "
                                    "such as runs/mpe_spread/MAPPO/<run>")
        data = load_yaml(saved)
        if files:
            raise ConfigError("--resume continues with the run's own config.yaml; change settings with --set, "
                              "not --config")
        for name, given in (("agent", agent), ("env_name", env)):
            if given is not None and Path(given).stem != Path(str(data.get(name))).stem:
                raise ConfigError(f"--resume {resume!r}: that run used {name.replace('_name', '')} "
                                  f"{data.get(name)!r}, not {given!r}; drop the flag to continue it")
        data = deep_merge(data, nested)
        data.update(mode=mode, resume=str(resume))
        return from_dict(data)
    return resolve(agent=agent or "MAPPO", env=env or "mpe_spread", config_files=files, overrides=nested,
                   mode=mode)


def run(agent: str | None = None, env: str | None = None, mode: str = "train", **kwargs) -> RunResult:
    """Train, test or benchmark; returns the run directory and final metrics."""
    cfg = build_config(agent, env, mode, **kwargs)
    return run_config(cfg)


def run_config(cfg) -> RunResult:
    run_dir = Path(cfg.resume) if cfg.resume else None
    runner = Runner(cfg, run_dir)
    if cfg.mode == "test":
        return runner.test()
    if cfg.mode == "benchmark":
        return runner.benchmark()
    return runner.train()
