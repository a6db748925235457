"""The co-op copy of a scenario's WAD: a start per player, a fresh inventory every episode, and
each player's own kills counted (``kill_credit.py``).

Most ViZDoom scenarios are single-player maps: one player start, no deathmatch starts. In a co-op
game ZDoom then puts every player on that one spot, and a respawning player kills whoever stands
there (measured on ``defend_the_center.cfg``: dozens of deaths per player per episode with random
play). ``coop_scenario_wad`` writes a copy of the scenario's WAD whose map has a start per player,
placed in a row beside player 1's start and facing the same way, and leaves every other lump
(scripts, nodes, decorate) byte for byte as it was.

Only UDMF maps (a ``TEXTMAP`` lump: every scenario shipped with vizdoom) are edited; a map with
several start spots (more player starts, or deathmatch starts) is left alone: ZDoom already
spreads the players over them.

In a network game ViZDoom starts each episode with ``changemap``, a level exit, through which
the players alive keep their inventory and health (measured: basic.cfg's pistol ammo 50 -> 44 ->
39 -> ... -> 0 over episodes, defend_the_center's health 100 -> 56 -> 12). A ``MAPINFO`` lump
giving the map ``ResetInventory`` and ``ResetHealth`` (in a cluster of its own: ZDoom resets
only on entering a map of a non-hub cluster) makes every episode start as in single-player;
a WAD with a MAPINFO of its own keeps it, untouched.
"""
from __future__ import annotations

import hashlib
import math
import os
import re
import struct
import tempfile
from pathlib import Path

from marlkit.config import ConfigError
from marlkit.envs.doom.kill_credit import kill_credit_lumps

PLAYER_START_TYPES = [1, 2, 3, 4, 4001, 4002, 4003, 4004]   # editor numbers of player 1..8 starts
DEATHMATCH_START = 11
FRESH_CLUSTER = 57   # a cluster number the stock MAPINFOs leave free
_THING = re.compile(r"thing\s*(?://[^\n]*)?\s*\{([^}]*)\}", re.IGNORECASE)
_MAP_NAME = re.compile(r"MAP\d\d|E\dM\d")
_FIELD = re.compile(r"(\w+)\s*=\s*([^;]+);")


def read_cfg_value(cfg_path: str, key: str) -> str | None:
    """A value of a ViZDoom ``.cfg`` (keys are case- and underscore-insensitive, like vizdoom's)."""
    want = key.replace("_", "").lower()
    for line in Path(cfg_path).read_text(errors="replace").splitlines():
        line = line.split("#", 1)[0]
        if "=" in line:
            k, v = line.split("=", 1)
            if k.strip().replace("_", "").lower() == want:
                return v.strip()
    return None


def scenario_wad(cfg_path: str) -> Path:
    """The WAD a scenario ``.cfg`` names (relative paths are relative to the cfg, as in vizdoom)."""
    name = read_cfg_value(cfg_path, "doom_scenario_path")
    if not name:
        raise ConfigError(f"env.scenario: {cfg_path} names no doom_scenario_path (the map's .wad); add "
                          "one, or set env.add_starts: false and env.fresh_inventory: false")
    path = Path(name)
    return path if path.is_absolute() else Path(cfg_path).parent / path


def read_wad(data: bytes) -> list[tuple[str, bytes]]:
    """The lumps of a WAD, in order, as (name, bytes)."""
    if data[:4] not in (b"PWAD", b"IWAD") or len(data) < 12:
        raise ValueError("is not a WAD file (no PWAD or IWAD header)")
    count, offset = struct.unpack_from("<ii", data, 4)
    lumps = []
    for i in range(count):
        pos, size, name = struct.unpack_from("<ii8s", data, offset + 16 * i)
        lumps.append((name.rstrip(b"\0").decode("ascii", "replace"), data[pos:pos + size]))
    return lumps


def write_wad(lumps: list[tuple[str, bytes]]) -> bytes:
    body, directory, pos = [], [], 12
    for name, payload in lumps:
        directory.append(struct.pack("<ii8s", pos, len(payload), name.encode("ascii")))
        body.append(payload)
        pos += len(payload)
    return struct.pack("<4sii", b"PWAD", len(lumps), pos) + b"".join(body) + b"".join(directory)


def map_things(textmap: str) -> list[dict[str, str]]:
    return [dict((k.lower(), v.strip()) for k, v in _FIELD.findall(body)) for body in _THING.findall(textmap)]


