"""The ``marlkit`` command end to end on a tiny budget, and its error messages."""
import json
import os
import sys

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import best_by_the_rule
from forked_cli import run_marlkit
from marlkit.precision import update_precision

TINY = ["runner.parallels=2", "runner.horizon=25", "runner.progress=false", "runner.eval_episodes=4",
        "runner.eval_parallels=2", "runner.eval_interval=100", "runner.log_interval=50"]


def cli(*args, cwd=None, timeout=300):
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy", "PYTHONPATH": os.path.dirname(__file__)}
    return run_marlkit(args, env, cwd, timeout)


def only_run_dir(root, agent="MAPPO", suffix=""):
    runs = sorted((root / "mpe_spread" / agent).glob(f"*_seed*{suffix}"))
    return [r for r in runs if r.name.endswith(suffix) and (suffix or not r.name.endswith("_test"))]


@pytest.mark.slow
def test_train_benchmark_test_end_to_end(tmp_path):
    root = tmp_path / "runs"
    out = cli("--agent", "MAPPO", "--env", "mpe_spread", "--seed", "3", "--set", f"runner.run_root={root}",
              "runner.total_steps=300", *TINY)
    assert out.returncode == 0, out.stderr
    [run] = only_run_dir(root)
    assert run.name.endswith("_seed3")
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["runner"]["total_steps"] == 300 and saved["seed"] == 3 and saved["agent"] == "MAPPO"
    assert saved["agents"]["MAPPO"]["lr"] == pytest.approx(7e-4)
    assert (run / "latest.pt").is_file()
    events = EventAccumulator(str(run))
    events.Reload()
    returns = events.Scalars("agents/episode_return")
    assert [e.step for e in returns] == sorted(e.step for e in returns) and returns[-1].step == 300
    assert all(-200 < e.value < 0 for e in returns)          # mpe_spread rewards are negative distances
    assert "agents/policy_loss" in events.Tags()["scalars"]

    bench = cli("--agent", "IPPO", "--env", "mpe_spread", "--benchmark", "--set", f"runner.run_root={root}",
                "runner.total_steps=300", "agents.IPPO.precision=auto", *TINY)
    assert bench.returncode == 0, bench.stderr
    [brun] = only_run_dir(root, "IPPO")
    report = json.loads((brun / "benchmark.json").read_text())
    # what the speed was measured with: auto as this CPU resolves it
    assert report["device"] == "cpu"
    assert report["precision"] == {"agents": update_precision("auto", torch.device("cpu"))}
    assert [r["step"] for r in report["evaluations"]] == [0, 100, 200, 300]
    assert report["best"] == best_by_the_rule(report["evaluations"])
    assert all(r["episodes"] == 4 and set(r["ci"]) == set(r["mean"]) for r in report["evaluations"])
    # one line per evaluation as it happens, with its interval
    assert sum(line.startswith("eval at step ") for line in bench.stdout.splitlines()) == 4
    assert "agents -" in bench.stdout and " ± " in bench.stdout
    assert (brun / "best.pt").is_file() and (brun / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "benchmark: IPPO on mpe_spread" in bench.stdout
    assert f"best.pt: step {report['best']['step']}, chosen on the mean return of the learning teams" in bench.stdout
    assert report["best_metric"] == "mean return of the learning teams"

    test = cli("--agent", "IPPO", "--env", "mpe_spread", "--test", "--load", str(brun / "best.pt"), "--set",
               f"runner.run_root={root}", "runner.test_episodes=4", *TINY)
    assert test.returncode == 0, test.stderr
    [trun] = only_run_dir(root, "IPPO", "_test")
    summary = json.loads((trun / "test.json").read_text())["groups"]["agents"]
    assert summary["episodes"] == 4 and summary["mean"] < 0 and summary["ci95"] > 0
    assert f"{summary['mean']:.3f} ± {summary['ci95']:.3f}" in test.stdout


def test_the_random_policy_is_tested_without_a_checkpoint_with_the_envs_statistics(tmp_path, env_yaml):
    """``--test --agent random`` needs no checkpoint; the env's own statistics (here its episode
    number and a sum of actions) come with their intervals, in test.json and on the console."""
    root = tmp_path / "runs"
    path = env_yaml("toy_envs:stats", {"length": 5})
    out = cli("--agent", "random", "--env", path, "--test", "--set", f"runner.run_root={root}",
              "runner.test_episodes=6", *TINY)
    assert out.returncode == 0, out.stderr
    [trun] = (root / "toy" / "random").glob("*_test")
    report = json.loads((trun / "test.json").read_text())
    assert report["checkpoint"] is None and report["agent"] == "random"
    assert report["groups"]["agents"]["episodes"] == 6
    assert set(report["env"]) == {"episode", "agent_0_actions"} and report["env"]["episode"]["episodes"] == 6
    assert "test of the random policy over 6 episodes" in out.stdout
    stat = report["env"]["agent_0_actions"]
    assert f"{stat['mean']:.3f} ± {stat['ci95']:.3f}" in out.stdout


@pytest.mark.slow
def test_render_writes_a_video(tmp_path):
    root = tmp_path / "runs"
    assert cli("--set", f"runner.run_root={root}", "runner.total_steps=50", *TINY).returncode == 0
    [run] = only_run_dir(root)
    out = cli("--test", "--render", "--load", str(run / "latest.pt"), "--set", f"runner.run_root={root}",
              "runner.test_episodes=2", *TINY)
    assert out.returncode == 0, out.stderr
    [trun] = only_run_dir(root, suffix="_test")
    videos = sorted(p.name for p in trun.glob("episode_*"))
    assert videos == ["episode_1.mp4", "episode_2.mp4"]    # imageio-ffmpeg is installed with marlkit
    import imageio.v3 as iio
    frames = iio.imread(trun / "episode_1.mp4")
    assert frames.ndim == 4 and frames.shape[1] % 2 == 0 and frames.shape[2] % 2 == 0 and len(frames) > 10
    assert "WARNING" not in out.stderr and "GIF" not in out.stderr
    out = cli("--render", "--set", f"runner.run_root={root}", *TINY)
    assert out.returncode == 2 and "--render records the test episodes of a checkpoint" in out.stderr


def test_without_the_mp4_writer_a_video_is_a_gif_and_says_why(tmp_path, monkeypatch, capsys):
    """A machine without imageio-ffmpeg: the video is a GIF, and one line says why and what to
    install. (The plugin is made unimportable here; it is installed with marlkit.)"""
    import numpy as np

    from marlkit.runners.report import write_video
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    frames = [np.full((33, 47, 3), i * 20, np.uint8) for i in range(5)]
    path = write_video(tmp_path / "episode_1", frames, fps=5)
    assert path.name == "episode_1.gif" and path.read_bytes()[:3] == b"GIF"
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["marlkit: episode_1.gif is a GIF, not an MP4: the MP4 writer, imageio-ffmpeg, is not installed "
                   "(pip install imageio-ffmpeg)"]


def test_list_shows_agents_and_envs():
    out = cli("--list")
    assert out.returncode == 0
    assert "MAPPO" in out.stdout and "IPPO" in out.stdout and "random" in out.stdout
    assert "mpe_spread" in out.stdout and "simple_spread_v3" in out.stdout
    # each agent described by one whole sentence, never cut where its docstring's line ends
    agents = out.stdout.split("envs:")[0].splitlines()[1:]
    assert len(agents) >= 8
    import marlkit.agents  # noqa: F401  (registers every shipped agent)
    from marlkit.registry import REGISTRY
    shipped = sorted(name for name, cls in REGISTRY.items() if cls.__module__.startswith("marlkit.agents."))
    assert sorted(line.split()[0] for line in agents) == shipped   # every agent marlkit registers, listed
    for line in agents:
        name, description = line.split(maxsplit=1)
        assert description.endswith("."), line
    from marlkit.registry import first_sentence
    assert first_sentence("Actor on each agent's own\n    observation; critic on ``state``,\n    encoded once. More.") == \
        "Actor on each agent's own observation; critic on ``state``, encoded once."


@pytest.mark.slow
@pytest.mark.parametrize("args,message", [
    (["--agent", "MAPOO"], "unknown agent 'MAPOO' (did you mean 'MAPPO'?); valid agents: "),
    (["--agent", "MyPPO"], "if 'MyPPO' is your own agent, pass --import <module>"),
    (["--env", "mpe_sprad"], "unknown env 'mpe_sprad' (did you mean 'mpe_spread'?)"),
    (["--set", "runner.paralels=4"], "unknown key 'runner.paralels' (did you mean 'parallels'?)"),
    (["--set", "agents.MAPPO.lr=fast"], "agents.MAPPO.lr: expected a number, got 'fast'"),
    (["--set", "runner.horizon"], "expected KEY=VALUE"),
    (["--test", "--load", "missing.pt"], "--load 'missing.pt': no such checkpoint file"),
    (["--test"], "--test needs a checkpoint: pass --load runs/<env>/<agent>/<run>/best.pt (or --agent random"),
    (["--resume", "nowhere"], "--resume 'nowhere': no config.yaml there"),
    (["--config", "missing.yaml"], "config file 'missing.yaml' does not exist"),
])
def test_bad_input_exits_2_with_a_clear_message(tmp_path, args, message):
    out = cli(*args, "--set", f"runner.run_root={tmp_path}", cwd=tmp_path) if "--set" not in args else \
        cli(*args, f"runner.run_root={tmp_path}", cwd=tmp_path)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert not list(tmp_path.rglob("*.pt"))


@pytest.mark.slow
def test_mismatched_checkpoint_and_resume_flags_are_clean_errors(tmp_path):
    root = tmp_path / "runs"
    assert cli("--set", f"runner.run_root={root}", "runner.total_steps=50", *TINY).returncode == 0
    [run] = only_run_dir(root)
    out = cli("--agent", "IPPO", "--test", "--load", str(run / "latest.pt"), "--set", f"runner.run_root={root}", *TINY)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "group 'agents' was trained by agent 'MAPPO', but this run uses 'IPPO' (pass --agent MAPPO)" in out.stderr
    out = cli("--agent", "IPPO", "--resume", str(run))
    assert out.returncode == 2 and "that run used agent 'MAPPO', not 'IPPO'" in out.stderr
    out = cli("--resume", str(run), "--config", str(run / "config.yaml"))
    assert out.returncode == 2 and "change settings with --set, not --config" in out.stderr


def test_endless_episodes_in_evaluation_are_an_error_not_a_hang(tmp_path, env_yaml):
    path = env_yaml("toy_envs:scripted", {"length": 10 ** 9})
    out = cli("--env", path, "--benchmark", "--set", f"runner.run_root={tmp_path}", "runner.total_steps=50",
              "runner.episode_step_limit=30", *TINY, timeout=120)
    assert out.returncode == 1
    assert "0 of 4 episodes ended within 60 steps per env" in out.stderr and "env.max_episode_steps" in out.stderr


def test_test_and_benchmark_together_is_refused():
    out = cli("--test", "--benchmark")
    assert out.returncode == 2 and "choose one of --test and --benchmark" in out.stderr


@pytest.mark.slow
def test_repeated_set_flags_are_all_applied(tmp_path):
    root = tmp_path / "runs"
    out = cli("--set", f"runner.run_root={root}", "--set", "runner.total_steps=50", "--set", *TINY)
    assert out.returncode == 0, out.stderr
    [run] = only_run_dir(root)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["runner"]["total_steps"] == 50 and saved["runner"]["parallels"] == 2


def test_main_run_from_python_leaves_the_garbage_collector_as_it_was(tmp_path, monkeypatch):
    """The ``marlkit`` program freezes the garbage collector as it exits (``cli.command``: the last
    collection would walk torch's objects for nothing); ``main`` run by a longer-lived process on
    its own command line does not."""
    import gc

    from marlkit.cli import main
    monkeypatch.setattr(sys, "argv", ["marlkit", "--env", "mpe_spread", "--logger", "none", "--set",
                                      f"runner.run_root={tmp_path}", "runner.total_steps=50",
                                      "runner.vectorize=sync", *TINY])
    before = gc.get_freeze_count()
    assert main() == 0
    assert gc.get_freeze_count() == before


@pytest.mark.slow
def test_print_config_round_trips(tmp_path):
    """--print-config prints the merged config without starting anything; used as --config, the same
    flags give the same config."""
    import yaml
    args = ["--agent", "QMIX", "--env", "lbf_8x8_2p_2f_coop", "--set", "runner.parallels=4",
            "agents.QMIX.lr=0.001"]
    out = cli(*args, "--print-config")
    assert out.returncode == 0, out.stderr
    printed = yaml.safe_load(out.stdout)
    assert printed["runner"]["parallels"] == 4 and printed["agents"]["QMIX"]["lr"] == 0.001
    assert printed["agents"]["QMIX"]["mixing_embed_dim"] == 32 and printed["env"]["time_limit"] == 50
    assert not (tmp_path / "runs").exists() and "run directory" not in out.stdout
    saved = tmp_path / "printed.yaml"
    saved.write_text(out.stdout)
    again = cli("--agent", "QMIX", "--env", "lbf_8x8_2p_2f_coop", "--config", str(saved), "--print-config")
    assert again.returncode == 0, again.stderr
    assert yaml.safe_load(again.stdout) == printed


@pytest.mark.slow
def test_progress_without_a_terminal_is_a_line_per_log_interval(tmp_path):
    """Captured output is no terminal: no bar redrawn with carriage returns, but one line per log
    interval, with the one rate marlkit measures."""
    out = cli("--set", f"runner.run_root={tmp_path}", "runner.total_steps=300", "runner.progress=true",
              "runner.log_interval=100", "runner.parallels=2", "runner.horizon=25", "runner.vectorize=sync")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("MAPPO@mpe_spread: ")]
    # the first update logs, then every log_interval from there, and the last
    assert [line.split(": ")[1].split(" steps")[0] for line in lines] == ["50/300", "150/300", "250/300", "300/300"]
    assert all("env-steps/s " in line and "return/agents " in line for line in lines)
    assert "\r" not in out.stderr and "step/s" not in out.stderr
