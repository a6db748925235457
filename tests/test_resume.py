"""Checkpoints: exact resume, atomic writes, mismatched checkpoints, the NaN guard."""
import json
import pickle
from pathlib import Path

import pytest
import torch

import marlkit
from conftest import assert_same_training
from marlkit.config import ConfigError
from marlkit.envs.vector.state import dumps_state
from marlkit.errors import CheckpointMismatchError, TrainingDivergedError
from marlkit.runners import checkpoint as ckpt_module


def _run(tiny, **extra):
    return marlkit.run(agent="MAPPO", env="mpe_spread", seed=4, **{**tiny, "runner.parallels": 4,
                                                                   "runner.horizon": 25, **extra})


@pytest.mark.slow
@pytest.mark.exact
@pytest.mark.parametrize("agent", ["MAPPO", "IPPO"])
def test_resume_continues_exactly(tiny, agent):
    full = marlkit.run(agent=agent, env="mpe_spread", seed=4, **{**tiny, "runner.parallels": 4,
                                                                 "runner.horizon": 25, "runner.total_steps": 1200,
                                                                 "runner.save_interval": 600})
    half = marlkit.run(agent=agent, env="mpe_spread", seed=4, **{**tiny, "runner.parallels": 4,
                                                                 "runner.horizon": 25, "runner.total_steps": 600,
                                                                 "runner.save_interval": 600})
    resumed = marlkit.run(mode="train", resume=str(half.run_dir), **{"runner.total_steps": 1200})
    assert resumed.run_dir == half.run_dir and resumed.steps == 1200
    assert resumed.metrics.keys() == full.metrics.keys()
    assert_same_training(full, resumed)


def test_failed_save_keeps_the_previous_checkpoint(tiny, monkeypatch):
    run = _run(tiny, **{"runner.total_steps": 200})
    latest = run.run_dir / "latest.pt"
    before = latest.read_bytes()

    def broken_save(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_module.torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        ckpt_module.save_checkpoint(latest, {"groups": {}})
    assert latest.read_bytes() == before
    assert [p.name for p in run.run_dir.iterdir() if p.name.endswith(".tmp")] == []


def test_checkpoint_from_another_agent_or_env_is_refused(tiny, env_yaml):
    run = _run(tiny, **{"runner.total_steps": 100})
    ckpt = str(run.run_dir / "latest.pt")
    with pytest.raises(CheckpointMismatchError, match="group 'agents' was trained by agent 'MAPPO', but this run uses 'IPPO'"):
        marlkit.run(agent="IPPO", env="mpe_spread", mode="test", load=ckpt, **tiny)
    other = env_yaml("toy_envs:scripted")
    with pytest.raises(CheckpointMismatchError, match="was trained on env 'mpe_spread', but this run uses env 'toy'"):
        marlkit.run(agent="MAPPO", env=other, mode="test", load=ckpt, **tiny)
    # same env name, different spaces (N=4 agents instead of 3)
    with pytest.raises(CheckpointMismatchError, match="trained on a different env: agents was"):
        marlkit.run(agent="MAPPO", env="mpe_spread", mode="test", load=ckpt, **{**tiny, "env.kwargs.N": 4})
    garbage = Path(tiny["runner.run_root"]) / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointMismatchError, match="is not a marlkit checkpoint"):
        marlkit.run(agent="MAPPO", env="mpe_spread", mode="test", load=str(garbage), **tiny)


def test_missing_load_file_and_test_without_load(tiny):
    with pytest.raises(FileNotFoundError, match="--load 'nope.pt': no such checkpoint file"):
        marlkit.run(agent="MAPPO", env="mpe_spread", mode="test", load="nope.pt", **tiny)
    with pytest.raises(ConfigError, match="--test needs a checkpoint"):
        marlkit.run(agent="MAPPO", env="mpe_spread", mode="test", **tiny)
    with pytest.raises(FileNotFoundError, match="no config.yaml there"):
        marlkit.run(mode="train", resume=tiny["runner.run_root"])


