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
    """A vector-env worker died, hung or raised; the message names the env index."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl+C or SIGTERM stopped a run; the message says what was saved and how to resume."""
