"""A run is never lost or bricked: resume is validated before anything is written, an interrupt saves
a checkpoint, imports travel with the run, and an env is only restored exactly when it round-trips."""
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from gymnasium import spaces
from pettingzoo import ParallelEnv

import marlkit
from conftest import best_by_the_rule
from forked_cli import run_marlkit
from marlkit.config import ConfigError
from marlkit.runners.checkpoint import read_steps

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TINY = ["runner.parallels=2", "runner.horizon=25", "runner.progress=false", "runner.eval_episodes=2",
        "runner.eval_parallels=2", "runner.log_interval=50"]


def cli_env(**extra):
    path = os.pathsep.join([os.path.dirname(__file__), str(EXAMPLES)])
    return {**os.environ, "SDL_VIDEODRIVER": "dummy", "PYTHONPATH": path, **extra}


def cli(*args, timeout=300, **env):
    return run_marlkit(args, cli_env(**env), timeout=timeout)


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("config.yaml"))


def snapshot(run: Path) -> dict:
    """Every file of a run directory with its bytes, to show that a refused command wrote nothing."""
    return {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}


# -- a toy env whose state lives outside Python (as in a C engine or a game process) ------------------

_ENGINES: dict[int, dict] = {}


class OutsideStateEnv(ParallelEnv):
    """Two agents; the step counter of the episode is kept twice, on the Python side and in an
    'engine' that pickling cannot capture. Should the two ever disagree the env raises, which is what
    continuing a desynchronised env would silently do to a real engine."""

    metadata = {"name": "outside_state_v0"}

    def __init__(self, length=7):
        self.length = length
        self.possible_agents = ["a_0", "a_1"]
        self.agents = []
        self.t = 0

    @property
    def engine(self) -> dict:
        return _ENGINES.setdefault(id(self), {"t": 0})

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def _obs(self):
        return {a: np.array([self.engine["t"] / self.length, i], np.float32) for i, a in enumerate(self.agents)}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.t = self.engine["t"] = 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        if self.engine["t"] != self.t:
            raise RuntimeError(f"desynchronised: python step {self.t}, engine step {self.engine['t']}")
        self.t += 1
        self.engine["t"] += 1
        end = self.t >= self.length
        obs = self._obs()
        rewards = {a: float(actions[a]) for a in self.agents}
        done = {a: end for a in self.agents}
        infos = {a: {} for a in self.agents}
        if end:
            self.agents = []
        return obs, rewards, done, {a: False for a in done}, infos


def outside_state(**kwargs):
    return OutsideStateEnv(**kwargs)


# -- --set env.* ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_set_env_keys_work_from_the_cli(tmp_path):
    root = tmp_path / "runs"
    out = cli("--set", f"runner.run_root={root}", "runner.total_steps=50", "env.kwargs.N=2",
              "env.max_episode_steps=10", *TINY)
    assert out.returncode == 0, out.stderr
    [run] = run_dirs(root)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["env"]["kwargs"]["N"] == 2 and saved["env"]["max_episode_steps"] == 10
    # the env really had 2 agents: the checkpoint's group spec says so
    import torch
    group = torch.load(run / "latest.pt", weights_only=False)["groups"]["agents"]["group"]
    assert group["agents"] == ["agent_0", "agent_1"]


# -- resume is validated before anything is written ----------------------------------------------------

