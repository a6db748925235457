"""Joint steps/s of ViZDoom co-op: a bare lockstep loop (no marlkit) vs marlkit's doom env with random
actions, for 2 and 4 players, and MAPPO training of doom_coop against random stepping of the same
vector env. Each pair alternates within one process, so both sides see the same machine load.

    python benchmarks/doom_throughput.py [--steps 1500] [--repeats 3] [--players 2 4]
                                         [--train-steps 4096] [--rows training ...] [--device cuda]
                                         [--train-env doom_coop] [--set KEY=VALUE ...]
                                         [--compare NAME KEY=VALUE ...] [--tag NAME]

A joint step is one step of every player (``frame_skip`` tics each). "bare" is the minimum any
wrapper must do: one process per player holding a DoomGame on deathmatch.cfg (player 0 hosting,
the others joining over loopback), actions sent through pipes, screens and game variables sent
back, and the 4 tics of a step played as 2 + 2 with a barrier between (more than 2 tics per
barrier hangs the engines); its engines wait for their peers as the config's do (``env.engine_wait``:
yielding their core, or spinning). "marlkit" is ``make_env_vector`` on the packaged doom_deathmatch
config, the same map and buttons (1 env, runner.vectorize sync), with its resize to 30x40 and
stack of 4 frames. Beside them, per player count, that config's default vector env with random
actions. Training (``--train-steps``): MAPPO with the doom_coop defaults (``--train-env`` names
another doom config, e.g. doom_deathmatch), collection overlapping the update; the same with
``runner.overlap=false``, with the update in bfloat16 (``agents.MAPPO.precision``) and with double-buffered collection (``runner.double_buffer``), and random actions through the same vector env, alternating; then training and random actions again with ``env.engine_wait=spin`` (engines
that spin while they wait for a peer, as ViZDoom's do, instead of yielding their core). Two rows
are a ceiling, not a config: ``collection_only`` trains but replaces every update by nothing (the
agent still acts on every step) with the runner acting (``runner.act_in_workers=false``), and
``collection_only_workers_act`` does so with the match workers acting; no update beside
collection can train faster than they collect. ``--rows``
picks among those training rows; ``--device cuda`` adds one with the update on that device (acting
where the config acts: doom_coop's match workers, on the CPU), and with ``training_double_buffer``
among the rows one double-buffered there too (the runner acting, on that device). ``--compare NAME KEY=VALUE ...`` (repeatable) adds a row ``training_NAME``: doom_coop's
training with these overrides on top of ``--set``, another config measured beside the defaults
(e.g. the previous defaults). ``--players`` with no count skips the bare-loop pairs. ``--set``
applies to both configs. Writes benchmarks/results/doom_throughput[_NAME].json.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import tempfile
import time
from dataclasses import replace

import numpy as np

import harness

TRAINING_ROWS = ["training", "training_no_overlap", "training_bfloat16", "training_double_buffer", "training_spin",
                 "collection_only", "collection_only_workers_act"]
# rows whose agents act as in training but never update: the ceiling of any update beside collection
COLLECTION_ONLY = {"collection_only", "collection_only_workers_act"}
BUTTONS = ["ATTACK", "MOVE_FORWARD", "MOVE_BACKWARD", "MOVE_LEFT", "MOVE_RIGHT", "TURN_LEFT", "TURN_RIGHT"]


def _bare_player(conn, player: int, players: int, port: int, work_dir: str, barrier, timeout_tics: int,
                 preload: str | None) -> None:
    import vizdoom as vzd
    os.setpgid(0, 0)   # the engine joins this group, so that a kill of the group takes it along
    os.chdir(work_dir)
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    game = vzd.DoomGame()
    game.load_config(os.path.join(vzd.scenarios_path, "deathmatch.cfg"))
    game.set_doom_config_path(os.path.join(work_dir, "_vizdoom.ini"))
    game.set_mode(vzd.Mode.PLAYER)
    game.set_window_visible(False)
    game.set_screen_resolution(vzd.ScreenResolution.RES_160X120)
    game.set_screen_format(vzd.ScreenFormat.GRAY8)
    game.set_available_buttons([getattr(vzd.Button, b) for b in BUTTONS])
    game.set_episode_timeout(timeout_tics)
    if player == 0:
        game.add_game_args(f"-host {players} -netmode 0 -port {port} +sv_forcerespawn 1 +sv_spawnfarthest 1 "
                           "+viz_respawn_delay 0 "
                           "+viz_connect_timeout 10 +name P0 +colorset 0")
    else:
        game.add_game_args(f"-join 127.0.0.1 -port {port} +name P{player} +colorset {player}")
    if preload:   # the engine waits as marlkit's do (env.engine_wait), so the two differ by the wrapper alone
        os.environ["LD_PRELOAD"] = preload
    game.init()
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            break
        if msg == "reset":
            game.new_episode()
        else:
            for chunk in (0, 1):
                if chunk:
                    barrier.wait()
                if not game.is_episode_finished():
                    game.make_action(msg, 2)
        state = game.get_state()
        conn.send((state.screen_buffer if state is not None else None,
                   state.game_variables if state is not None else None, game.is_episode_finished()))
    game.close()


def _recv(pipe, timeout: float = 30.0):
    """A player's answer; a player that gives none in ``timeout`` seconds is taken as dead (a
    joiner's engine can die while the host waits for it, and the host then never answers)."""
    if not pipe.poll(timeout):
        raise EOFError(f"no answer from a player in {timeout:.0f} s")
    return pipe.recv()


