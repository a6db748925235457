"""Every error marlkit raises on purpose, and the one policy that turns them into exit codes, in
one light module: the CLI and the study catch them without importing torch or the env stack.

Exit codes: 0 done, 1 failed (an env or the training broke), 2 bad input (settings, names, files),
130 interrupted (Ctrl+C or SIGTERM; what was saved is said).
"""
from __future__ import annotations

import signal
import sys
from typing import Callable

DONE, FAILED, BAD_INPUT, INTERRUPTED = 0, 1, 2, 130


class ConfigError(ValueError):
    """Bad configuration; the message names the key, the value and the fix."""


class UnknownNameError(KeyError):
    """A name that is not in a registry; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0])


class CheckpointMismatchError(ValueError):
    """A checkpoint that belongs to another agent, env or group."""


class TrainingDivergedError(RuntimeError):
    """A loss or gradient became NaN/inf; the last good checkpoint is kept."""


class EnvAPIError(RuntimeError):
    """An env broke its own API; the message names the agent and the step."""


class EnvWorkerError(RuntimeError):
    """A vector-env worker died, hung or raised; the message (one line) names the env index, and
    ``worker_traceback`` holds the worker's traceback where it raised."""

    def __init__(self, message: str, worker_traceback: str | None = None):
        super().__init__(message)
        self.worker_traceback = worker_traceback

    def __reduce__(self):
        return type(self), (str(self), self.worker_traceback)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl+C or SIGTERM stopped a run; the message says what was saved and how to resume."""


# what a user can fix in what they typed or pointed at (exit 2), and what broke while running (exit 1)
BAD_INPUT_ERRORS = (ConfigError, UnknownNameError, FileNotFoundError, CheckpointMismatchError)
RUN_ERRORS = (EnvAPIError, EnvWorkerError, TrainingDivergedError)


def exit_code(work: Callable[[], int], prog: str = "marlkit",
              unstarted: str = "interrupted before the run started; nothing was saved") -> int:
    """``work()``, with marlkit's errors and stops each reported on stderr (a line per line of the
    message, after ``prog``) -> its exit code; ``unstarted`` is said of a Ctrl+C that came before
    a run could save anything."""
    try:
        return work()
    except BAD_INPUT_ERRORS as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"{prog}: error: {line}", file=sys.stderr)
        return BAD_INPUT
    except RUN_ERRORS as exc:
        # a note says what a failed training run saved and how to continue it
        print(f"{prog}: {type(exc).__name__}: {'; '.join([str(exc), *getattr(exc, '__notes__', [])])}",
              file=sys.stderr)
        return FAILED
    except RunInterrupted as exc:
        print(f"{prog}: {exc}; envs closed", file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:
        print(f"{prog}: {unstarted}", file=sys.stderr)
        return INTERRUPTED


def process_exit_code(returncode: int) -> int:
    """A marlkit process's exit code as the policy above reads it: one killed by SIGINT or SIGTERM
    before its handlers were set was interrupted all the same."""
    return INTERRUPTED if returncode in (-signal.SIGINT, -signal.SIGTERM) else returncode
