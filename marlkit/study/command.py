"""``marlkit study``: agents x envs x seeds, each an ordinary ``--benchmark`` run, and one report.

    marlkit study study.yaml
    marlkit study --agents MAPPO IPPO --envs mpe_spread lbf_8x8_2p_2f_coop --seeds 1 2 3 \\
                  --set runner.total_steps=50000 --name small
    marlkit study --report study.yaml          (or --report --name small): the report again, nothing run

Runs go to <runner.run_root>/studies/<name>/<env>/<agent>/seed<k>/. The same command again skips
finished runs, resumes interrupted ones and starts the rest; a study whose settings changed is refused.
"""
from __future__ import annotations

import argparse

from marlkit.errors import ConfigError, exit_code

RUN_KEYS = ("agents", "envs", "seeds")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marlkit study", description="Run agents x envs x seeds as benchmark runs and "
                                "report them with rliable's statistics.", epilog=__doc__.split("\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", nargs="?", metavar="study.yaml", help="name, agents, envs, seeds, set, reference, jobs, "
                   "backend (the flags below override it)")
    p.add_argument("--agents", nargs="+", metavar="AGENT")
    p.add_argument("--envs", nargs="+", metavar="ENV", help="packaged env names or env YAML paths")
    p.add_argument("--seeds", nargs="+", type=int, metavar="SEED")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE", help="settings for every run")
    p.add_argument("--name", help="the study's folder under <run_root>/studies/ (default: the YAML's name or stem)")
    p.add_argument("--jobs", type=int, metavar="N", help="runs at once (default: as many as cores and memory hold)")
    p.add_argument("--backend", choices=["local", "ray"], help="local processes, or tasks on a Ray cluster")
    p.add_argument("--report", action="store_true", help="write the report from the run directories; run nothing")
    return p


def _spec(args):
    from marlkit.config import parse_set
    from marlkit.study.spec import StudySpec, load_spec, read_saved, spec_from_saved
    given = {"agents": args.agents, "envs": args.envs, "seeds": args.seeds, "name": args.name,
             "jobs": args.jobs, "backend": args.backend, "set": parse_set(args.set) if args.set else None}
    if args.report and not args.file and not any(given[k] for k in RUN_KEYS):
        if not args.name:
            raise ConfigError("--report needs the study: pass its study.yaml, or --name NAME")
        root = StudySpec(args.name, [], [], [], set=given["set"] or {}).root
        saved = read_saved(root)
        if saved is None:
            raise ConfigError(f"--report --name {args.name}: no study.json in {root}; pass the study's YAML, or "
                              "--set runner.run_root=... where its runs are")
        return spec_from_saved(saved, root)
    return load_spec(args.file, given)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)

    def study() -> int:
        spec = _spec(args)
        from marlkit.study import stats
        stats.require_rliable()
        return report(spec) if args.report else run(spec)

    return exit_code(study, prog="marlkit study", unstarted="interrupted before any run started")


def report(spec) -> int:
    from marlkit.study.report import write_report
    from marlkit.study.scheduler import read_benchmark
    from marlkit.study.stats import load_records
    records = load_records(spec, read_benchmark)
    if not records:
        raise ConfigError(f"study {spec.name!r}: no finished run in {spec.root} to report on yet")
    path = write_report(spec, records)
    print(f"report: {path} ({len(records)} of {len(spec.runs())} runs finished)")
    return 0


def run(spec) -> int:
    from marlkit.study.scheduler import LocalJobs, RayJobs, Sizing, run_study, size_jobs
    from marlkit.study.spec import check_unchanged, plan_runs, read_saved, resolved, write_saved
    runs = plan_runs(spec)
    now = resolved(spec, runs)
    saved = read_saved(spec.root)
    if saved is not None:
        check_unchanged(saved, now, spec.root)
    ray = spec.backend == "ray" or any(r.cfg.runner.vectorize == "ray" for r in runs)
    sizing = Sizing(spec.jobs or len(runs)) if ray else size_jobs(runs, spec.jobs)
    write_saved(spec.root, now)
    pool = RayJobs(runs[0].cfg.runner.ray_address, spec.root) if ray else LocalJobs()
    code = run_study(spec, runs, pool, sizing)
    if code == 0:
        return report(spec)
    return code
