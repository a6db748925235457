"""``marlkit study``: runs land where promised, a killed study finishes on the same command with no run
trained twice, a changed config and bad input are refused before anything runs, and the report's
numbers are those of the runs' benchmark.json files, computed as rliable computes them."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import ParallelEnv

from marlkit.memory import GB
from marlkit.runners.checkpoint import read_steps
from marlkit.study import stats
from marlkit.study.command import main as study
from marlkit.study.report import fmt_cell
from marlkit.study.scheduler import Sizing, size_jobs
from marlkit.study.spec import PlannedRun

rliable = pytest.importorskip("rliable")
from rliable import library, metrics  # noqa: E402
from forked_cli import run_marlkit

TESTS = str(Path(__file__).parent)
AGENTS, SEEDS = ["MAPPO", "IPPO"], [1, 2]
TOTAL = 2000   # evaluations at 0, 1000 and 2000 env steps
PNG = b"\x89PNG\r\n\x1a\n"


def settings(root: Path) -> list[str]:
    """Small runs with a checkpoint every rollout, so that a stop always finds one to resume."""
    return [f"runner.run_root={root}", f"runner.total_steps={TOTAL}", "runner.parallels=2", "runner.horizon=10",
            "runner.eval_interval=1000", "runner.eval_episodes=8", "runner.eval_parallels=2",
            "runner.save_interval=20", "runner.log_interval=1000", "logger=none"]


def study_args(env: str, root: Path, *extra: str, seeds=SEEDS) -> list[str]:
    return ["study", "--agents", *AGENTS, "--envs", env, "--seeds", *map(str, seeds), "--name", "tiny",
            "--jobs", "2", "--set", *settings(root), *extra]


def marlkit(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return run_marlkit(args, {**os.environ, "PYTHONPATH": TESTS}, timeout=timeout)


def ledger(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "studies" / "tiny" / "jobs.jsonl").read_text().splitlines()]


def run_dirs(root: Path, env: str = "signal") -> list[Path]:
    return [root / "studies" / "tiny" / env / agent / f"seed{seed}" for agent in AGENTS for seed in SEEDS]


def interrupted_when(ready, args: list[str], environ: dict) -> tuple[subprocess.Popen, str, str]:
    """``marlkit *args`` in a session of its own, sent SIGINT to its process group (a terminal's
    Ctrl+C) once ``ready()`` (or after 300 s) -> (the process, its stdout, its stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "marlkit", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=environ, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not ready():
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc, out, err


def process_line(pid: int) -> str:
    """``pid``, its state and its command line, for a failure message."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid}: gone while read"
    return f"{pid} [{state}] {cmdline[:300]}"


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    below, frontier = [], [pid]
    while frontier:
        frontier = [p for p, pp in parent.items() if pp in frontier]
        below += frontier
    return below


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_a_study_killed_outright_leaves_no_run_behind(tmp_path):
    """SIGKILL to the study process alone: the job server it forked its runs from ends with it, and
    each run, sent SIGTERM then, saves where it stands and exits; no process of the study is left."""
    env = tmp_path / "signal.yaml"
    env.write_text("description: two agents paid for naming the signal both\n"
                   "env: {type: pettingzoo, factory: 'toy_envs:signal', kwargs: {n: 5, length: 5}}\n")
    root = tmp_path / "runs"
    args = study_args(str(env), root, "runner.total_steps=1000000", "runner.save_interval=1000000", seeds=[1])
    proc = subprocess.Popen([sys.executable, "-m", "marlkit", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": TESTS})
    logs = [root / "studies" / "tiny" / "logs" / f"signal.{agent}.seed1.log" for agent in AGENTS]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not all(log.is_file() and "steps (" in log.read_text() for log in logs):
        time.sleep(0.2)
    below = descendants(proc.pid)
    assert len(below) >= 3, "the job server and two runs"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in below):
        time.sleep(0.2)
    left = [p for p in below if Path(f"/proc/{p}").exists()]
    tails = [f"{log.name}: ...{log.read_text()[-600:] if log.is_file() else '(none)'}" for log in logs]
    assert not left, "still alive 120 s after the kill:\n" + "\n".join([process_line(p) for p in left] + tails)
    for agent, log in zip(AGENTS, logs):
        steps = read_steps(root / "studies" / "tiny" / "signal" / agent / "seed1" / "latest.pt")
        assert 0 < steps < 1_000_000
        assert f"interrupted; saved {log.parents[1] / 'signal' / agent / 'seed1' / 'latest.pt'} (step {steps} of" \
            in log.read_text()


@pytest.fixture(scope="module")
def killed_and_rerun(tmp_path_factory):
    """The study killed (SIGINT to its process group, as a terminal's Ctrl+C) once two runs are
    finished and another has a checkpoint, then the same command again. -> (root, env yaml, what
    the kill left: per run dir its benchmark.json bytes or its latest.pt steps, the outputs)."""
    tmp = tmp_path_factory.mktemp("study")
    env = tmp / "signal.yaml"
    env.write_text("description: two agents paid for naming the signal both\n"
                   "env: {type: pettingzoo, factory: 'toy_envs:signal', kwargs: {n: 5, length: 5}}\n")
    root = tmp / "runs"
    args = study_args(str(env), root)

    def ready() -> bool:
        finished = [d for d in run_dirs(root) if (d / "benchmark.json").is_file()]
        going = [d for d in run_dirs(root) if (d / "latest.pt").is_file() and d not in finished]
        return len(finished) >= 2 and bool(going)

    proc, first_out, first_err = interrupted_when(ready, args, {**os.environ, "PYTHONPATH": TESTS})
    assert proc.returncode == 130, first_err
    left = {d: (d / "benchmark.json").read_bytes() if (d / "benchmark.json").is_file() else
            read_steps(d / "latest.pt") if (d / "latest.pt").is_file() else None for d in run_dirs(root)}
    assert any(isinstance(v, int) for v in left.values()), "the kill found no run in progress"
    again = marlkit(*args)
    assert again.returncode == 0, again.stderr
    return root, env, left, (first_out, first_err), again


@pytest.mark.slow
def test_runs_land_in_fixed_directories_as_ordinary_benchmark_runs(killed_and_rerun):
    root, _, left, _, again = killed_and_rerun
    for d in run_dirs(root):
        for name in ("config.yaml", "latest.pt", "best.pt", "benchmark.json", "learning_curve.png"):
            assert (d / name).is_file(), d / name
        assert read_steps(d / "latest.pt") == TOTAL
        report = json.loads((d / "benchmark.json").read_text())
        assert (report["agent"], report["seed"]) == (d.parent.name, int(d.name[4:]))
    study_dir = root / "studies" / "tiny"
    assert json.loads((study_dir / "study.json").read_text())["seeds"] == SEEDS
    # the command run again finishes what the kill left unfinished (another run may have finished
    # between the moment the kill was decided and the kill)
    finished_before = sum(isinstance(v, bytes) for v in left.values())
    assert len(re.findall(r"^done   ", again.stdout, re.M)) == len(run_dirs(root)) - finished_before


def test_a_killed_study_finishes_on_the_same_command_with_no_run_trained_twice(killed_and_rerun):
    root, _, left, (_, first_err), again = killed_and_rerun
    assert "run the same command again to continue" in first_err
    segments = {}
    for row in ledger(root):
        segments.setdefault(row["run"], []).append(row)
    for d, before in left.items():
        key = "/".join(d.parts[-3:])
        mine = segments[key]
        if isinstance(before, bytes):   # finished before the kill: skipped, untouched
            assert (d / "benchmark.json").read_bytes() == before
            assert [(s["from_step"], s["to_step"], s["exit"]) for s in mine] == [(0, TOTAL, 0)]
            continue
        # each process went on from where the one before saved, and the steps add up to the run's
        assert mine[0]["from_step"] == 0 and mine[-1]["to_step"] == TOTAL and mine[-1]["exit"] == 0
        assert all(a["to_step"] == b["from_step"] for a, b in zip(mine, mine[1:]))
        if before:   # interrupted with a checkpoint: resumed from it, not started again
            assert mine[0]["exit"] == 130 and mine[0]["to_step"] == before
            assert mine[1]["action"] == "resume" and mine[1]["from_step"] == before
            assert f"resume {key.split('/')[1]} on signal, seed {key[-1]} from step {before:,}" in again.stdout
        evaluations = json.loads((d / "benchmark.json").read_text())["evaluations"]
        steps = [row["step"] for row in evaluations]
        assert steps == sorted(set(steps)) and steps[-1] == TOTAL   # every evaluation once


@pytest.mark.slow
def test_report_numbers_are_those_of_the_runs_benchmark_json(killed_and_rerun):
    """Recomputed here from the benchmark.json files with rliable's own bootstrap (same generator
    seed and resamples), not with the study's code."""
    root, _, _, _, _ = killed_and_rerun
    text = (root / "studies" / "tiny" / "report.md").read_text()
    settings = next(line for line in text.splitlines() if line.startswith("Settings of every run"))
    assert f"runner.total_steps={TOTAL}" in settings and "run_root" not in settings and str(root) not in text
    for agent in AGENTS:
        reports = [json.loads((root / "studies" / "tiny" / "signal" / agent / f"seed{s}" / "benchmark.json").read_text())
                   for s in SEEDS]
        cells = []
        for row in ("final", "best"):
            values = np.array([[r[row]["score"]] for r in reports])
            np.random.seed(stats.SEED)
            point, ci = library.get_interval_estimates({"x": values}, lambda s: np.array([metrics.aggregate_mean(s)]),
                                                       reps=stats.REPS)
            iqm = metrics.aggregate_iqm(values)
            cells.append(f"{point['x'][0]:.3f} [{ci['x'][0, 0]:.3f}, {ci['x'][1, 0]:.3f}] | {iqm:.3f}")
        assert f"| {agent} | {len(SEEDS)} | {cells[0]} | {cells[1]} |" in text
    baselines = [json.loads(p.read_text())["baseline"]["score"] for p in (root / "studies" / "tiny").rglob("benchmark.json")]
    assert f"Random policy: {np.mean(baselines):.3f}" in text


def test_report_files_are_written_and_regenerated_alone(killed_and_rerun):
    root, _, _, _, _ = killed_and_rerun
    study_dir = root / "studies" / "tiny"
    for name in ("sample_efficiency.png", "performance_profile.png", "probability_of_improvement.png"):
        assert (study_dir / name).read_bytes()[:8] == PNG, name
    rows = (study_dir / "results.csv").read_text().splitlines()
    evaluations = sum(len(json.loads(p.read_text())["evaluations"]) for p in study_dir.rglob("benchmark.json"))
    assert rows[0].startswith("agent,env,seed,step,return,return_ci,return/agents,ci/agents")
    assert len(rows) == 1 + evaluations
    before = (study_dir / "report.md").read_text()
    (study_dir / "report.md").unlink()
    out = marlkit("study", "--report", "--name", "tiny", "--set", f"runner.run_root={root}")
    assert out.returncode == 0, out.stderr
    assert (study_dir / "report.md").read_text() == before


@pytest.mark.slow
def test_a_changed_config_is_refused_naming_the_difference(killed_and_rerun):
    root, env, _, _, _ = killed_and_rerun
    out = marlkit(*study_args(str(env), root, "runner.total_steps=6000"))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"marlkit study: error: study 'tiny' in {root / 'studies' / 'tiny'} was started with "
        f"set.runner.total_steps={TOTAL}, now 6000; give it the same settings to continue it, or another --name "
        "for a new study"]
    out = marlkit(*study_args(str(env), root, seeds=[1, 3]))
    assert out.returncode == 2 and "seeds=[1, 2], now [1, 3]" in out.stderr


