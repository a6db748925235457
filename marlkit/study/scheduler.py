"""Running a study's runs: which are finished, to resume or to start; how many at once the machine
holds; each in a ``marlkit`` process of its own (or a Ray task that starts one), with one line per
finished run, an overall bar, and a stop that lets every run save."""
from __future__ import annotations

import ctypes
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from marlkit.errors import INTERRUPTED, ConfigError, process_exit_code
from marlkit.memory import GB, available_bytes
from marlkit.study.spec import PlannedRun, StudySpec

# what a run holds beside its agents' estimate (the interpreter, torch, the envs): an mpe_spread run's
# process is 0.29 GB resident, and a forked env worker 0.22 GB, most of it pages shared with the process
PROCESS_BYTES = GB // 2


def read_benchmark(run_dir: Path) -> dict | None:
    """A run's benchmark.json, or None where there is none or it was cut off while being written."""
    try:
        return json.loads((run_dir / "benchmark.json").read_text())
    except (OSError, ValueError):
        return None


def latest_steps(run_dir: Path) -> int:
    latest = run_dir / "latest.pt"
    if not latest.is_file():
        return 0
    from marlkit.runners.checkpoint import read_steps
    return read_steps(latest)


def run_state(run: PlannedRun) -> str:
    """``done`` (a complete benchmark.json), ``resume`` (a latest.pt to go on from) or ``start``."""
    report = read_benchmark(run.run_dir)
    if report and report.get("final") and report.get("steps", 0) >= run.cfg.runner.total_steps:
        return "done"
    return "resume" if (run.run_dir / "latest.pt").is_file() else "start"


# ---------------------------------------------------------------------- how many at once


def run_cpus(run: PlannedRun) -> int:
    """Cores a run keeps busy as configured: one per env worker process of this machine, else one
    (a run whose envs are Ray actors reserves theirs through the actors)."""
    rc = run.cfg.runner
    return (rc.workers or 1) if rc.envs_in_processes() else 1


@dataclass
class Sizing:
    """``jobs`` runs at once, each given ``cores`` cores for its env workers and torch's threads;
    ``cores`` None (Ray): each run keeps the workers it is configured with (one where that is
    null), and its task reserves as many CPUs."""

    jobs: int
    cores: int | None = None

    def cpus(self, run: PlannedRun) -> int:
        return self.cores or run_cpus(run)

    def execution(self, run: PlannedRun) -> dict:
        """Settings of the run's process so that jobs x workers stays within the cores. A run with
        one core steps its envs in its own process, as its one env worker would and with the same
        policy lag (``runner.overlap``): the same training, bit for bit, without a second process
        to feed and copy observations to, which on one core only costs time. A double-buffered run
        (two workers or more) is then collected as one: the same bits where ``runner.act_batch`` is
        the size of its parts."""
        rc, cpus = run.cfg.runner, self.cpus(run)
        runner = {"torch_threads": min(rc.torch_threads or cpus, cpus)}
        if rc.update_threads:
            runner["update_threads"] = min(rc.update_threads, cpus)
        if rc.envs_in_processes():
            if self.cores == 1:
                runner.update(vectorize="sync", overlap=rc.overlapped(), act_in_workers=None)
            else:
                runner["workers"] = cpus
            if rc.double_buffer and (self.cores == 1 or cpus < 2):   # no two env workers to step by turns
                runner["double_buffer"] = False
        return {"runner": runner}


