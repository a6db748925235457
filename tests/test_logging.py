"""Loggers: TensorBoard event files, wandb offline without a key, the console."""
import builtins
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import marlkit
from marlkit.errors import ConfigError
from marlkit.logger import Logger


def test_tensorboard_is_the_default_and_writes_real_events(tiny):
    overrides = {k: v for k, v in tiny.items() if k != "logger"}
    run = marlkit.run(agent="MAPPO", env="mpe_spread", mode="benchmark",
                      **{**overrides, "runner.total_steps": 100, "runner.log_interval": 20})
    events = EventAccumulator(str(run.run_dir))
    events.Reload()
    tags = events.Tags()["scalars"]
    for tag in ("agents/episode_return", "agents/policy_loss", "agents/value_loss", "agents/entropy",
                "perf/env_steps_per_s", "eval/agents/return"):
        assert tag in tags, tag
    assert [e.step for e in events.Scalars("eval/agents/return")] == [0, 20, 40, 60, 80, 100]


def test_console_logger_prints_metrics(capsys, tmp_path):
    log = Logger("console", tmp_path, {})
    log.log({"a/b": 1.5, "bad": float("nan")}, step=42)
    out = capsys.readouterr().out
    assert "[        42] a/b=1.5" in out and "bad" not in out


@pytest.mark.slow
def test_wandb_without_a_key_runs_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))           # no ~/.netrc with credentials
    log = Logger("wandb", tmp_path, {"x": 1})
    try:
        assert log._backend.settings.mode == "offline"
        log.log({"loss": 0.5}, step=1)
    finally:
        log.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_missing_wandb_says_how_to_install(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ConfigError, match=r"pip install 'marlkit\[wandb\]'"):
        Logger("wandb", tmp_path, {})
