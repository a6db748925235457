"""``env.engine_wait``: the library that makes a waiting engine give its core away is built, loaded
by every engine of a real match (and by none with ``spin``), and the episodes play out alike.
How much it is worth is measured in benchmarks/doom_throughput.py, not here."""
import logging

import pytest

from marlkit.envs.doom import DoomCoopEnv, engine_wait
from test_doom import SHORT, match_pids, no_work_folder_left  # noqa: F401  (autouse: no work folder left)

ACTIONS = [[], ["ATTACK"], ["TURN_LEFT"], ["TURN_RIGHT", "ATTACK"]]
LIBRARY = engine_wait.library()
needs_library = pytest.mark.skipif(LIBRARY is None, reason="engine_wait.c cannot be built here (see the warning)")


def engines_with(library: str, env: DoomCoopEnv) -> list[bool]:
    """Per engine process of the match, whether it has ``library`` mapped."""
    engines = [p for p in match_pids(env) if p not in env.match.pids()]
    out = []
    for pid in engines:
        with open(f"/proc/{pid}/maps") as f:
            out.append(library in f.read())
    return out


def play(engine_wait_mode: str) -> tuple[int, float, list[bool]]:
    """Steps until the episode ends, the ammunition player_0 spent in them, and which engines
    loaded the library, for a fixed action sequence (the screens differ from run to run whatever
    the setting, so they are no test of it)."""
    env = DoomCoopEnv(players=2, actions=ACTIONS, engine_wait=engine_wait_mode, **SHORT)
    try:
        loaded = engines_with(LIBRARY, env)
        _, infos = env.reset(seed=5)
        ammo, steps = infos["player_0"]["ammo"], 0
        while env.agents:
            env.step({a: 1 for a in env.agents})   # ATTACK, every step
            steps += 1
        return steps, ammo - env.last_episode["player_0"]["ammo"], loaded
    finally:
        env.close()


@pytest.mark.slow
@needs_library
def test_every_engine_loads_the_library_with_yield_and_none_with_spin_and_the_game_is_the_same():
    steps, spent, loaded = play("yield")
    assert loaded == [True, True]
    assert steps == SHORT["episode_timeout"] // SHORT["frame_skip"] and spent > 0
    assert play("spin") == (steps, spent, [False, False])


def test_without_a_compiler_the_engines_spin_and_a_warning_names_the_fix(caplog):
    with caplog.at_level(logging.WARNING, logger="marlkit.doom"):
        assert engine_wait.library("no-such-compiler-cc") is None
    (record,) = [r for r in caplog.records if "engine_wait" in r.getMessage()]
    assert "no C compiler 'no-such-compiler-cc'" in record.getMessage()
    assert "install gcc" in record.getMessage() and "env.engine_wait: spin" in record.getMessage()


@needs_library
def test_the_library_is_built_once_and_found_again(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    engine_wait.library.cache_clear()
    try:
        first = engine_wait.library()
        assert first is not None and first.startswith(str(tmp_path / "marlkit"))
        built = (tmp_path / "marlkit").stat().st_mtime_ns, len(list((tmp_path / "marlkit").iterdir()))
        engine_wait.library.cache_clear()
        assert engine_wait.library() == first
        assert ((tmp_path / "marlkit").stat().st_mtime_ns, len(list((tmp_path / "marlkit").iterdir()))) == built
    finally:
        engine_wait.library.cache_clear()
