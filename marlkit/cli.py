"""The ``marlkit`` command.

    marlkit --agent MAPPO --env mpe_spread                   train
    marlkit --agent MAPPO --env mpe_spread --benchmark       train + periodic eval + report
    marlkit --test --load runs/.../best.pt                   evaluate a checkpoint (its run's agent and env)
    marlkit --list                                           registered agents and envs
    marlkit --agent QMIX --env lbf_8x8_2p_2f_coop --print-config    the resolved config, every key
    marlkit study study.yaml                                 agents x envs x seeds, one report (marlkit study -h)
"""
import argparse
import gc
import importlib
import sys
from dataclasses import dataclass, field
from typing import Optional

from argparse_dataclass import ArgumentParser

from marlkit.config import available_envs
from marlkit.errors import exit_code
from marlkit.registry import REGISTRY, builtin_agents, first_sentence


@dataclass
class CLIArgs:
    agent: Optional[str] = field(default=None, metadata={"help": "registered agent name (default MAPPO; see --list)"})
    env: Optional[str] = field(default=None, metadata={"help": "packaged env name or path of an env YAML "
                                                               "(default mpe_spread)"})
    test: bool = field(default=False, metadata={"help": "evaluate the checkpoint given by --load"})
    benchmark: bool = field(default=False, metadata={"help": "train with periodic evaluation, keep best.pt, "
                                                             "write benchmark.json and learning_curve.png"})
    config: list[str] = field(default_factory=list, metadata={"nargs": "*", "metavar": "FILE",
                                                              "help": "extra YAML files merged over the env YAML"})
    set: list[str] = field(default_factory=list, metadata={"nargs": "*", "metavar": "KEY=VALUE",
                                                           "help": "override any key, e.g. runner.parallels=8"})
    load: Optional[str] = field(default=None, metadata={"help": "checkpoint to test (or to start from); --agent, --env and --import default to those of its run"})
    resume: Optional[str] = field(default=None, metadata={"help": "run directory to continue exactly"})
    seed: Optional[int] = field(default=None, metadata={"help": "random seed (default from the YAML, else 1)"})
    device: Optional[str] = field(default=None, metadata={"help": "torch device, e.g. cpu"})
    logger: Optional[str] = field(default=None, metadata={"choices": ["tensorboard", "wandb", "console", "none"],
                                                          "help": "where metrics go (default tensorboard)"})
    render: bool = field(default=False, metadata={"help": "with --test: record each test episode to a video "
                                                            "(episode_<k>.mp4, runner.test_episodes of them)"})
    imports: list[str] = field(default_factory=list, metadata={
        "args": ["--import"], "nargs": "*", "metavar": "MODULE",
        "help": "import modules that register your own agents, envs or models first"})
    list: bool = field(default=False, metadata={"help": "list registered agents and envs, then exit"})
    print_config: bool = field(default=False, metadata={
        "args": ["--print-config"],
        "help": "print the resolved config of --agent, --env, --config and --set as YAML (usable as --config), "
                "then exit"})


def _gather_repeated(argv: list[str], flags=("--set", "--config", "--import")) -> list[str]:
    """argparse keeps only the last ``--set a=1 --set b=2``; fold repeats into one list."""
    out, collected = [], {f: [] for f in flags}
    current = None
    for token in argv:
        if token in flags:
            current = token
            continue
        if current and not token.startswith("--"):
            collected[current].append(token)
            continue
        current = None
        out.append(token)
    for flag, values in collected.items():
        if values:
            out += [flag, *values]
    return out


def list_everything() -> str:
    agents = builtin_agents()
    for name, cls in REGISTRY.items():  # the ones registered by --import
        agents.setdefault(name, first_sentence(cls.__doc__ or sys.modules[cls.__module__].__doc__ or ""))
    envs = available_envs()
    width = max(map(len, [*agents, *envs]))
    lines = ["agents:"]
    lines += [f"  {name:<{width}} {doc}" for name, doc in sorted(agents.items())]
    lines.append("envs:")
    lines += [f"  {name:<{width}} {desc}" for name, desc in envs.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["study"]:
        from marlkit.study.command import main as study
        return study(argv[1:])
    parser = ArgumentParser(CLIArgs, prog="marlkit", description="Multi-agent RL: train, test, benchmark.",
                            epilog=__doc__.split("\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    args = parser.parse_args(_gather_repeated(argv))
    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            print(f"marlkit: error: --import {module}: {exc}", file=sys.stderr)
            return 2
    if args.list:
        print(list_everything())
        return 0
    if args.test and args.benchmark:
        parser.error("choose one of --test and --benchmark")
    from marlkit.api import build_config, run_config
    from marlkit.config import parse_set
    # no flag: train, or continue a --resume run in the mode it was started in
    mode = "test" if args.test else "benchmark" if args.benchmark else None
    top = {k: v for k, v in {"seed": args.seed, "device": args.device, "logger": args.logger,
                             "load": args.load, "render": args.render or None,
                             "imports": args.imports or None}.items() if v is not None}
    def train_or_test() -> int:
        overrides = parse_set(args.set)
        overrides.update(top)
        cfg = build_config(args.agent, args.env, mode, config=args.config, resume=args.resume, overrides=overrides)
        if args.print_config:
            import yaml
            print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
            return 0
        result = run_config(cfg)
        print(f"run directory: {result.run_dir}")
        return 0

    return exit_code(train_or_test)


def command() -> int:
    """The ``marlkit`` program (and ``python -m marlkit``): ``main`` on the command line, then exit."""
    from marlkit.allocator import keep_freed_memory
    keep_freed_memory()   # before any thread allocates: glibc fixes its arenas then
    code = main()
    # the program is over and its files are closed: the interpreter's last garbage collection
    # would walk every object torch made (0.3 s) for nothing
    gc.freeze()
    return code
