from marlkit.runners.pettingzoo import Runner, RunResult

__all__ = ["Runner", "RunResult"]