def test_nan_guard_stops_and_keeps_last_good_checkpoint(env_yaml, tiny):
    # two updates of 10 steps per env go well and are saved; the env's rewards turn NaN at its step 25
    path = env_yaml("toy_envs:broken", {"how": "nan_reward", "break_at": 25})
    with pytest.raises(TrainingDivergedError) as err:
        marlkit.run(agent="MAPPO", env=path, **{**tiny, "runner.total_steps": 400, "runner.save_interval": 20})
    message = str(err.value)
    assert "training stopped at step 60" in message and "the loss became nan" in message
    assert "the last good checkpoint is" in message
    kept = Path(message.split("the last good checkpoint is ")[1].strip())
    state = torch.load(kept, weights_only=False)
    assert pickle.loads(state["runner"])["steps"] == 40
    for name, tensor in state["groups"]["agents"]["modules"].items():
        assert torch.isfinite(tensor.float()).all(), name


def test_load_starts_training_from_a_checkpoint(tiny):
    first = _run(tiny, **{"runner.total_steps": 100})
    weights = torch.load(first.run_dir / "latest.pt", weights_only=False)["groups"]["agents"]["modules"]
    # zero learning rate: the loaded weights must come through training untouched
    second = _run(tiny, load=str(first.run_dir / "latest.pt"), **{"runner.total_steps": 100, "agents.MAPPO.lr": 0.0})
    after = torch.load(second.run_dir / "latest.pt", weights_only=False)["groups"]["agents"]["modules"]
    for name, tensor in weights.items():
        if "value_norm" not in name:
            torch.testing.assert_close(after[name], tensor, rtol=0, atol=0, msg=name)


def test_a_resumed_run_reports_the_wall_time_of_all_its_processes(tiny):
    """The wall time in a resumed run's metrics and report adds the time of the processes before
    it, up to the checkpoint it resumed from, to its own."""
    settings = {**tiny, "runner.total_steps": 400, "runner.save_interval": 400, "runner.parallels": 4,
                "runner.horizon": 25}
    half = marlkit.run(agent="MAPPO", env="mpe_spread", mode="benchmark", seed=2, **settings)
    saved = pickle.loads(torch.load(half.run_dir / "latest.pt", weights_only=False)["runner"])["wall_time_s"]
    assert 0 < saved <= half.metrics["perf/wall_time_s"]
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 800})
    report = json.loads((half.run_dir / "benchmark.json").read_text())
    assert report["wall_time_s"] == resumed.metrics["perf/wall_time_s"] > saved
    # what is left after the saved time is the resumed process's own: its 400 steps at its own rate
    own = resumed.metrics["perf/wall_time_s"] - saved
    assert own > 0 and resumed.metrics["perf/env_steps_per_s_overall"] * own == pytest.approx(400, rel=1e-6)


def test_plain_resume_of_a_benchmark_run_goes_on_evaluating(tiny):
    """``--resume RUN`` without ``--benchmark`` continues a benchmark as a benchmark: evaluations,
    best.pt and the report carry on, as they would have without the interruption."""
    settings = {**tiny, "runner.total_steps": 40, "runner.save_interval": 40, "runner.eval_interval": 20}
    half = marlkit.run(agent="MAPPO", env="mpe_spread", mode="benchmark", seed=2, **settings)
    assert [e["step"] for e in half.evaluations] == [0, 20, 40]
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 80})
    assert resumed.mode == "benchmark"
    assert [e["step"] for e in resumed.evaluations] == [0, 20, 40, 60, 80]
    report = json.loads((half.run_dir / "benchmark.json").read_text())
    assert [e["step"] for e in report["evaluations"]] == [0, 20, 40, 60, 80]


@pytest.mark.slow
@pytest.mark.exact
def test_a_wrapped_env_resumes_exactly_when_its_env_does(tiny, battle_yaml):
    """The grid battle of benchmarks/scaling.py (pure Python, declared exact) with a frame stack: the
    wrapper's frames pickle with the env, so a resumed run continues the very same episodes."""
    path = battle_yaml(max_cycles=30, frame_stack=2, exact_resume=True)
    settings = {**tiny, "runner.parallels": 2, "runner.horizon": 20, "agents.MAPPO.epochs": 2}
    full = marlkit.run(agent="MAPPO", env=str(path), seed=3, **{**settings, "runner.total_steps": 160,
                                                                 "runner.save_interval": 80})
    half = marlkit.run(agent="MAPPO", env=str(path), seed=3, **{**settings, "runner.total_steps": 80,
                                                                 "runner.save_interval": 80})
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 160})
    assert resumed.steps == full.steps == 160 and resumed.episode_returns == full.episode_returns
    for key, value in full.metrics.items():
        if not key.startswith("perf/"):
            assert resumed.metrics[key] == value, key