def bare_steps_per_s(players: int, steps: int, timeout_tics: int, preload: str | None, attempts: int = 3) -> float:
    """The bare loop's joint steps/s. A match that does not start (an engine exiting while it
    connects, seen about one start in three on a quiet box) is retried on another port, as the
    doom env does."""
    for attempt in range(attempts):
        try:
            return _bare_run(players, steps, timeout_tics, preload)
        except (EOFError, BrokenPipeError) as exc:
            if attempt == attempts - 1:
                raise
            print(f"bare loop: the match did not start ({type(exc).__name__}); retrying on another port", flush=True)
    raise AssertionError("unreachable")


def _bare_run(players: int, steps: int, timeout_tics: int, preload: str | None) -> float:
    from marlkit.envs.doom.match import free_port   # the same free-port pick, nothing else from marlkit
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as work_dir:
        barrier = ctx.Barrier(players)
        port = free_port()
        pipes, procs = [], []
        try:
            for i in range(players):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_bare_player, daemon=True,
                                   args=(child, i, players, port, work_dir, barrier, timeout_tics, preload))
                proc.start()
                pipes.append(parent)
                procs.append(proc)
            for p in pipes:
                assert _recv(p, 60.0) == "ready"
            rng = np.random.default_rng(0)
            for p in pipes:
                p.send("reset")
            for p in pipes:
                _recv(p)
            start = time.perf_counter()
            for _ in range(steps):
                for p in pipes:
                    p.send([float(b) for b in rng.integers(0, 2, len(BUTTONS))])
                answers = [_recv(p) for p in pipes]
                if answers[0][2]:
                    for p in pipes:
                        p.send("reset")
                    for p in pipes:
                        _recv(p)
            return steps / (time.perf_counter() - start)
        finally:
            for p in pipes:
                try:
                    p.send(None)
                except OSError:
                    pass
            for proc in procs:
                proc.join(5)
                try:   # the player and its engine, which would otherwise outlive a failed run
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def vector_cfg(cfg, players: int, num_envs: int, vectorize: str):
    """``cfg`` with ``players`` players and ``num_envs`` envs (a worker each, unless in process)."""
    return replace(cfg, env=replace(cfg.env, players=players),
                   runner=replace(cfg.runner, parallels=num_envs, workers=num_envs, vectorize=vectorize))