@pytest.mark.slow
def test_a_run_stopped_in_its_last_rollout_gets_its_report_without_training(killed_and_rerun):
    """Training done, benchmark.json missing (the stop came during the last rollout): the same
    command writes the report from the checkpoint and trains nothing."""
    root, env, _, _, _ = killed_and_rerun
    d = run_dirs(root)[0]
    before = json.loads((d / "benchmark.json").read_text())
    (d / "benchmark.json").unlink()
    out = marlkit(*study_args(str(env), root))
    assert out.returncode == 0, out.stderr
    assert ledger(root)[-1] == {**ledger(root)[-1], "run": "/".join(d.parts[-3:]), "from_step": TOTAL,
                                "to_step": TOTAL, "exit": 0}
    after = json.loads((d / "benchmark.json").read_text())
    assert after["evaluations"] == before["evaluations"] and after["final"] == before["final"]


# -- bad input ---------------------------------------------------------------------------------------

class MultiDiscreteEnv(ParallelEnv):
    """Two agents with MultiDiscrete([2, 3]) actions, which COMA cannot take."""

    metadata = {"name": "multi_discrete_v0"}
    possible_agents = ["agent_0", "agent_1"]

    def observation_space(self, agent):
        return spaces.Box(-1, 1, (3,), np.float32)

    def action_space(self, agent):
        return spaces.MultiDiscrete([2, 3])

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {a: np.zeros(3, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        raise AssertionError("a refused study steps no env")


def multi_discrete(**kwargs):
    return MultiDiscreteEnv()


def test_bad_input_is_refused_before_anything_runs_one_line_per_problem(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(TESTS)
    env = tmp_path / "multi.yaml"
    env.write_text("env: {type: pettingzoo, factory: 'test_study:multi_discrete'}\n")
    root = tmp_path / "runs"
    code = study(["--agents", "MAPO", "COMA", "QMIX", "--envs", "mpe_spred", str(env), "mpe_spread", "--seeds", "1",
                  "--set", f"runner.run_root={root}", "env.kwargs.continuous_actions=true"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert all(line.startswith("marlkit study: error: ") for line in lines)
    assert any("unknown agent 'MAPO' (did you mean 'MAPPO'?)" in line for line in lines)
    assert any("unknown env 'mpe_spred' (did you mean 'mpe_spread'?)" in line for line in lines)
    assert any(line.startswith("marlkit study: error: COMA on multi: ") and "MultiDiscrete" in line for line in lines)
    assert any(line.startswith("marlkit study: error: QMIX on multi: ") and "MultiDiscrete" in line for line in lines)
    assert any(line.startswith("marlkit study: error: COMA on mpe_spread: ") and "Box" in line for line in lines)
    assert any(line.startswith("marlkit study: error: QMIX on mpe_spread: ") and "Box" in line for line in lines)
    assert len(lines) == 6
    assert not root.exists()


def test_a_study_yaml_with_an_unknown_key_names_the_closest(tmp_path, capsys):
    path = tmp_path / "study.yaml"
    path.write_text("agents: [MAPPO]\nenvs: [mpe_spread]\nseed: [1]\n")
    assert study([str(path)]) == 2
    assert "unknown key 'seed' (did you mean 'seeds'?)" in capsys.readouterr().err


# -- sizing ------------------------------------------------------------------------------------------

def planned(memory: int, vectorize: str = "subprocess", workers: int | None = 2):
    from marlkit.api import build_config
    cfg = build_config("MAPPO", "mpe_spread", "benchmark", **{"runner.vectorize": vectorize, "runner.workers": workers})
    return PlannedRun("mpe_spread", "MAPPO", 1, Path("x"), cfg, memory)


def test_jobs_fill_the_cores_and_memory_and_never_oversubscribe_them():
    runs = [planned(GB // 4) for _ in range(12)]
    sizing = size_jobs(runs, None, cores=2, available=64 * GB)
    assert (sizing.jobs, sizing.cores) == (2, 1)
    # each job's env workers and torch threads share out the cores: jobs x workers <= cores; a job of
    # one core steps its envs in its own process, with the policy lag its env workers would give
    assert sizing.execution(runs[0]) == {"runner": {"torch_threads": 1, "vectorize": "sync", "overlap": True,
                                                    "act_in_workers": None}}
    double = planned(GB // 4)
    double.cfg.runner.double_buffer = True
    assert sizing.execution(double)["runner"]["double_buffer"] is False
    assert size_jobs([double], None, cores=16, available=64 * GB).execution(double)["runner"] == {
        "torch_threads": 1, "workers": 16}
    unlagged = planned(GB // 4)
    unlagged.cfg.runner.overlap = False
    assert sizing.execution(unlagged)["runner"]["overlap"] is False
    assert size_jobs(runs, 8, cores=16, available=64 * GB).execution(runs[0])["runner"]["workers"] == 2
    assert size_jobs(runs, None, cores=16, available=64 * GB).jobs == 12
    assert size_jobs(runs, 4, cores=16, available=64 * GB).execution(runs[0])["runner"]["workers"] == 4
    assert size_jobs(runs, None, cores=16, available=3 * GB).jobs == 3   # 0.75 GB each within 2.7 GB
    assert size_jobs(runs[:1], None, cores=16, available=64 * GB).execution(runs[0])["runner"]["workers"] == 16
    sync = planned(GB // 4, "sync", None)
    assert Sizing(2, 1).execution(sync) == {"runner": {"torch_threads": 1}}
    sync.cfg.runner.update_threads = 2   # the update's threads share out the cores too
    assert Sizing(2, 1).execution(sync) == {"runner": {"torch_threads": 1, "update_threads": 1}}
    assert Sizing(1, 4).execution(sync)["runner"]["update_threads"] == 2
    with pytest.raises(Exception, match=r"--jobs 3: this machine has 2 cores"):
        size_jobs(runs, 3, cores=2, available=64 * GB)
    with pytest.raises(Exception, match=r"--jobs 4: each run needs about 0.8 GB and 3.0 GB of memory is available, "
                                        r"room for 3; use --jobs 3"):
        size_jobs(runs, 4, cores=16, available=3 * GB)


# -- statistics --------------------------------------------------------------------------------------

@pytest.fixture
def few_reps(monkeypatch):
    """rliable's bootstrap runs a Python loop per resample: few resamples keep the comparison quick."""
    monkeypatch.setattr(stats, "REPS", 400)
    monkeypatch.setattr(stats, "CURVE_REPS", 300)


@pytest.mark.slow
def test_statistics_equal_rliables_on_a_fixed_array(few_reps):
    """The study's vectorised bootstrap draws rliable's resamples in rliable's order: points and
    intervals equal those of rliable's own functions."""
    rng = np.random.default_rng(7)
    scores = {"A": rng.normal(size=(5, 3)), "B": rng.normal(0.4, 1.0, size=(5, 3)), "C": rng.normal(size=(4, 3))}

    def aggregate(s):
        return np.array([metrics.aggregate_iqm(s), metrics.aggregate_median(s), metrics.aggregate_mean(s),
                         metrics.aggregate_optimality_gap(s)])

    np.random.seed(stats.SEED)
    points, intervals = library.get_interval_estimates(scores, aggregate, reps=400)
    ours = stats.aggregates(scores)
    for a in scores:
        for i, name in enumerate(stats.AGGREGATES):
            assert ours[a][name] == pytest.approx((points[a][i], intervals[a][0, i], intervals[a][1, i]), abs=1e-12)

    better = stats.improvement(scores)
    np.random.seed(stats.SEED)
    for x in scores:   # rliable's order of pairs, one generator throughout
        for y in scores:
            if x != y:
                p, ci = library.get_interval_estimates({"k": [scores[x], scores[y]]},
                                                       lambda a, b: np.array([metrics.probability_of_improvement(a, b)]),
                                                       reps=400)
                assert better[(x, y)] == pytest.approx((p["k"][0], ci["k"][0, 0], ci["k"][1, 0]), abs=1e-12)

    taus = np.linspace(-2, 2, 9)
    np.random.seed(stats.SEED)
    profiles, cis = library.create_performance_profile(scores, taus, reps=300)
    for a, (p, ci) in stats.profiles(scores, taus).items():
        np.testing.assert_allclose(p, profiles[a], atol=1e-12)
        np.testing.assert_allclose(ci, cis[a], atol=1e-12)

    curve = rng.normal(size=(5, 1, 6))
    np.random.seed(stats.SEED)
    p, ci = library.get_interval_estimates(
        {"x": curve}, lambda s: np.array([metrics.aggregate_iqm(s[..., t]) for t in range(s.shape[-1])]), reps=300)
    runs = [stats.RunRecord("e", "A", k, {"evaluations": [{"step": 10 * t, "score": curve[k, 0, t]} for t in range(6)]})
            for k in range(5)]
    steps, point, lo, hi = stats.curve(runs)
    assert list(steps) == [0, 10, 20, 30, 40, 50]
    np.testing.assert_allclose(np.stack([point, lo, hi]), np.stack([p["x"], *ci["x"]]), atol=1e-12)

    values = [3.0, -1.0, 2.5, 0.5, 4.0]
    np.random.seed(stats.SEED)
    p, ci = library.get_interval_estimates({"x": np.array(values)[:, None]}, lambda s: np.array([metrics.aggregate_mean(s)]),
                                           reps=400)
    assert stats.mean_interval(values) == pytest.approx((p["x"][0], ci["x"][0, 0], ci["x"][1, 0]), abs=1e-12)
    assert stats.cell(values).iqm == pytest.approx(metrics.aggregate_iqm(np.array(values)[:, None]))
    assert fmt_cell(stats.cell([1.0, 1.0])) == "1.000 [1.000, 1.000]"


def test_scores_are_normalised_between_the_random_policy_and_the_reference():
    def record(env, agent, seed, final, random):
        return stats.RunRecord(env, agent, seed, {"final": {"score": final, "env": {}}, "best": {"score": final},
                                                  "baseline": {"score": random}})

    records = [record("a", "X", 1, 10.0, 0.0), record("a", "X", 2, 20.0, 2.0), record("a", "Y", 1, 5.0, 0.0),
               record("a", "Y", 2, 7.0, 2.0), record("b", "X", 1, -5.0, -10.0), record("b", "X", 2, -5.0, -10.0),
               record("b", "Y", 1, 0.0, -10.0), record("b", "Y", 2, 0.0, -10.0)]
    table = stats.per_env(records)
    norms = stats.normalisation(table, {"b": 10.0})
    assert norms == {"a": (1.0, 15.0, "X's mean"), "b": (-10.0, 10.0, "study.yaml")}
    matrices, envs = stats.normalised_scores(records, norms)
    assert envs == ["a", "b"]
    np.testing.assert_allclose(matrices["X"], [[9 / 14, 0.25], [19 / 14, 0.25]])
    np.testing.assert_allclose(matrices["Y"], [[4 / 14, 0.5], [6 / 14, 0.5]])


# -- Ray ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_ray_backend_runs_each_run_as_a_task_and_stops_them_to_resume(tmp_path):
    """A local Ray (127.0.0.1): the runs are tasks that reserve a CPU each; the study killed while
    they train stops them through their tasks, each saves, and the same command finishes them."""
    pytest.importorskip("ray")
    env = tmp_path / "signal.yaml"
    env.write_text("env: {type: pettingzoo, factory: 'toy_envs:signal', kwargs: {n: 5, length: 5}}\n")
    root = tmp_path / "runs"
    args = ["study", "--agents", "MAPPO", "--envs", str(env), "--seeds", "1", "2", "--name", "tiny", "--backend", "ray",
            "--set", *settings(root)]
    # Ray's memory monitor has killed tasks here with most of the memory free (it reads the container's
    # accounting), which would fail the runs for a reason that is not theirs
    environ = {**os.environ, "PYTHONPATH": TESTS, "RAY_memory_monitor_refresh_ms": "0"}
    dirs = [root / "studies" / "tiny" / "signal" / "MAPPO" / f"seed{s}" for s in (1, 2)]
    proc, _, err = interrupted_when(lambda: all((d / "latest.pt").is_file() for d in dirs), args, environ)
    assert proc.returncode == 130, err
    saved = {d: read_steps(d / "latest.pt") for d in dirs}
    again = run_marlkit(args, environ, timeout=400)
    assert again.returncode == 0, again.stderr
    assert "as Ray tasks" in again.stdout
    for d in dirs:
        assert read_steps(d / "latest.pt") == TOTAL
        if saved[d] < TOTAL:
            assert f"from step {saved[d]:,}" in again.stdout