def size_jobs(runs: list[PlannedRun], requested: int | None, cores: int | None = None,
              available: int | None = None) -> Sizing:
    """Runs at once: ``requested``, or as many as there are cores and memory for (each run's agents'
    estimate plus PROCESS_BYTES, within 90% of the memory available), never more than runs; a
    request beyond either is refused."""
    cores = cores or os.cpu_count() or 1
    available = available_bytes() if available is None else available
    need = max((r.memory or 0) for r in runs) + PROCESS_BYTES if runs else PROCESS_BYTES
    by_memory = max(1, int(0.9 * available // need)) if available else math.inf
    if requested is not None:
        if requested > cores:
            raise ConfigError(f"--jobs {requested}: this machine has {cores} cores and each run needs one of its "
                              f"own for its envs and update; use --jobs {cores} or fewer (or backend: ray on a "
                              "cluster)")
        if requested > by_memory:
            raise ConfigError(f"--jobs {requested}: each run needs about {need / GB:.1f} GB and "
                              f"{available / GB:.1f} GB of memory is available, room for {by_memory}; use --jobs "
                              f"{by_memory}, or make the runs smaller (runner.parallels, runner.horizon)")
        jobs = requested
    else:
        jobs = int(max(1, min(len(runs) or 1, cores, by_memory)))
    return Sizing(jobs, max(1, cores // jobs))


# ---------------------------------------------------------------------- where the processes run


def _job_command(run: PlannedRun, request: dict) -> list[str]:
    return [sys.executable, "-m", "marlkit.study.job", str(run.run_dir), json.dumps(request)]


def _answer_sigint() -> None:
    """In the child before exec: SIGINT and SIGTERM unblocked and SIGINT at its default, which Python
    turns into Ctrl+C. A study started in the background by a shell ignores SIGINT, a Ray worker
    blocks both, and both survive exec: the run would not hear the stop until its training began,
    or never."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _die_with_parent() -> None:
    """SIGTERM (stop and save, as marlkit runs do) when the parent process dies, so that a study
    killed outright leaves no run training unseen."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


def _let_go_of_the_server() -> None:
    """The forkserver lives while any process holds the write end of its "alive" pipe, and it hands
    that end to every process it forks. A run that kept it would keep the server alive after the
    study died, and so itself (it stops when the server goes). A multiprocessing forkserver the run
    wanted would be one of its own."""
    from multiprocessing import forkserver
    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
    server._forkserver_alive_fd = server._forkserver_address = server._forkserver_pid = None


def _forked_job(run_dir: str, request: str, log: str) -> None:
    """A run's process, forked from the study's job server: in a session of its own (a terminal's
    Ctrl+C reaches the study alone), its output appended to ``log``, SIGINT its Ctrl+C (the server
    ignores it), and stopped with SIGTERM when the server, which ends with the study, is gone."""
    os.setsid()
    out, null = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644), os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (out, 1), (out, 2)):
        os.dup2(fd, target)
    os.close(out), os.close(null)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _let_go_of_the_server()
    _die_with_parent()
    from marlkit.study import job
    sys.exit(job.main([run_dir, request]))


class LocalJobs:
    """Runs as processes of this machine, forked from a job server that imported torch and marlkit
    once (multiprocessing's forkserver; spawn where there is none), so that the runs do not each
    pay for those imports (docs/studies.md measures it). Each is in a session of its own: a
    terminal's Ctrl+C reaches the study alone, which passes exactly one SIGINT to each run (a
    second one would stop a run without saving)."""

    def __init__(self):
        from marlkit.study import job
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        self.context = multiprocessing.get_context(method)
        if method == "forkserver":
            self.context.set_forkserver_preload(job.PRELOAD)
        self.procs: dict[str, multiprocessing.process.BaseProcess] = {}
        self.signalled: dict[str, int] = {}

    def start(self, run: PlannedRun, request: dict, log: Path, cpus: int) -> None:
        proc = self.context.Process(target=_forked_job, args=(str(run.run_dir), json.dumps(request), str(log)),
                                    name=f"marlkit-study-{run.key}")
        proc.start()
        self.procs[run.key] = proc

    def running(self) -> int:
        return len(self.procs)

    def finished(self, timeout: float) -> list[tuple[str, int]]:
        deadline = time.monotonic() + timeout
        while True:
            done = [(key, p.exitcode) for key, p in self.procs.items() if p.exitcode is not None]
            if done or not self.procs or time.monotonic() >= deadline:
                for key, _ in done:
                    self.procs.pop(key).close()
                return [(key, process_exit_code(code)) for key, code in done]
            time.sleep(0.1)

    def interrupt(self, times: int) -> None:
        """Each running process has had ``times`` SIGINTs (the first: stop and save; the second: stop
        at once), however many of them reached it before."""
        for key, proc in list(self.procs.items()):
            while proc.exitcode is None and self.signalled.get(key, 0) < times:
                os.kill(proc.pid, signal.SIGINT)
                self.signalled[key] = self.signalled.get(key, 0) + 1

    def close(self) -> None:
        for proc in self.procs.values():
            proc.join()


def _ray_job(command: list[str], log: str, environ: dict, stop: str) -> int:
    """A Ray task: the run's process on the node the task landed on. The study asks it to stop
    through the file ``stop`` (the number of SIGINTs to pass on), on the filesystem the run
    directories share, so that no task is cut short by Ray before its run has saved."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **environ}, start_new_session=True, preexec_fn=_answer_sigint)
        sent = 0
        while proc.poll() is None:
            try:
                asked = int(Path(stop).read_text() or 0)
            except (OSError, ValueError):
                asked = 0
            while sent < asked and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                sent += 1
            time.sleep(0.2)
        return process_exit_code(proc.returncode)


class RayJobs:
    """Runs as Ray tasks that reserve the CPUs each run uses, so that Ray places them on nodes with
    room; a run with ``runner.vectorize: ray`` finds the same cluster through RAY_ADDRESS. The run
    directories must be on a filesystem every node shares."""

    def __init__(self, address: str | None, root: Path):
        from marlkit.envs.ray_cluster import connect
        # the reaper ends a Ray started here with this process, however it ends: it must live as long
        self.connected, self.reaper, self.log = connect(address)
        import ray
        self.ray = ray
        self.task = ray.remote(_ray_job)
        self.refs: dict[str, object] = {}
        self.stop = (root / "stop").resolve()
        self.stop.unlink(missing_ok=True)
        self.environ = {"RAY_ADDRESS": ray.get_runtime_context().gcs_address,
                        "PYTHONPATH": os.environ.get("PYTHONPATH", "")}

    def start(self, run: PlannedRun, request: dict, log: Path, cpus: int) -> None:
        self.refs[run.key] = self.task.options(num_cpus=cpus, max_retries=0).remote(
            _job_command(run, request), str(log.resolve()), self.environ, str(self.stop))

    def running(self) -> int:
        return len(self.refs)

    def finished(self, timeout: float) -> list[tuple[str, int]]:
        if not self.refs:
            time.sleep(timeout)
            return []
        ready, _ = self.ray.wait(list(self.refs.values()), num_returns=len(self.refs), timeout=timeout)
        out = []
        for key, ref in list(self.refs.items()):
            if ref in ready:
                del self.refs[key]
                try:
                    out.append((key, self.ray.get(ref)))
                except self.ray.exceptions.RayError:
                    out.append((key, 1))
        return out

    def interrupt(self, times: int) -> None:
        """Every task passes ``times`` SIGINTs in all to its run (the first: stop and save)."""
        self.stop.write_text(str(times))

    def close(self) -> None:
        self.stop.unlink(missing_ok=True)
        if self.connected:
            self.ray.shutdown()
        if self.log is not None:
            self.log.close()


# ---------------------------------------------------------------------- the study


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s"


def _last_line(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


class StopSignals:
    """Ctrl+C or SIGTERM: no further run starts, and each running one is asked once to stop and save
    (again on a second signal: they stop at once)."""

    def __init__(self, pool):
        self.pool, self.count, self.previous = pool, 0, {}

    def __enter__(self):
        def handler(signum, frame):
            self.count += 1
            self.pool.interrupt(self.count)

        self.previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for s, h in self.previous.items():
            signal.signal(s, h)

    def __bool__(self) -> bool:
        return self.count > 0


def run_study(spec: StudySpec, runs: list[PlannedRun], pool, sizing: Sizing) -> int:
    """Every run not finished, ``sizing.jobs`` at once -> marlkit's exit code for the study: 0 all
    finished, 1 some failed, 130 interrupted."""
    logs = spec.root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ledger = spec.root / "jobs.jsonl"
    states = {run.key: run_state(run) for run in runs}
    queue = [run for run in runs if states[run.key] != "done"]
    done = len(runs) - len(queue)
    resume = sum(states[r.key] == "resume" for r in queue)
    where = (f"{sizing.jobs} at once, {sizing.cores} core{'s' if sizing.cores > 1 else ''} each" if sizing.cores
             else f"up to {sizing.jobs} at once as Ray tasks, each reserving its run's CPUs")
    print(f"study {spec.name}: {len(runs)} runs ({done} finished, {resume} to resume, {len(queue) - resume} to "
          f"start), {where}; {spec.root}", flush=True)
    bar = tqdm(total=len(runs), initial=done, unit="run", desc=f"study {spec.name}", dynamic_ncols=True,
                   disable=not sys.stderr.isatty())
    by_key = {run.key: run for run in runs}
    started: dict[str, tuple[float, int, str]] = {}
    failed = 0

    def say(text: str) -> None:
        tqdm.write(text, file=sys.stdout)
        sys.stdout.flush()

    with StopSignals(pool) as stop:
        try:
            while (queue and not stop) or pool.running():
                while queue and not stop and pool.running() < sizing.jobs:
                    run = queue.pop(0)
                    state, steps = run_state(run), latest_steps(run.run_dir)
                    request = {"agent": run.agent, "env": run.env, "seed": run.seed, "overrides": spec.set,
                               "execution": sizing.execution(run)}
                    log = logs / f"{run.key.replace('/', '.')}.log"
                    pool.start(run, request, log, sizing.cpus(run))
                    started[run.key] = (time.monotonic(), steps, state)
                    if stop:   # the signal came while it started: it is asked to stop as the others were
                        pool.interrupt(stop.count)
                    if state == "resume":
                        say(f"resume {run.label} from step {steps:,} ({run.run_dir})")
                for key, code in pool.finished(timeout=0.5):
                    run = by_key[key]
                    t0, from_step, action = started.pop(key)
                    wall = time.monotonic() - t0
                    to_step = latest_steps(run.run_dir)
                    with ledger.open("a") as fh:
                        fh.write(json.dumps({"run": key, "action": action, "from_step": from_step, "to_step": to_step,
                                             "exit": code, "wall_s": round(wall, 2)}) + "\n")
                    log = logs / f"{key.replace('/', '.')}.log"
                    if code == 0 and run_state(run) == "done":
                        final = read_benchmark(run.run_dir)["final"]
                        done += 1
                        bar.update(1)
                        say(f"done   {run.label}: final return {final['score']:.3f} ± {final.get('score_ci', 0):.3f}, "
                            f"{_duration(wall)}  [{done}/{len(runs)}]")
                    elif code == INTERRUPTED and to_step:
                        say(f"saved  {run.label} at step {to_step:,} of {run.cfg.runner.total_steps:,}")
                    elif code == INTERRUPTED:
                        say(f"stopped {run.label} before its first checkpoint (it starts anew next time)")
                    else:
                        failed += 1
                        say(f"failed {run.label} (exit {code}): {_last_line(log)}; log: {log}")
        finally:
            if pool.running():   # an error of the study's own: its runs save before it goes
                pool.interrupt(max(stop.count, 1))
            pool.close()
            bar.close()
    if stop:
        print(f"study {spec.name} interrupted: {done} of {len(runs)} runs finished, {len(runs) - done} left; run the same "
              "command again to continue (finished runs are skipped, interrupted ones resumed)", file=sys.stderr)
        return INTERRUPTED
    if failed:
        print(f"study {spec.name}: {failed} run{'s' if failed > 1 else ''} failed (logs in {logs}); fix the cause "
              "and run the same command again to continue", file=sys.stderr)
        return 1
    return 0