def added_starts(textmap: str, players: int, spacing: float) -> str:
    """UDMF thing blocks for player starts 2..``players``, '' when the map needs none: it already
    has several start spots (more player starts, or deathmatch starts), over which ZDoom spreads
    players that lack their own start (``deathmatch.cfg`` has three player 1 starts)."""
    things = map_things(textmap)
    types = [int(float(t.get("type", "0"))) for t in things]
    spots = [(t, ty) for t, ty in zip(things, types) if ty in PLAYER_START_TYPES or ty == DEATHMATCH_START]
    if len(spots) != 1 or spots[0][1] != 1:
        return ""
    first = spots[0][0]
    x0, y0 = float(first.get("x", 0)), float(first.get("y", 0))
    angle = int(float(first.get("angle", 0)))
    # Beside player 1, across its facing direction: left, right, further left, ...
    side = (-math.sin(math.radians(angle)), math.cos(math.radians(angle)))
    flags = "".join(f"{flag} = true;\n" for flag in ("skill1", "skill2", "skill3", "skill4", "skill5",
                                                      "single", "dm", "coop"))
    blocks = []
    for player in range(1, players):
        step = (player + 1) // 2 * (1 if player % 2 else -1) * spacing
        blocks.append(f"\nthing\n{{\nx = {x0 + step * side[0]:.3f};\ny = {y0 + step * side[1]:.3f};\n"
                      f"angle = {angle};\ntype = {PLAYER_START_TYPES[player]};\n{flags}}}\n")
    return "".join(blocks)


def fresh_inventory_mapinfo(doom_map: str) -> bytes:
    """A MAPINFO lump that resets inventory and health on every entry into ``doom_map``."""
    name = doom_map.upper()
    return (f"cluster {FRESH_CLUSTER}\n{{\n}}\n\n"
            f"map {name} \"{name}\"\n{{\n\tcluster = {FRESH_CLUSTER}\n\tResetInventory\n\tResetHealth\n}}\n"
            ).encode("ascii")


def coop_wad(wad: bytes, doom_map: str, players: int, spacing: float, add_starts: bool = True,
             fresh_inventory: bool = True, map_from: str = "env.doom_map", own_kills: bool = False) -> bytes | None:
    """``wad`` with the missing starts added to ``doom_map`` (``add_starts``; UDMF maps only), a
    MAPINFO that resets inventory and health every episode (``fresh_inventory``; unless the WAD
    has a MAPINFO) and each player's own kills counted (``own_kills``: ``kill_credit.py``); None
    when nothing changes. ``map_from`` says where the map's name came from, for the error."""
    lumps = read_wad(wad)
    names = [n.upper() for n, _ in lumps]
    if doom_map.upper() not in names:
        maps = [n for n in names if _MAP_NAME.fullmatch(n)]
        raise ConfigError(f"{map_from}: the scenario's WAD has no map {doom_map!r} (it has {', '.join(maps)})")
    changed = False
    at = names.index(doom_map.upper()) + 1
    if add_starts and at < len(lumps) and names[at] == "TEXTMAP":
        textmap = lumps[at][1].decode("latin-1")
        extra = added_starts(textmap, players, spacing)
        if extra:
            lumps[at] = ("TEXTMAP", (textmap + extra).encode("latin-1"))
            changed = True
    if fresh_inventory and not {"MAPINFO", "ZMAPINFO"} & set(names):
        lumps.insert(0, ("MAPINFO", fresh_inventory_mapinfo(doom_map)))
        changed = True
    if own_kills:   # after the WAD's own DECORATE, whose monsters get the hook too
        decorate = "\n".join(data.decode("latin-1") for name, data in lumps if name.upper() == "DECORATE")
        lumps += kill_credit_lumps(decorate)
        changed = True
    return write_wad(lumps) if changed else None


def coop_scenario_wad(cfg_path: str, doom_map: str | None, players: int, spacing: float,
                      add_starts: bool = True, fresh_inventory: bool = True, own_kills: bool = False) -> str | None:
    """Path of the co-op copy of the scenario's WAD (see :func:`coop_wad`), or None when its
    map needs no change. The copy lives in a per-user cache named by its content, so envs and
    runs share it and nothing accumulates."""
    if not (add_starts or fresh_inventory or own_kills):
        return None
    wad_path = scenario_wad(cfg_path)
    if not wad_path.is_file():
        raise ConfigError(f"env.scenario: {cfg_path} names {wad_path}, which does not exist; "
                          "put the .wad there or fix doom_scenario_path in the .cfg")
    map_from = "env.doom_map" if doom_map else f"doom_map of {cfg_path}"
    doom_map = doom_map or read_cfg_value(cfg_path, "doom_map") or "map01"
    try:
        patched = coop_wad(wad_path.read_bytes(), doom_map, players, spacing, add_starts, fresh_inventory, map_from,
                           own_kills)
    except ValueError as exc:   # not a WAD
        raise ConfigError(f"env.scenario: {wad_path} ({cfg_path}'s map) {exc}; set env.add_starts, "
                          "env.fresh_inventory and env.own_kills to false to give it to the engine as it is") from None
    if patched is None:
        return None
    cache = Path(tempfile.gettempdir()) / f"marlkit-wads-{os.getuid()}"   # apart from the matches' work folders
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"{wad_path.stem}-{hashlib.sha1(patched).hexdigest()[:12]}.wad"
    if not target.is_file():
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(patched)
            os.replace(tmp, target)
        except BaseException:
            os.unlink(tmp)
            raise
    return str(target)
