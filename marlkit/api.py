"""``marlkit.run(...)``: the Python twin of the ``marlkit`` command."""
from __future__ import annotations

from pathlib import Path

from marlkit.config import deep_merge, from_dict, import_modules, load_yaml, nest, resolve, to_plain
from marlkit.errors import ConfigError
from marlkit.runners.runner import Runner, RunResult

MODES = ("train", "test", "benchmark")

# What an exact resume depends on: changing any of these would continue another experiment (or
# fail to fit the saved arrays), so --resume refuses them instead of corrupting the run.
FROZEN_ON_RESUME = ("agent", "env_name", "seed", "env", "groups", "runner.parallels", "runner.horizon")


def build_config(agent: str | None = None, env: str | None = None, mode: str | None = None,
                 config: str | list[str] | None = None, resume: str | None = None,
                 overrides: dict | None = None, **kwargs):
    """Resolve a run config (agent default MAPPO, env default mpe_spread).

    ``overrides`` is a nested mapping (``{"env": {"kwargs": {"N": 4}}}``, what ``--set`` gives);
    ``kwargs`` are top-level keys (``seed=3``), sections (``runner={"parallels": 8}``) or dotted keys
    (``**{"runner.parallels": 8}``). With ``resume``, the run directory's saved config is the base,
    only overrides apply, and everything an exact resume needs is checked before anything starts.
    ``mode`` None trains, or with ``resume`` continues the run in the mode it was started in.
    """
    if mode is not None and mode not in MODES:
        raise ConfigError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    nested: dict = deep_merge({}, overrides or {})
    for key, value in kwargs.items():
        nested = deep_merge(nested, nest(key, value))
    files = [config] if isinstance(config, str) else list(config or [])
    if resume:
        return _resume_config(Path(resume), agent, env, mode, files, nested)
    mode = mode or "train"
    import_modules(list(nested.get("imports") or []))
    if nested.get("load"):
        # what the checkpoint was trained with: its imports, and its agent and env unless given
        saved = _saved_config(Path(nested["load"]).parent)
        imports = list(dict.fromkeys(list(saved.get("imports") or []) + list(nested.get("imports") or [])))
        import_modules(imports)
        if saved and env is None and agent in (None, saved.get("agent")) and not files:
            # the run's resolved config is the base: it holds the env even when that came from a
            # YAML file of the user's, which its stem in env_name could not find again
            merged = deep_merge(saved, nested)
            merged.update(mode=mode, resume=None, imports=imports)
            return from_dict(merged)
        agent = agent or saved.get("agent")
    return resolve(agent=agent or "MAPPO", env=env or "mpe_spread", config_files=files, overrides=nested,
                   mode=mode)


def _saved_config(run_dir: Path) -> dict:
    """The config.yaml of a run directory ({} if there is none), so that testing or continuing a
    checkpoint needs no flag repeated."""
    saved = run_dir / "config.yaml"
    return load_yaml(saved) if saved.is_file() else {}


def _resume_config(run_dir: Path, agent, env, mode: str | None, files: list, nested: dict):
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise FileNotFoundError(f"--resume {str(run_dir)!r}: no config.yaml there; pass a run directory "
                                "such as runs/mpe_spread/MAPPO/<run>")
    if files:
        raise ConfigError("--resume continues with the run's own config.yaml; change settings with --set, "
                          "not --config")
    latest = run_dir / "latest.pt"
    if not latest.is_file():
        raise FileNotFoundError(f"--resume {str(run_dir)!r}: the run saved no latest.pt (it stopped before its "
                                "first checkpoint), so there is nothing to continue; start a new run")
    data = load_yaml(saved)
    for name, given in (("agent", agent), ("env_name", env)):
        if given is not None and Path(given).stem != Path(str(data.get(name))).stem:
            raise ConfigError(f"--resume {str(run_dir)!r}: that run used {name.replace('_name', '')} "
                              f"{data.get(name)!r}, not {given!r}; drop the flag to continue it")
    imports = list(dict.fromkeys(list(data.get("imports") or []) + list(nested.get("imports") or [])))
    import_modules(imports)
    before = from_dict(data)
    merged = deep_merge(data, nested)
    # a plain --resume continues the run as it was started: a benchmark goes on evaluating
    mode = mode or data.get("mode", "train")
    if mode == "test":
        raise ConfigError(f"--resume {str(run_dir)!r} continues training; to test the run pass "
                          f"--test --load {latest} instead")
    merged.update(mode=mode, resume=str(run_dir), imports=imports)
    after = from_dict(merged)
    for frozen in FROZEN_ON_RESUME:
        old, new = _get(to_plain(before), frozen), _get(to_plain(after), frozen)
        if old != new:
            key, old, new = _first_difference(frozen, old, new)
            raise ConfigError(f"--resume: {key} cannot change when a run is continued (the run was saved with "
                              f"{key}={_short(old)}, now {_short(new)}); drop that --set, or start a new run "
                              f"with --load {latest} to begin from its weights")
    steps = _saved_steps(latest)
    if steps >= after.runner.total_steps:
        raise ConfigError(f"--resume: the run in {str(run_dir)!r} is finished ({steps} of "
                          f"{after.runner.total_steps} env steps); to train it further pass a larger budget, "
                          f"e.g. --set runner.total_steps={2 * after.runner.total_steps}")
    return after


def _first_difference(key: str, old, new) -> tuple[str, object, object]:
    """The innermost dotted key where two settings differ (``env.kwargs.N``, not all of ``env``)."""
    while isinstance(old, dict) and isinstance(new, dict):
        changed = [k for k in dict.fromkeys([*old, *new]) if old.get(k) != new.get(k)]
        key, old, new = f"{key}.{changed[0]}", old.get(changed[0]), new.get(changed[0])
    return key, old, new


def _get(data: dict, dotted: str):
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _saved_steps(latest: Path) -> int:
    from marlkit.runners.checkpoint import read_steps
    return read_steps(latest)


def run(agent: str | None = None, env: str | None = None, mode: str | None = None, **kwargs) -> RunResult:
    """Train, test or benchmark (``mode``; None trains, or continues a ``resume`` run in its own
    mode); returns the run directory and final metrics."""
    cfg = build_config(agent, env, mode, **kwargs)
    return run_config(cfg)


def run_config(cfg) -> RunResult:
    return Runner(cfg, Path(cfg.resume) if cfg.resume else None).run()