def test_envs_saved_by_older_code_start_fresh_episodes_and_the_run_goes_on(tiny, capsys):
    """A checkpoint's envs are pickled objects; one written before the adapter gained an attribute
    comes back without it, and today's code would fail on it mid-run. Such envs are left fresh:
    the run resets them, says why, and goes on with its agents and counters."""
    half = _run(tiny, **{"runner.total_steps": 100, "runner.save_interval": 100})
    latest = half.run_dir / "latest.pt"
    ckpt = torch.load(latest, weights_only=False)
    saved = pickle.loads(ckpt["venv"])
    old_envs = []
    for blob in saved["envs"]:
        env = pickle.loads(blob)
        assert type(env).__name__ == "PettingZooEnv"
        del env._rows   # as the adapter was before it read arrays
        old_envs.append(dumps_state(env))
    ckpt["venv"] = pickle.dumps({**saved, "envs": old_envs})
    torch.save(ckpt, latest)
    capsys.readouterr()
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 200})
    assert resumed.steps == 200 and len(resumed.episode_returns) > 0
    assert "written by another version of marlkit" in capsys.readouterr().out


def test_only_attributes_old_objects_cannot_read_make_their_envs_start_fresh():
    """An attribute added with a class default (a dataclass field) still reads on an old object, so
    it does not condemn the saved envs; one set only in ``__init__`` does."""
    from marlkit.api import build_config
    from marlkit.envs.factory import make_env
    from marlkit.envs.vector.state import loads_states

    def saved(drop):
        env = make_env(build_config("MAPPO", "mpe_spread").env)
        drop(env)
        blob = dumps_state(env)
        env.close()
        return blob

    fresh = [make_env(build_config("MAPPO", "mpe_spread").env)]
    assert type(fresh[0].spec).episode_limit is None   # a class default
    envs, restored = loads_states(fresh, [saved(lambda env: delattr(env.spec, "episode_limit"))])
    assert restored and envs[0] is not fresh[0]
    fresh = [make_env(build_config("MAPPO", "mpe_spread").env)]
    envs, restored = loads_states(fresh, [saved(lambda env: delattr(env, "_rows"))])
    assert not restored and envs[0] is fresh[0]
    envs[0].close()


@pytest.mark.exact
def test_resume_after_the_load_file_has_gone(tiny):
    """A run started from --load keeps its weights in its own latest.pt: deleting the file it began
    from does not stop it from being continued, and the continuation is the run's own."""
    first = _run(tiny, **{"runner.total_steps": 100})
    start = Path(tiny["runner.run_root"]) / "start.pt"
    start.write_bytes((first.run_dir / "latest.pt").read_bytes())
    half = _run(tiny, load=str(start), **{"runner.total_steps": 100, "runner.save_interval": 100})
    full = _run(tiny, load=str(start), **{"runner.total_steps": 200})
    start.unlink()
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 200})
    assert resumed.steps == 200
    a = torch.load(full.run_dir / "latest.pt", weights_only=False)["groups"]["agents"]["modules"]
    b = torch.load(half.run_dir / "latest.pt", weights_only=False)["groups"]["agents"]["modules"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_resume_in_train_mode_turns_a_benchmark_into_training(tiny):
    settings = {**tiny, "runner.total_steps": 40, "runner.save_interval": 40, "runner.eval_interval": 20}
    half = marlkit.run(agent="MAPPO", env="mpe_spread", mode="benchmark", seed=2, **settings)
    report = (half.run_dir / "benchmark.json").read_text()
    resumed = marlkit.run(mode="train", resume=str(half.run_dir), **{"runner.total_steps": 80})
    assert resumed.mode == "train" and resumed.steps == 80
    assert [e["step"] for e in resumed.evaluations] == [0, 20, 40]          # no evaluation after the switch
    assert (half.run_dir / "benchmark.json").read_text() == report
    with pytest.raises(ConfigError, match="--resume .* continues training; to test the run pass --test --load"):
        marlkit.run(mode="test", resume=str(half.run_dir), **{"runner.total_steps": 120})
