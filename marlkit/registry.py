"""Name -> class registries for agents, env types and network models.

A new algorithm, env adapter or network is one decorated class; the CLI, ``--list`` and the YAML
configs pick it up by name with no other edit.
"""
from __future__ import annotations

import difflib
import re
from typing import Callable, TypeVar

from marlkit.errors import UnknownNameError

T = TypeVar("T")

REGISTRY: dict[str, type] = {}
"""Agent name (as typed after ``--agent``) -> agent class."""

ENV_REGISTRY: dict[str, type] = {}
"""Env type (the ``env.type`` key of a YAML) -> env builder class."""

MODEL_REGISTRY: dict[str, type] = {}
"""Model name (the ``model.name`` key of an agent config) -> network class."""


def _register(table: dict[str, type], kind: str, name: str) -> Callable[[T], T]:
    def decorator(cls: T) -> T:
        if name in table and table[name] is not cls:
            raise ValueError(f"{kind} name {name!r} is already registered to {table[name].__qualname__}")
        table[name] = cls
        cls.registered_name = name  # type: ignore[attr-defined]
        return cls

    return decorator


def register_agent(name: str):
    """Class decorator: ``@register_agent("MYPPO")`` makes ``--agent MYPPO`` work."""
    return _register(REGISTRY, "agent", name)


def register_env(name: str):
    """Class decorator for env builders, selected by ``env.type`` in a YAML."""
    return _register(ENV_REGISTRY, "env type", name)


def register_model(name: str):
    """Class decorator for networks, selected by ``model.name`` in an agent config."""
    return _register(MODEL_REGISTRY, "model", name)


def closest(name: str, choices) -> str:
    """' (did you mean X?)' for the closest valid name, or '' when nothing is close."""
    match = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def lookup(table: dict[str, type], kind: str, name: str) -> type:
    _load_builtins(table)
    if name not in table:
        valid = ", ".join(sorted(table))
        hint = (f"; if {name!r} is your own {kind}, pass --import <module> (the module that registers it)"
                if kind in ("agent", "model", "env type") else "")
        raise UnknownNameError(f"unknown {kind} {name!r}{closest(name, table)}; valid {kind}s: {valid}{hint}")
    return table[name]


def get_agent(name: str) -> type:
    return lookup(REGISTRY, "agent", name)


def get_env_type(name: str) -> type:
    return lookup(ENV_REGISTRY, "env type", name)


def get_model(name: str) -> type:
    return lookup(MODEL_REGISTRY, "model", name)


def builtin_agents() -> dict[str, str]:
    """Name -> first docstring line of every agent shipped in ``marlkit/agents``, read from the
    source so that ``--list`` answers without importing torch."""
    import ast
    from pathlib import Path
    found = {}
    for path in sorted((Path(__file__).parent / "agents").glob("*.py")):
        tree = ast.parse(path.read_text())
        module_doc = ast.get_docstring(tree) or ""
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            for dec in node.decorator_list:
                if (isinstance(dec, ast.Call) and getattr(dec.func, "id", None) == "register_agent"
                        and dec.args and isinstance(dec.args[0], ast.Constant)):
                    found[dec.args[0].value] = first_sentence(ast.get_docstring(node) or module_doc)
    return found


def first_sentence(doc: str) -> str:
    """The first sentence of a docstring's first paragraph, whole, on one line (``--list``)."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    end = re.search(r"[.!?](\s|$)", paragraph)
    return paragraph[:end.start() + 1] if end else paragraph


def _load_builtins(table: dict | None = None) -> None:
    """Import the built-in packages so their @register_* decorators run; only the one a lookup needs,
    so that an env worker process never imports torch."""
    import importlib
    packages = {id(REGISTRY): "marlkit.agents", id(ENV_REGISTRY): "marlkit.envs", id(MODEL_REGISTRY): "marlkit.networks"}
    for key, package in packages.items():
        if table is None or id(table) == key:
            importlib.import_module(package)
