"""Every error marlkit raises on purpose, in one light module: the CLI catches them without
importing torch or the env stack."""


class ConfigError(ValueError):
    """Bad configuration; the message names the key, the value and the fix."""


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
