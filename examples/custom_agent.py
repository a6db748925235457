"""A new algorithm is a subclass plus ``@register_agent``: here MAPPO whose entropy bonus decays
linearly to zero over training, with its own typed config.

    python examples/custom_agent.py --list
    python examples/custom_agent.py --agent MAPPO_ENT_DECAY --env mpe_spread --set runner.total_steps=5000
    marlkit --import custom_agent --agent MAPPO_ENT_DECAY --env mpe_spread   # with examples/ on PYTHONPATH

Running this file is the ``marlkit`` command with the new agent registered: every CLI flag works.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from marlkit.agents.mappo import MAPPO
from marlkit.agents.on_policy import OnPolicyConfig
from marlkit.registry import register_agent


@dataclass
class EntropyDecayConfig(OnPolicyConfig):
    # YAML: agents: {MAPPO_ENT_DECAY: {entropy_coef: 0.02, decay_until: 0.5}}
    decay_until: float = field(default=1.0, metadata={"min": 0.0, "max": 1.0})


@register_agent("MAPPO_ENT_DECAY")
class EntropyDecayMAPPO(MAPPO):
    """MAPPO whose entropy coefficient falls linearly to 0 by the fraction ``decay_until`` of
    ``runner.total_steps``; the runner hands ``update`` the training progress, so the schedule
    needs no state of its own and resumes exactly."""

    config_cls = EntropyDecayConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start_entropy_coef = self.cfg.entropy_coef

    def update(self, batch, progress=None):
        done = progress.fraction / self.cfg.decay_until if progress is not None and self.cfg.decay_until else 0.0
        self.cfg.entropy_coef = self.start_entropy_coef * max(1.0 - done, 0.0)
        metrics = super().update(batch, progress)
        metrics["entropy_coef"] = self.cfg.entropy_coef
        return metrics


if __name__ == "__main__":
    from marlkit.cli import main

    raise SystemExit(main())
