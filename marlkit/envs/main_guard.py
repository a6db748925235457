"""Refuse, in one line, to spawn worker processes from a script that would run itself again.

Python's ``spawn`` and ``forkserver`` start methods start a worker by importing the parent's main
script anew (as ``__mp_main__``). A script that calls marlkit at its top level, outside
``if __name__ == "__main__":``, would then start the whole run again inside every worker, and
multiprocessing answers with a RuntimeError per worker, one traceback after another.
"""
from __future__ import annotations

import ast
import os
import sys

from marlkit.errors import ConfigError


def _guarded_lines(source: str) -> list[tuple[int, int]]:
    """Line ranges of the bodies of ``if __name__ == "__main__":`` blocks at a module's top level."""
    ranges = []
    for node in ast.parse(source).body:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1
                and isinstance(node.test.ops[0], ast.Eq)):
            sides = [node.test.left, *node.test.comparators]
            names = {s.id for s in sides if isinstance(s, ast.Name)}
            values = {s.value for s in sides if isinstance(s, ast.Constant)}
            if names == {"__name__"} and values == {"__main__"}:
                ranges.append((node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno))
    return ranges


def check_main_guarded(what: str, instead: str | None = None) -> None:
    """Raise a ConfigError when the main script is running its top level right now (it called us
    from there) and that line is not inside an ``if __name__ == "__main__":`` block, or when it is
    no file at all (``python - < script.py``), so that workers could not import it. ``what`` says
    what is about to start worker processes, and ``instead`` a setting that would not start them,
    for the message."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and (spec.name == "__main__" or spec.name.endswith(".__main__")):
        return   # ``python -m package``: multiprocessing does not import a package's __main__ again
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file and not os.path.exists(main_file):
        raise ConfigError(f"the main script is {main_file} (read from standard input, not a file), and {what} start "
                          "worker processes by importing the main script again, which they cannot do; save the "
                          "script to a file and run that" + (f", or {instead}" if instead else ""))
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__"):
        frame = frame.f_back
    path = frame.f_globals.get("__file__") if frame is not None else None
    if frame is None or not path:
        return   # not called from a script's top level (a function, -c, an interactive session)
    try:
        with open(path) as fh:
            ranges = _guarded_lines(fh.read())
    except (OSError, SyntaxError, ValueError):
        return
    line = frame.f_lineno
    if any(first <= line <= last for first, last in ranges):
        return
    raise ConfigError(f"{path}, line {line}, starts marlkit at the top level of the script, and {what} start "
                      "worker processes by importing that script again, which would start the run again in "
                      "each of them; put the code that runs marlkit under `if __name__ == \"__main__\":`")
