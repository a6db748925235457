"""``marlkit.run(...)``: the Python twin of the ``marlkit`` command."""
from __future__ import annotations

from pathlib import Path

from marlkit.config import ConfigError, deep_merge, from_dict, load_yaml, parse_set, resolve
from marlkit.runners.pettingzoo import Runner, RunResult

MODES = ("train", "test", "benchmark")


def build_config(agent: str = "MAPPO", env: str = "mpe_spread", mode: str = "train",
                 config: str | list[str] | None = None, resume: str | None = None, **overrides):
    """Resolve a run config. ``overrides`` are top-level keys (``seed=3``), sections
    (``runner={"parallels": 8}``) or dotted keys given as a dict (``**{"runner.parallels": 8}``)."""
    if mode not in MODES:
        raise ConfigError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    nested: dict = {}
    dotted = [f"{k}={_yaml_scalar(v)}" for k, v in overrides.items() if "." in k]
    for key, value in overrides.items():
        if "." not in key:
            nested = deep_merge(nested, {key: value})
    nested = deep_merge(nested, parse_set(dotted))
    if resume:
        saved = Path(resume) / "config.yaml"
        if not saved.is_file():
            raise FileNotFoundError(f"--resume {resume!r}: no config.yaml there; pass a run directory "
                                    "such as runs/mpe_spread/MAPPO/<run>")
        data = deep_merge(load_yaml(saved), nested)
        data.update(mode=mode, resume=str(resume))
        return from_dict(data)
    files = [config] if isinstance(config, str) else list(config or [])
    return resolve(agent=agent, env=env, config_files=files, overrides=nested, mode=mode)


def _yaml_scalar(value) -> str:
    import yaml
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def run(agent: str = "MAPPO", env: str = "mpe_spread", mode: str = "train", **kwargs) -> RunResult:
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
