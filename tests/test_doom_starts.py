"""The co-op copy of a scenario's WAD: starts for single-player maps and a fresh inventory every
episode; the WAD edit itself, and real games where each player spawns on a spot of its own and
starts every episode with the map's ammo and health."""
import os

import numpy as np
import pytest
import vizdoom

from marlkit.config import ConfigError
from marlkit.envs.doom import DoomCoopEnv
from marlkit.envs.doom.coop_starts import (added_starts, coop_scenario_wad, coop_wad, map_things, read_wad,
                                           scenario_wad, write_wad)
from marlkit.envs.doom.worker import VARIABLES
from test_doom import no_work_folder_left  # noqa: F401  (autouse: no test leaves a match's work folder)

X, Y = VARIABLES.index("POSITION_X"), VARIABLES.index("POSITION_Y")
DEFEND = os.path.join(vizdoom.scenarios_path, "defend_the_center.cfg")
ONE_START = 'namespace = "zdoom";\nthing // 0\n{\nx = 100.0;\ny = -50.0;\nangle = 90;\ntype = 1;\n}\n'


def test_missing_starts_are_added_beside_player_one_across_its_facing():
    extra = map_things(added_starts(ONE_START, players=4, spacing=64))
    # player 1 faces north (angle 90), so the row runs west-east through (100, -50)
    assert [int(t["type"]) for t in extra] == [2, 3, 4]
    assert [(float(t["x"]), float(t["y"])) for t in extra] == [(36.0, -50.0), (164.0, -50.0), (-28.0, -50.0)]
    assert {t["angle"] for t in extra} == {"90"} and all(t["coop"] == "true" for t in extra)


def test_maps_with_several_start_spots_are_left_alone():
    two_starts = ONE_START + ONE_START.split("\n", 1)[1].replace("type = 1", "type = 2")
    deathmatch = ONE_START + ONE_START.split("\n", 1)[1].replace("type = 1", "type = 11")
    assert added_starts(two_starts, 2, 64) == "" and added_starts(deathmatch, 2, 64) == ""
    # deathmatch.cfg: three player 1 starts, over which ZDoom already spreads the players; its copy
    # only gains the MAPINFO of a fresh inventory
    deathmatch_cfg = os.path.join(vizdoom.scenarios_path, "deathmatch.cfg")
    assert coop_scenario_wad(deathmatch_cfg, None, 4, 64, fresh_inventory=False) is None
    original = read_wad(scenario_wad(deathmatch_cfg).read_bytes())
    assert read_wad(open(coop_scenario_wad(deathmatch_cfg, None, 4, 64), "rb").read())[1:] == original


def test_the_edited_wad_keeps_every_other_lump_byte_for_byte():
    original = read_wad(scenario_wad(DEFEND).read_bytes())
    edited = read_wad(coop_wad(write_wad(original), "map01", 3, 64))
    mapinfo = edited.pop(0)
    assert mapinfo[0] == "MAPINFO" and b"map MAP01" in mapinfo[1]
    assert b"ResetInventory" in mapinfo[1] and b"ResetHealth" in mapinfo[1]
    assert [n for n, _ in edited] == [n for n, _ in original]
    for (name, before), (_, after) in zip(original, edited):
        if name == "TEXTMAP":
            assert after.startswith(before) and len(map_things(after.decode())) == len(map_things(before.decode())) + 2
        else:
            assert after == before
    with pytest.raises(ConfigError, match="no map 'map07'.*MAP01"):
        coop_wad(write_wad(original), "map07", 2, 64)
    # a WAD with a MAPINFO of its own keeps it, and gets no second one
    own = [("MAPINFO", b"map MAP01 \"mine\" { }\n")] + original
    assert [n for n, _ in read_wad(coop_wad(write_wad(own), "map01", 3, 64))] == [n for n, _ in own]


def test_a_scenario_whose_map_is_not_a_wad_is_a_config_error(tmp_path):
    (tmp_path / "mine.wad").write_text("not a wad")
    (tmp_path / "mine.cfg").write_text("doom_scenario_path = mine.wad\n")
    with pytest.raises(ConfigError, match=r"env.scenario: .*mine.wad .* is not a WAD file.*set env.add_starts, "
                                          r"env.fresh_inventory and env.own_kills to false"):
        coop_scenario_wad(str(tmp_path / "mine.cfg"), None, 2, 64, own_kills=True)
    assert not list(tmp_path.glob("*.tmp"))
    # with nothing to change the file is given to the engine as it is, unread
    assert coop_scenario_wad(str(tmp_path / "mine.cfg"), None, 2, 64, False, False, False) is None


def first_positions(**options) -> np.ndarray:
    env = DoomCoopEnv(scenario="defend_the_center.cfg", players=3, episode_timeout=20,
                      buttons=["ATTACK", "TURN_LEFT", "TURN_RIGHT"], **options)
    try:
        env.reset(seed=1)
        return env._vars[:, [X, Y]].copy()
    finally:
        env.close()


@pytest.mark.slow
def test_players_of_a_single_player_map_spawn_apart_in_a_real_game():
    # Player 1's start stays the host's; the joiners take the added starts in the order they join
    apart = first_positions()
    assert apart[0].tolist() == [0.0, 0.0]
    assert sorted(apart[1:].tolist()) == [[0.0, -64.0], [0.0, 64.0]]
    stacked = first_positions(add_starts=False)
    assert np.allclose(stacked, stacked[0])


AMMO, HEALTH = VARIABLES.index("SELECTED_WEAPON_AMMO"), VARIABLES.index("HEALTH")


def episode_starts(**options) -> list[list[float]]:
    """Each player's (ammo, health) at the start of 4 episodes of basic.cfg, both players firing
    throughout and alive when each episode ends (at its timeout, or when the monster dies)."""
    env = DoomCoopEnv(scenario="basic.cfg", players=2, respawn=False, episode_timeout=60, buttons=["ATTACK"],
                      actions=[[], ["ATTACK"]], **options)
    fire = 1
    starts = []
    try:
        for episode in range(4):
            env.reset(seed=episode)
            starts.append(env._vars[:, [AMMO, HEALTH]].tolist())
            while env.agents:
                env.step({a: fire for a in env.agents})
            assert (env._vars[:, HEALTH] > 0).all()
    finally:
        env.close()
    return starts


@pytest.mark.slow
def test_every_episode_starts_with_the_maps_ammo_and_health_in_a_real_game():
    """A network game restarts episodes through a level change, which keeps the inventory of living
    players: their pistol ammo runs down over episodes unless the copy resets it. The engine has
    been seen to hand a player a fresh inventory on a level change now and then (once, on another
    CPU), so the copy-less control asks for ammo carried over into some later episode, not all."""
    fresh = episode_starts()
    assert fresh == [[[50.0, 100.0], [50.0, 100.0]]] * 4
    kept = episode_starts(fresh_inventory=False)
    assert kept[0] == fresh[0]
    assert any(ammo < 50.0 for start in kept[1:] for ammo, _ in start), kept