def main() -> None:
    p = harness.parser(__doc__)
    p.add_argument("--steps", type=int, default=1500, help="joint steps per measurement (2 players)")
    p.add_argument("--players", type=int, nargs="*", default=[2, 4])
    p.add_argument("--train-steps", type=int, default=4096, help="0 skips the training measurement")
    p.add_argument("--train-env", default="doom_coop",
                   help="the packaged doom config the training rows train and step (e.g. doom_deathmatch)")
    p.add_argument("--rows", nargs="*", default=TRAINING_ROWS, choices=TRAINING_ROWS,
                   help="the training rows to measure (each beside random stepping)")
    p.add_argument("--device", default=None,
                   help="also train with the update on this device (cuda), beside the rows on the config's")
    p.add_argument("--compare", nargs="+", action="append", default=[], metavar="NAME KEY=VALUE",
                   help="add the row training_NAME: training with these overrides on top of --set")
    args = harness.parse_args(p)
    compared = {f"training_{name}": overrides for name, *overrides in args.compare}
    built_in = set(TRAINING_ROWS) | (
        {f"training_{args.device}", f"training_{args.device}_double_buffer"} if args.device else set())
    if (len(compared) != len(args.compare) or set(compared) & built_in
            or any("=" in name or not overrides for name, overrides in compared.items())):
        p.error("--compare takes a row name of its own (not one of --rows or --device's, nor twice), then "
                "its KEY=VALUE overrides, e.g. --compare narrow agents.MAPPO.actor.kwargs.channels=[8,16,16]")

    from marlkit.api import build_config
    from marlkit.config import deep_merge, parse_set
    from marlkit.envs.doom import engine_wait
    from marlkit.errors import ConfigError
    try:
        trained = build_config("MAPPO", args.train_env, overrides=args.overrides)
    except ConfigError as e:
        p.error(f"--train-env: {e}")
    if args.train_steps and trained.env.type != "doom":
        p.error(f"--train-env {args.train_env} is not a doom config: name one of marlkit/configs/doom_*.yaml, "
                "e.g. --train-env doom_deathmatch")
    cfg = build_config("MAPPO", "doom_deathmatch", overrides=args.overrides)
    preload = engine_wait.library() if cfg.env.engine_wait == "yield" else None
    parallels, vectorize = cfg.runner.parallels, cfg.runner.vectorize
    out: dict = {"config": "marlkit/configs/doom_deathmatch.yaml", "overrides": args.set,
                 "engine_wait": "yield" if preload else "spin",
                 "frame_skip": cfg.env.frame_skip, "resolution": cfg.env.resolution, "players": {}}
    for players in args.players:
        steps = args.steps * 2 // players
        samples, _ = harness.measure({
            "bare": lambda: bare_steps_per_s(players, steps, cfg.env.episode_timeout, preload),
            "marlkit": lambda: harness.random_steps_per_s(vector_cfg(cfg, players, 1, "sync"), steps)},
            args.repeats, label=f"players {players} ")
        ratios = [m / b for m, b in zip(samples["marlkit"], samples["bare"])]
        vec = harness.random_steps_per_s(vector_cfg(cfg, players, parallels, vectorize), steps * parallels // 2)
        print(f"players {players}: default vector env ({parallels} envs, {vectorize}) {vec:.1f} joint steps/s",
              flush=True)
        out["players"][players] = {
            "steps": steps, "bare_joint_steps_per_s": samples["bare"], "marlkit_joint_steps_per_s": samples["marlkit"],
            "ratio_per_repeat": ratios, "ratio_median": harness.median(ratios),
            f"marlkit_{parallels}_envs_{vectorize}_joint_steps_per_s": vec}
    rows = [[f"{n} players", harness.median(r["bare_joint_steps_per_s"]),
             harness.median(r["marlkit_joint_steps_per_s"]), r["ratio_median"]] for n, r in out["players"].items()]
    if args.train_steps:
        spin = {**args.overrides, "env.engine_wait": "spin"}
        trained_spin = build_config("MAPPO", args.train_env, overrides=args.overrides, **{"env.engine_wait": "spin"})
        trainings = {   # row: (overrides, the random row it is a ratio of)
            "training": (args.overrides, "random"),
            "training_no_overlap": ({**args.overrides, "runner.overlap": False}, "random"),
            "training_bfloat16": ({**args.overrides, "agents.MAPPO.precision": "bfloat16"}, "random"),
            "training_double_buffer": ({**args.overrides, "runner.double_buffer": True}, "random"),
            "training_spin": (spin, "random_spin"),
            "collection_only": ({**args.overrides, "runner.act_in_workers": False}, "random"),
            "collection_only_workers_act": ({**args.overrides, "runner.act_in_workers": True}, "random"),
            **({f"training_{args.device}": ({**args.overrides, "device": args.device}, "random"),
                f"training_{args.device}_double_buffer": (
                    {**args.overrides, "device": args.device, "runner.double_buffer": True}, "random")}
               if args.device else {}),
            **{name: (deep_merge(args.overrides, parse_set(overrides)), "random")
               for name, overrides in compared.items()}}
        device_rows = {f"training_{args.device}"} | (
            {f"training_{args.device}_double_buffer"} if "training_double_buffer" in args.rows else set())
        trainings = {k: v for k, v in trainings.items()
                     if k in args.rows or k in device_rows or k in compared}
        sides = {name: (lambda o=o, skip=name in COLLECTION_ONLY: harness.train_steps_per_s(
                     "MAPPO", args.train_env, args.train_steps, o, skip_updates=skip))
                 for name, (o, _) in trainings.items()}
        sides["random"] = lambda: harness.random_steps_per_s(trained, args.train_steps // 2)
        if "training_spin" in trainings:
            sides["random_spin"] = lambda: harness.random_steps_per_s(trained_spin, args.train_steps // 2)
        samples, medians = harness.measure(sides, args.repeats, label=f"{args.train_env} ")
        out["mappo_training"] = {
            "config": f"marlkit/configs/{args.train_env}.yaml", "steps": args.train_steps, "compare": args.compare,
            "vector_env": f"{trained.runner.parallels} envs, {trained.runner.vectorize}",
            "engine_wait": trained.env.engine_wait, "device": trained.device,
            **{f"{name}_joint_steps_per_s": s for name, s in samples.items()},
            **{f"{name}_ratio_per_repeat": [t / r for t, r in zip(samples[name], samples[rand])]
               for name, (_, rand) in trainings.items()},
            **{f"{name}_ratio_median": medians[name] / medians[rand] for name, (_, rand) in trainings.items()}}
    harness.write_results("doom_throughput", args, out)
    if rows:
        harness.table(["joint steps/s (median)", "bare", "marlkit (1 env, sync)", "marlkit / bare"], rows)
    if args.train_steps:
        print(f"{args.train_env}, medians ({trained.runner.parallels} envs, {trained.runner.vectorize}): " + "; ".join(
            f"{name} {medians[name]:.1f} joint steps/s ({medians[name] / medians[rand]:.2f}x {rand})"
            for name, (_, rand) in trainings.items()) + "; " + ", ".join(
            f"{r} {medians[r]:.1f}" for r in ("random", "random_spin") if r in medians))


if __name__ == "__main__":
    main()
