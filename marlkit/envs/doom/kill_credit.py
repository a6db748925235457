"""Each player's own kills, as a game variable: lumps for the co-op copy of a scenario's WAD.

ViZDoom's ``KILLCOUNT`` is the level's count of dead monsters: every player reads the same number,
monsters killed by monsters included. The engine knows who killed what (a monster's ``target`` is
its killer when it dies), and ACS can read it, so the co-op WAD copy gets:

- a DECORATE lump that replaces every monster class that counts as a kill (the stock Doom
  monsters of ``vizdoom.pk3`` and the scenario's own) with a subclass whose death states first
  run one ACS script, then go on as before; scripts that spawn monsters by class name get the
  subclass (ZDoom spawns replacements);
- an ACS library (``LOADACS``, between ``A_START``/``A_END``) with that script: it makes the dead
  monster's killer the activator (``SetActivatorToTarget``) and, when the killer is player ``p``,
  adds 1 to ACS global variable ``FIRST_VARIABLE + p``, which ViZDoom reads as ``USER<FIRST_VARIABLE + p>``.

A monster killed by another monster (infighting), a barrel or a crusher is credited to no one.
No ACS compiler is needed: the library is a handful of p-codes in ACS's first (``ACS\\0``)
format, assembled here; the opcode and function numbers are ZDoom's (``p_acs.h``), which only
ever appends new ones.
"""
from __future__ import annotations

import re
import struct
import zipfile
from functools import lru_cache
from pathlib import Path

SCRIPT = 997           # the crediting script's number (scenario scripts use small numbers)
FIRST_VARIABLE = 40    # ACS global variable (= ViZDoom USER variable) of player 0's kills
MAX_PLAYERS = 8
LIBRARY = "MKKILLS"    # the library lump's name

# ZDoom p-codes and ACS functions (p_acs.h / p_acs.cpp)
_TERMINATE, _PUSHNUMBER, _DROP, _CASEGOTO, _INCGLOBALVAR, _PLAYERNUMBER, _CALLFUNC = 1, 3, 54, 84, 188, 247, 351
_SET_ACTIVATOR_TO_TARGET = 13


def kills_variable(player: int) -> str:
    """The ViZDoom game variable that holds ``player``'s own kills."""
    return f"USER{FIRST_VARIABLE + player}"


def credit_library() -> bytes:
    """The ACS library: script ``SCRIPT`` (closed, no arguments) credits the activator's killer."""
    code: list[int] = [_PUSHNUMBER, 0, _CALLFUNC, 1, _SET_ACTIVATOR_TO_TARGET, _DROP, _PLAYERNUMBER]
    cases = []
    for p in range(MAX_PLAYERS):       # CASEGOTO pops the value and jumps when it matches
        cases.append(len(code) + 2)
        code += [_CASEGOTO, p, 0]
    code += [_DROP, _TERMINATE]        # not a player: no one to credit
    for p, at in enumerate(cases):
        code[at] = 8 + 4 * len(code)   # byte offset in the lump
        code += [_INCGLOBALVAR, FIRST_VARIABLE + p, _TERMINATE]
    directory = struct.pack("<iiii", 1, SCRIPT, 8, 0) + struct.pack("<i", 0)   # 1 script; no strings
    return b"ACS\0" + struct.pack("<i", 8 + 4 * len(code)) + struct.pack(f"<{len(code)}i", *code) + directory


# ---------------------------------------------------------------------- DECORATE

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_ACTOR = re.compile(r"^[ \t]*actor[ \t]+([\w.]+)(?:[ \t]*:[ \t]*([\w.]+))?(?:[ \t]+replaces[ \t]+([\w.]+))?",
                    re.IGNORECASE | re.MULTILINE)
_DEATH_LABEL = re.compile(r"(?<![:\w])(X?Death(?:\.\w+)*)\s*:(?!:)", re.IGNORECASE)


