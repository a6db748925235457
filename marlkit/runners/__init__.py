from marlkit.runners.runner import Runner, RunResult

__all__ = ["Runner", "RunResult"]
