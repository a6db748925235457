"""One run of a study, in a process of its own: forked from the study's job server
(``scheduler.LocalJobs``), or ``python -m marlkit.study.job RUN_DIR REQUEST`` (a Ray task's).

``REQUEST`` is JSON: ``agent``, ``env``, ``seed``, ``overrides`` (the study's ``set``) and
``execution`` (settings of this process alone, ``runner.workers``, ``runner.torch_threads`` and
``runner.update_threads``, which may differ between the processes a run takes). The run is an
ordinary ``--benchmark`` run in ``RUN_DIR``: started there, or continued from its ``latest.pt`` as
``marlkit --resume RUN_DIR`` would, or, where training ended but the report was not written
(stopped during its last rollout), its report written from the checkpoint. Exit codes are
marlkit's: 0 done, 1 failed, 2 bad config, 130 interrupted (saved).
"""
from __future__ import annotations

import gc
import json
import shutil
import sys
from pathlib import Path

from marlkit.errors import exit_code

# What every run imports, imported once by the study's job server before it forks the runs
# (scheduler.LocalJobs): torch alone takes seconds. Env packages are left to each run: one that
# starts a thread when imported would make forking from the server unsafe.
PRELOAD = ["marlkit.api", "marlkit.runners.runner", "torch.utils.tensorboard"]


def build(run_dir: Path, request: dict):
    """The RunConfig of this process: a fresh run, a resumed one, or a finished one to report."""
    from marlkit.api import build_config
    from marlkit.config import deep_merge, from_dict, load_yaml
    from marlkit.runners.checkpoint import read_steps
    execution = request.get("execution") or {}
    latest = run_dir / "latest.pt"
    if latest.is_file():
        saved = load_yaml(run_dir / "config.yaml")
        if read_steps(latest) >= saved["runner"]["total_steps"]:
            # --resume refuses a finished run; here only the report is missing, and the runner,
            # resumed at its end, evaluates where one is due and writes it
            return from_dict(deep_merge(saved, {**execution, "mode": "benchmark", "resume": str(run_dir)}))
        return build_config(mode="benchmark", resume=str(run_dir), overrides=execution)
    if run_dir.exists():
        # a start that was stopped before its first checkpoint left no training to keep
        shutil.rmtree(run_dir)
    cfg = build_config(request["agent"], request["env"], "benchmark",
                       overrides=deep_merge(deep_merge(request.get("overrides") or {}, execution),
                                            {"seed": request["seed"]}))
    run_dir.mkdir(parents=True)
    return cfg


def main(argv: list[str]) -> int:
    from marlkit.allocator import keep_freed_memory
    keep_freed_memory()
    run_dir, request = Path(argv[0]), json.loads(argv[1])

    def benchmark() -> int:
        from marlkit.runners.runner import Runner
        Runner(build(run_dir, request), run_dir).run()
        return 0

    return exit_code(benchmark)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    gc.freeze()   # as the marlkit command: the last collection would walk every torch object for nothing
    raise SystemExit(code)