def _blocks(text: str):
    """(name, parent, replaces, body) of every actor in DECORATE ``text``."""
    text = _COMMENTS.sub("", text)
    for m in _ACTOR.finditer(text):
        start = text.find("{", m.end())
        if start < 0:
            continue
        depth, i = 0, start
        while i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        yield m.group(1), m.group(2), m.group(3), text[start + 1:i]


def parse_actors(text: str) -> dict[str, dict]:
    """Per actor (lower-cased name): its name, parent, the class it replaces, whether its body
    sets COUNTKILL (True, False, or None: inherited) and its death state labels."""
    actors = {}
    for name, parent, replaces, body in _blocks(text):
        flags = re.findall(r"([+-])\s*COUNTKILL\b", body, re.IGNORECASE)
        if flags:
            countkill = flags[-1] == "+"
        elif re.search(r"^\s*monster\s*$", body, re.IGNORECASE | re.MULTILINE):
            countkill = True
        else:   # Skip_Super starts from a blank actor: nothing is inherited (the corpse decorations)
            countkill = False if re.search(r"\bskip_super\b", body, re.IGNORECASE) else None
        states = body[body.lower().find("states"):] if "states" in body.lower() else ""
        actors[name.lower()] = {"name": name, "parent": parent.lower() if parent else None,
                                "replaces": replaces.lower() if replaces else None, "countkill": countkill,
                                "deaths": [d for d in dict.fromkeys(_DEATH_LABEL.findall(states))]}
    return actors


@lru_cache(maxsize=1)
def stock_actors() -> dict[str, dict]:
    """The Doom actors vizdoom ships (``actors/doom/*.txt`` of ``vizdoom.pk3``)."""
    import vizdoom
    pk3 = Path(vizdoom.__file__).parent / "vizdoom.pk3"
    with zipfile.ZipFile(pk3) as z:
        text = "\n".join(z.read(n).decode("latin-1") for n in sorted(z.namelist())
                         if n.startswith("actors/doom/") and n.endswith(".txt"))
    return parse_actors(text)


def credited_decorate(scenario_decorate: str = "") -> str:
    """DECORATE replacing every class that counts as a kill with a subclass whose death states
    run the crediting script first. Classes the scenario replaces itself are left to its
    replacement (which gets the hook in turn)."""
    actors = {**stock_actors(), **parse_actors(scenario_decorate)}

    def inherited(key: str, field: str):
        seen = set()
        while key in actors and key not in seen:
            seen.add(key)
            value = actors[key][field]
            if value not in (None, []):
                return value
            key = actors[key]["parent"]
        return None

    def deaths(key: str) -> list[str]:
        out, seen = [], set()
        while key in actors and key not in seen:
            seen.add(key)
            out += [d for d in actors[key]["deaths"] if d.lower() not in {o.lower() for o in out}]
            key = actors[key]["parent"]
        return out

    replaced = {a["replaces"] for a in actors.values() if a["replaces"]}
    hooks = []
    for key, actor in actors.items():
        labels = deaths(key)
        if not inherited(key, "countkill") or not labels or key in replaced:
            continue
        name = actor["name"]
        states = "".join(f"\t{label}:\n\t\tTNT1 A 0 ACS_ExecuteAlways({SCRIPT}, 0)\n\t\tGoto Super::{label}\n"
                         for label in labels)
        hooks.append(f"actor MarlkitCredited{name.replace('.', '_')} : {name} replaces {name}\n"
                     f"{{\n\tStates\n\t{{\n{states}\t}}\n}}\n")
    return "// marlkit: every kill is credited to its killer (marlkit/envs/doom/kill_credit.py)\n" + "\n".join(hooks)


def kill_credit_lumps(scenario_decorate: str = "") -> list[tuple[str, bytes]]:
    """The lumps to add to a WAD (after its own DECORATE, which they must follow)."""
    return [("DECORATE", credited_decorate(scenario_decorate).encode("latin-1")),
            ("LOADACS", LIBRARY.encode("ascii") + b"\n"),
            ("A_START", b""), (LIBRARY, credit_library()), ("A_END", b"")]