@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A short run stopped at 100 of 200 env steps (latest.pt holds step 100)."""
    root = tmp_path_factory.mktemp("saved") / "runs"
    out = cli("--set", f"runner.run_root={root}", "runner.total_steps=100", "runner.save_interval=50", *TINY)
    assert out.returncode == 0, out.stderr
    [run] = run_dirs(root)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["runner"]["total_steps"] = 200
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    return run


@pytest.mark.slow
@pytest.mark.parametrize("change,key,saved_value", [
    ("runner.parallels=8", "runner.parallels", "2"),
    ("runner.horizon=10", "runner.horizon", "25"),
    ("env.kwargs.N=4", "env.kwargs.N", "3"),
    ("seed=5", "seed", "1"),
])
def test_resume_with_a_frozen_setting_changed_is_refused_and_the_run_stays_intact(saved_run, change, key,
                                                                                   saved_value):
    before = snapshot(saved_run)
    out = cli("--resume", str(saved_run), "--set", change)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    [line] = [line for line in out.stderr.splitlines() if line.strip()]
    assert f"--resume: {key} cannot change when a run is continued (the run was saved with {key}=" in line
    assert saved_value in line and "drop that --set" in line
    assert snapshot(saved_run) == before


@pytest.mark.slow
def test_a_refused_resume_leaves_the_run_resumable(saved_run, tmp_path):
    import shutil
    run = tmp_path / saved_run.name
    shutil.copytree(saved_run, run)
    assert cli("--resume", str(run), "--set", "runner.parallels=8").returncode == 2
    out = cli("--resume", str(run))
    assert out.returncode == 0, out.stderr
    assert read_steps(run / "latest.pt") == 200


def test_resume_without_latest_checkpoint_fails_before_any_env_starts(saved_run, tmp_path):
    run = tmp_path / "no_checkpoint"
    run.mkdir()
    (run / "config.yaml").write_text((saved_run / "config.yaml").read_text())
    start = time.monotonic()
    with pytest.raises(FileNotFoundError, match="saved no latest.pt .* nothing to continue; start a new run"):
        marlkit.run(resume=str(run))
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]
    assert time.monotonic() - start < 5


@pytest.mark.slow
def test_resume_of_a_finished_run_says_so_and_how_to_extend_it(saved_run, tmp_path):
    import shutil
    run = tmp_path / saved_run.name
    shutil.copytree(saved_run, run)
    assert cli("--resume", str(run)).returncode == 0
    before = snapshot(run)
    out = cli("--resume", str(run))
    assert out.returncode == 2
    assert "is finished (200 of 200 env steps)" in out.stderr and "--set runner.total_steps=400" in out.stderr
    assert snapshot(run) == before      # in particular no new, empty events file
    out = cli("--resume", str(run), "--set", "runner.total_steps=250")
    assert out.returncode == 0, out.stderr
    assert read_steps(run / "latest.pt") == 250


def test_a_run_that_fails_before_its_first_step_leaves_no_directory(tmp_path, env_yaml):
    root = tmp_path / "runs"
    path = env_yaml("toy_envs:scripted", {"no_such_option": 1})
    out = cli("--env", path, "--set", f"runner.run_root={root}", "runner.total_steps=50", *TINY)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert not root.exists() or not any(root.rglob("*"))


@pytest.mark.slow
def test_a_run_whose_env_breaks_at_its_first_step_leaves_no_directory(tmp_path, env_yaml):
    """The worker's traceback, with no run directory to hold it, goes to a temp file the error names
    (here in the test's own folder)."""
    root = tmp_path / "runs"
    path = env_yaml("toy_envs:broken", {"how": "missing_obs", "break_at": 1})
    out = cli("--env", path, "--set", f"runner.run_root={root}", "runner.total_steps=50", *TINY,
              TMPDIR=str(tmp_path))
    assert out.returncode == 1 and "EnvAPIError" in out.stderr and "agent_1" in out.stderr
    assert not root.exists() or not any(root.rglob("*"))
    [log] = tmp_path.glob("marlkit-error-*.log")
    assert f"the worker's traceback is in {log}" in out.stderr


def test_a_missing_logger_package_is_a_one_line_error_and_leaves_no_directory(tmp_path):
    """wandb is installed here; a stand-in package that fails to import, first on the path, plays a
    machine without it."""
    fake = tmp_path / "no_wandb" / "wandb"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named wandb')\n")
    root = tmp_path / "runs"
    out = cli("--logger", "wandb", "--set", f"runner.run_root={root}", "runner.total_steps=50", *TINY,
              PYTHONPATH=os.pathsep.join([str(fake.parent), cli_env()["PYTHONPATH"]]))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "pip install 'marlkit[wandb]'" in out.stderr
    assert not root.exists() or not any(root.rglob("*"))


# -- an interrupt saves a consistent checkpoint ----------------------------------------------------------

def _ignore_sigint_in_a_session_of_its_own():
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def interrupted(args: list[str], root: Path, started: str, sig=signal.SIGINT, after: float = 2.0,
                again_after: float | None = None, files: int = 1, group: bool = False):
    """Run ``marlkit args`` and send ``sig`` ``after`` seconds past the moment ``files`` files matching
    ``started`` are under ``root`` (and once more ``again_after`` seconds later) -> (exit code,
    stderr, seconds from the first signal to the exit). marlkit starts with SIGINT ignored, as a
    non-interactive shell starts a background job (a script's ``&``, CI under make): it must stop on
    the signal all the same. ``group``: marlkit leads a process group of its own (``setsid``), and
    the signal goes to the whole group with ``os.killpg``, as ``timeout``, Slurm, systemd and a
    terminal send theirs."""
    # faulthandler: a process that does not stop is made to print every thread's stack (SIGABRT)
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "marlkit", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(),
                            preexec_fn=_ignore_sigint_in_a_session_of_its_own if group else
                            lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))

    def send(signum):
        if group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)

    try:
        deadline = time.monotonic() + 120
        while len(list(root.rglob(started))) < files and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(after)
        send(sig)
        signalled = time.monotonic()
        if again_after is not None:
            time.sleep(again_after)
            send(sig)
        try:
            _, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            send(signal.SIGABRT)
            _, stderr = proc.communicate(timeout=30)
            pytest.fail(f"marlkit did not stop within 60 s of signal {sig}; its stacks:\n{stderr[-6000:]}")
        return proc.returncode, stderr, time.monotonic() - signalled
    finally:
        if proc.poll() is None:   # a failed wait must not leave the training behind
            proc.kill()
            proc.communicate()
        if group:
            _wait_group_gone(proc.pid)


def _wait_group_gone(pgid: int, timeout: float = 30.0) -> None:
    """Every process of the group has exited (env workers included)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)
    pytest.fail(f"processes of group {pgid} outlived marlkit by {timeout:g} s")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("to", ["marlkit", "group"])
def test_interrupt_saves_latest_checkpoint_and_says_how_to_resume(tmp_path, sig, to):
    """To marlkit alone or to its whole process group, env workers included (subprocess workers):
    the same stop, message and exit code."""
    root = tmp_path / "runs"
    code, stderr, _ = interrupted(["--set", f"runner.run_root={root}", "runner.total_steps=100000000",
                                   "runner.save_interval=100000000", "runner.vectorize=subprocess", *TINY],
                                  root, "config.yaml", sig, group=to == "group")   # some rollouts in
    assert code == 130, stderr
    [run] = run_dirs(root)
    latest = run / "latest.pt"
    steps = read_steps(latest)
    assert steps > 0 and steps % 50 == 0          # a rollout boundary: 2 envs x horizon 25
    assert f"interrupted; saved {latest} (step {steps} of 100000000); continue with: marlkit --resume {run}" \
        in stderr
    assert "Traceback" not in stderr
    assert not list(run.glob("*.tmp*"))
    # a stop at a rollout boundary with every env worker still there: the envs are saved too
    assert torch.load(latest, weights_only=False)["venv"] is not None
    out = cli("--resume", str(run), "--set", f"runner.total_steps={steps + 50}")
    assert out.returncode == 0, out.stderr
    assert read_steps(latest) == steps + 50


@pytest.mark.slow
def test_ctrl_c_during_test_episodes_says_so_and_leaves_no_test_directory(tmp_path):
    root = tmp_path / "runs"
    out = cli("--set", f"runner.run_root={root}", "runner.total_steps=50", "runner.save_interval=50", *TINY)
    assert out.returncode == 0, out.stderr
    [run] = run_dirs(root)
    code, stderr, _ = interrupted(["--test", "--load", str(run / "latest.pt"), "--set", "runner.test_episodes=100000000",
                                *TINY], root, "*_test/config.yaml", after=1.0)   # some episodes in
    assert code == 130, stderr
    assert "interrupted during the 100000000 test episodes" in stderr and "Traceback" not in stderr
    assert run_dirs(root) == [run]      # the test's own directory is gone, the run is untouched


# -- imports travel with the run ---------------------------------------------------------------------------

@pytest.mark.slow
def test_imported_agent_is_recorded_and_reimported_on_resume_and_test(tmp_path):
    root = tmp_path / "runs"
    out = cli("--import", "custom_agent", "--agent", "MAPPO_ENT_DECAY", "--set", f"runner.run_root={root}",
              "runner.total_steps=50", "runner.save_interval=50", *TINY)
    assert out.returncode == 0, out.stderr
    [run] = run_dirs(root)
    assert yaml.safe_load((run / "config.yaml").read_text())["imports"] == ["custom_agent"]
    out = cli("--resume", str(run), "--set", "runner.total_steps=100")
    assert out.returncode == 0, out.stderr
    assert read_steps(run / "latest.pt") == 100
    out = cli("--test", "--load", str(run / "latest.pt"), "--set", f"runner.run_root={root}",
              "runner.test_episodes=2", *TINY)
    assert out.returncode == 0, out.stderr
    assert "return" in out.stdout
    out = cli("--agent", "MAPPO_ENT_DECAY", "--set", f"runner.run_root={root}", *TINY)
    assert out.returncode == 2 and "pass --import <module>" in out.stderr


# -- exact resume only for envs that round-trip -------------------------------------------------------------

def test_env_with_state_outside_python_resumes_with_fresh_episodes(tiny, env_yaml, capsys):
    path = env_yaml("test_run_safety:outside_state", {"length": 7})
    common = {**tiny, "runner.parallels": 2, "runner.horizon": 10, "runner.save_interval": 40}
    half = marlkit.run(agent="MAPPO", env=path, seed=2, **{**common, "runner.total_steps": 40})
    capsys.readouterr()
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 100})
    assert resumed.steps == 100
    assert "starts fresh episodes" in capsys.readouterr().out    # and the env never raised: in sync

    # Declaring such an env exact would restore the Python side over a fresh engine: the very
    # desynchronisation the default avoids.
    exact = env_yaml("test_run_safety:outside_state", {"length": 7}, name="exact.yaml", env={"exact_resume": True})
    half = marlkit.run(agent="MAPPO", env=exact, seed=2, **{**common, "runner.total_steps": 40})
    with pytest.raises(Exception, match="desynchronised"):
        marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 100})


@pytest.mark.exact
def test_mpe_tag_resumes_exactly_with_two_groups(tiny):
    common = {**tiny, "runner.parallels": 2, "runner.horizon": 25, "runner.eval_interval": 10 ** 9}
    full = marlkit.run(agent="MAPPO", env="mpe_tag", seed=3, **{**common, "runner.total_steps": 300})
    half = marlkit.run(agent="MAPPO", env="mpe_tag", seed=3, **{**common, "runner.total_steps": 150,
                                                                "runner.save_interval": 150})
    resumed = marlkit.run(resume=str(half.run_dir), **{"runner.total_steps": 300})
    assert resumed.episode_returns == full.episode_returns
    for key, value in full.metrics.items():
        if not key.startswith("perf/"):
            assert resumed.metrics[key] == value, key


# -- say what happens ------------------------------------------------------------------------------------------

def test_yaml_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("runner:\n  parallels: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml") as err:
        marlkit.run(config=[str(bad)])
    assert "<unicode string>" not in str(err.value)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("runner:\n  paralels: 4\n")
    with pytest.raises(ConfigError, match=r"unknown\.yaml.*unknown key 'runner\.paralels' \(did you mean 'parallels'\?\)"):
        marlkit.run(config=[str(unknown)])


def test_best_metric_names_a_group_or_a_team(tiny):
    with pytest.raises(ConfigError, match=r"runner.best_metric: 'good' is not a group or team of this env; "
                                          r"choose one of adversary, agent, or null for the mean"):
        marlkit.run(agent="MAPPO", env="mpe_tag", **{**tiny, "runner.best_metric": "good"})


@pytest.mark.slow
def test_wandb_offline_says_where_the_run_is_and_how_to_sync(tmp_path):
    root = tmp_path / "runs"
    out = cli("--logger", "wandb", "--set", f"runner.run_root={root}", "runner.total_steps=50", *TINY,
              WANDB_MODE="offline", WANDB_SILENT="true")
    assert out.returncode == 0, out.stderr
    [line] = [line for line in out.stdout.splitlines() if line.startswith("wandb: logging offline")]
    assert "(WANDB_MODE=offline)" in line
    where = line.split("wandb sync ")[1].strip()
    assert Path(where).is_dir() and Path(where).is_relative_to(root)


@pytest.mark.slow
def test_progress_bar_keeps_its_total_when_budget_is_not_whole_rollouts(tmp_path):
    root = tmp_path / "runs"
    args = [a for a in TINY if not a.startswith("runner.progress")]
    out = cli("--set", f"runner.run_root={root}", "runner.total_steps=60", "runner.progress=true", *args)
    assert out.returncode == 0, out.stderr
    assert "100/100" in out.stderr       # two rollouts of 2 envs x 25 steps, the bar's total kept
    # not a terminal: one line per log_interval, figures labelled by group
    assert re.search(r"return/agents -?\d+\.\d\d\n", out.stderr), out.stderr


def test_cross_env_checkpoint_errors_name_the_fix(tiny, env_yaml):
    run = marlkit.run(agent="MAPPO", env="mpe_spread", seed=4, **{**tiny, "runner.total_steps": 40})
    ckpt = str(run.run_dir / "latest.pt")
    other = env_yaml("toy_envs:scripted")
    with pytest.raises(Exception, match=r"pass --env mpe_spread \(or the YAML file it was trained with"):
        marlkit.run(agent="MAPPO", env=other, mode="test", load=ckpt, **tiny)
    with pytest.raises(Exception, match=r"use the env settings it was trained with \(config.yaml beside"):
        marlkit.run(agent="MAPPO", env="mpe_spread", mode="test", load=ckpt, **{**tiny, "env.kwargs.N": 4})


@pytest.mark.parametrize("best_metric", ["predator", "prey"])
def test_best_checkpoint_is_chosen_on_the_configured_group(tiny, env_yaml, best_metric):
    path = env_yaml("toy_envs:two_team", {"length": 8})
    run = marlkit.run(agent="MAPPO", env=path, mode="benchmark", seed=1,
                      **{**tiny, "runner.total_steps": 200, "runner.eval_interval": 40,
                         "runner.best_metric": best_metric})
    evals = run.evaluations
    report = __import__("json").loads((run.run_dir / "benchmark.json").read_text())
    # both groups learn: the named one's return against the random policy playing the other
    assert all(set(row["vs_random"]) == {"predator", "prey"} for row in evals)
    assert all(row["score"] == row["vs_random"][best_metric]["mean"] for row in evals)
    assert report["best"]["step"] == best_by_the_rule(evals)["step"]
    assert report["best_metric"] == (f"return of group {best_metric!r} against the random policy playing the "
                                     "other teams")


def test_help_and_list_do_not_import_torch():
    code = ("import sys, runpy; sys.argv = ['marlkit', '{flag}']\n"
            "try:\n    runpy.run_module('marlkit', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)")
    for flag in ("--help", "--list"):
        out = subprocess.run([sys.executable, "-c", code.format(flag=flag)], capture_output=True, text=True,
                             env=cli_env(), timeout=60)
        assert out.stdout.strip().splitlines()[-1] == "False", (flag, out.stdout[-500:], out.stderr[-500:])


@pytest.mark.slow
def test_a_checkpoint_of_a_user_yaml_env_is_tested_without_repeating_the_env(tmp_path, env_yaml):
    root = tmp_path / "runs"
    path = env_yaml("toy_envs:two_team", {"length": 8}, name="my_teams.yaml")
    out = cli("--env", path, "--set", f"runner.run_root={root}", "runner.total_steps=50", *TINY)
    assert out.returncode == 0, out.stderr
    [run] = run_dirs(root)
    os.remove(path)      # the run's config.yaml holds the env; the YAML it came from is not needed
    out = cli("--test", "--load", str(run / "latest.pt"), "--set", "runner.test_episodes=2")
    assert out.returncode == 0, out.stderr
    assert "over 2 episodes" in out.stdout and "predator" in out.stdout and "prey" in out.stdout


# -- a stop during a long update, and a run stopped by its env ------------------------------------------

# 20,000 epochs: one update of the tiny rollout takes a minute or more here, each minibatch a few ms
SLOW_UPDATE = ["agents.MAPPO.epochs=20000", "runner.save_interval=50"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("vectorize", ["sync", "subprocess"])
def test_a_stop_during_an_update_ends_it_at_a_minibatch_and_saves_within_seconds(tmp_path, sig, vectorize):
    """sync: collection and update take turns; subprocess: the next rollout is collected beside
    the update (overlap), and the checkpoint holds it."""
    root = tmp_path / "runs"
    code, stderr, took = interrupted(["--set", f"runner.run_root={root}", "runner.total_steps=100000000",
                                      f"runner.vectorize={vectorize}", *TINY, *SLOW_UPDATE], root, "config.yaml",
                                     sig, after=3.0)
    assert code == 130, stderr
    assert took < 10, f"{took:.1f} s from SIGTERM to exit"
    [run] = run_dirs(root)
    latest = run / "latest.pt"
    assert read_steps(latest) == 50                 # the rollout whose update was cut short counts
    assert f"interrupted; saved {latest} (step 50 of 100000000)" in stderr
    state = pickle.loads(torch.load(latest, weights_only=False)["runner"])
    assert bool(state["pending"]) == (vectorize == "subprocess")



@pytest.mark.slow
def test_a_second_signal_exits_at_once_and_keeps_the_last_checkpoint_whole(tmp_path, env_yaml):
    """The env hangs at its 60th step, inside the third rollout, so the first signal's stop at the end
    of the rollout never comes; the second one ends the run there and then."""
    root = tmp_path / "runs"
    path = env_yaml("toy_envs:crashing", {"mode": "hang", "at": 60})
    code, stderr, took = interrupted(["--env", path, "--set", f"runner.run_root={root}", "runner.vectorize=sync",
                                      "runner.total_steps=100000000", "runner.save_interval=50", *TINY],
                                     root, "latest.pt", signal.SIGINT, after=3.0, again_after=0.5)
    assert code == 130 and took < 10, stderr
    [run] = run_dirs(root)
    latest = run / "latest.pt"
    assert read_steps(latest) == 100
    assert f"interrupted; the last checkpoint is {latest} (step 100 of 100000000)" in stderr
    assert not list(run.glob("*.tmp*"))


@pytest.mark.slow
@pytest.mark.parametrize("vectorize", ["sync", "subprocess"])
def test_a_run_stopped_by_its_env_saves_the_last_rollout_and_says_how_to_resume(tmp_path, env_yaml, vectorize):
    """The env breaks its API at its 60th step (sync: an EnvAPIError; subprocess: its worker dies),
    in the third rollout of 2 envs x 25 steps: the two finished rollouts are kept."""
    root = tmp_path / "runs"
    path = (env_yaml("toy_envs:broken", {"how": "missing_obs", "break_at": 60}) if vectorize == "sync"
            else env_yaml("toy_envs:crashing", {"mode": "exit", "at": 60}))
    out = cli("--env", path, "--set", f"runner.run_root={root}", "runner.total_steps=100000",
              "runner.save_interval=100000", f"runner.vectorize={vectorize}", *TINY)
    assert out.returncode == 1, out.stderr
    [run] = run_dirs(root)
    latest = run / "latest.pt"
    assert read_steps(latest) == 100
    assert f"the run up to step 100 is saved in {latest}" in out.stderr
    assert f"continue with: marlkit --resume {run}" in out.stderr
    out = cli("--resume", str(run), "--set", "runner.total_steps=150")
    assert out.returncode == 0, out.stderr
    assert "starts fresh episodes" in out.stdout + out.stderr
    assert read_steps(latest) == 150


@pytest.mark.slow
def test_a_run_that_cannot_fit_in_memory_is_refused_in_one_line_before_it_starts(tmp_path, env_yaml):
    """3 agents x 200,000 float32 values x 1,000 steps x 32 envs: about 72 GB of rollout alone."""
    root = tmp_path / "runs"
    path = env_yaml("toy_envs:scripted", {"obs_dim": 200_000})
    out = cli("--env", path, "--set", f"runner.run_root={root}", "runner.parallels=32", "runner.horizon=1000",
              "runner.progress=false")
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("marlkit: error: this run needs about ") and "GB of memory is available" in line
    for setting in ("runner.parallels", "runner.horizon", "agents.MAPPO.minibatches"):
        assert setting in line
    assert not root.exists() or not any(root.rglob("*"))


def test_the_memory_estimate_follows_the_rollout_and_the_minibatch():
    from marlkit.config import resolve
    from marlkit.envs.factory import make_env_vector
    from marlkit.memory import check_fits
    from marlkit.registry import get_agent
    cfg = resolve("MAPPO", "mpe_spread")
    venv = make_env_vector(cfg.env, cfg.runner, 2)
    try:
        spec = venv.spec
    finally:
        venv.close()
    from dataclasses import replace

    from marlkit.storage import StorageLayout
    mappo = get_agent("MAPPO")
    group = spec.groups["agents"]
    layout = StorageLayout(group, spec, 16, 25)
    small = mappo.memory_estimate(layout, cfg.agents["MAPPO"])
    big = mappo.memory_estimate(StorageLayout(group, spec, 32, 100), cfg.agents["MAPPO"])
    assert big.rollout == 8 * small.rollout
    obs, state = 18, 54                      # float32 values per agent and per env step
    assert small.rollout >= 16 * 25 * (3 * obs + state) * 4
    # collected while the last is trained on (runner.overlap): two rollouts
    double = mappo.memory_estimate(replace(layout, double=True), cfg.agents["MAPPO"])
    assert double.rollout == 2 * small.rollout and "runner.overlap: false" in double.shrink
    split = mappo.memory_estimate(layout, replace_minibatches(cfg.agents["MAPPO"], 4))
    assert split.update < small.update and split.rollout == small.rollout
    check_fits({"agents": small}, available=10 * small.total)
    with pytest.raises(ConfigError, match="runner.parallels"):
        check_fits({"agents": small}, available=small.total)
    # a critic that pools the observations stores no state; IPPO never does
    pooled = mappo.memory_estimate(replace(layout, env=replace(spec, state_from_obs=True)),
                                   replace(cfg.agents["MAPPO"], critic_input="auto"))
    assert small.rollout - pooled.rollout == 16 * 25 * state * 4
    ippo = get_agent("IPPO").memory_estimate(layout, cfg.agents["MAPPO"])
    assert ippo.rollout == pooled.rollout


def replace_minibatches(agent_cfg, n):
    from dataclasses import replace
    return replace(agent_cfg, minibatches=n)


SCRIPT = """
import marlkit
{indent}marlkit.run(agent="MAPPO", env="mpe_spread", logger="none", **{{"runner.vectorize": "subprocess",
{indent}    "runner.parallels": 2, "runner.horizon": 25, "runner.total_steps": 100, "runner.progress": False,
{indent}    "runner.start_method": {start!r}, "runner.run_root": {root!r}}})
"""


@pytest.mark.slow
@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_without_a_main_guard_gets_one_line_saying_what_to_add(tmp_path, guarded):
    """Spawned worker processes start by importing the main script again (the start method of
    macOS, Windows and of a Linux process that runs other threads): unguarded, marlkit refuses
    before starting any, instead of a RuntimeError from every worker."""
    body = SCRIPT.format(indent="    " if guarded else "", root=str(tmp_path / "runs"), start="spawn")
    if guarded:
        body = body.replace("import marlkit\n", "import marlkit\nif __name__ == \"__main__\":\n")
    script = tmp_path / "train.py"
    script.write_text(body)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=cli_env(), timeout=300)
    if guarded:
        assert out.returncode == 0, out.stderr
        assert run_dirs(tmp_path / "runs")
        return
    assert out.returncode == 1
    assert "bootstrapping phase" not in out.stderr and out.stderr.count("Traceback") == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"marlkit.errors.ConfigError: {script}, line 3, starts marlkit at the top level")
    assert 'put the code that runs marlkit under `if __name__ == "__main__":`' in last
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux alone")
def test_a_script_without_a_main_guard_runs_where_workers_are_forked(tmp_path):
    """On Linux, in a process with no other thread, workers are forked (``runner.start_method:
    auto``): they import nothing again, so the script needs no guard."""
    body = SCRIPT.format(indent="", root=str(tmp_path / "runs"), start="auto")
    script = tmp_path / "train.py"
    script.write_text(body)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=cli_env(), timeout=300)
    assert out.returncode == 0, out.stderr
    [run] = run_dirs(tmp_path / "runs")
    assert (run / "latest.pt").is_file()


def test_a_script_read_from_standard_input_is_refused_before_any_worker_starts(tmp_path):
    """Spawned workers cannot import a main script that is no file (``python - < train.py``): one
    line saying so, not a worker dying while it creates the env."""
    body = SCRIPT.format(indent="    ", root=str(tmp_path / "runs"), start="spawn")
    body = body.replace("import marlkit\n", "import marlkit\nif __name__ == \"__main__\":\n")
    out = subprocess.run([sys.executable, "-"], input=body, capture_output=True, text=True, env=cli_env(), timeout=300)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("marlkit.errors.ConfigError: the main script is <stdin> (read from standard input, not a "
                           "file)"), out.stderr
    assert "save the script to a file and run that, or set runner.vectorize: sync" in last
    assert "EnvWorkerError" not in out.stderr and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_an_env_error_in_a_worker_is_one_line_and_its_traceback_goes_to_the_run_directory(tmp_path, env_yaml):
    root = tmp_path / "runs"
    path = env_yaml("toy_envs:broken", {"how": "missing_obs", "break_at": 60})
    out = cli("--env", path, "--set", f"runner.run_root={root}", "runner.total_steps=100000",
              "runner.vectorize=subprocess", *TINY)
    assert out.returncode == 1, out.stderr
    [line] = out.stderr.strip().splitlines()
    [run] = run_dirs(root)
    assert line.startswith("marlkit: EnvWorkerError: env ") and "the env returned no observation for agent 'agent_1'" in line
    assert line.endswith(f"the worker's traceback is in {run / 'error.log'}")
    log = (run / "error.log").read_text()
    assert "worker traceback:\nTraceback (most recent call last):" in log and "in _observe" in log


def test_an_env_that_fails_to_start_in_a_worker_is_one_line_and_leaves_no_run(tmp_path, env_yaml):
    root = tmp_path / "runs"
    path = env_yaml("toy_envs:crashing", {"mode": "raise_on_create"})
    out = cli("--env", path, "--set", f"runner.run_root={root}", "runner.vectorize=subprocess", *TINY)
    assert out.returncode == 1, out.stderr
    [line] = out.stderr.strip().splitlines()
    assert "raised while creating the env: RuntimeError: no engine here" in line
    where = Path(line.rsplit("the worker's traceback is in ", 1)[1])
    assert "no engine here" in where.read_text()
    where.unlink()
    assert not root.exists() or not any(root.rglob("*"))
