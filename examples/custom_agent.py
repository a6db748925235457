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
from marlkit.config import OnPolicyConfig
from marlkit.registry import register_agent


@dataclass
class EntropyDecayConfig(OnPolicyConfig):
    # YAML: agents: {MAPPO_ENT_DECAY: {entropy_coef: 0.02, decay_updates: 500}}
    decay_updates: int = field(default=1000, metadata={"min": 1})


@register_agent("MAPPO_ENT_DECAY")
class EntropyDecayMAPPO(MAPPO):
    """MAPPO whose entropy coefficient falls linearly to 0 over ``decay_updates`` updates."""

    config_cls = EntropyDecayConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start_entropy_coef = self.cfg.entropy_coef
        self.updates_done = 0

    def update(self, bootstrap):
        fraction = min(self.updates_done / self.cfg.decay_updates, 1.0)
        self.cfg.entropy_coef = self.start_entropy_coef * (1.0 - fraction)
        self.updates_done += 1
        metrics = super().update(bootstrap)
        metrics["entropy_coef"] = self.cfg.entropy_coef
        return metrics

    def state_dict(self):
        return {**super().state_dict(), "updates_done": self.updates_done}

    def load_state_dict(self, state, weights_only=False):
        super().load_state_dict(state, weights_only)
        if not weights_only:
            self.updates_done = state["updates_done"]


if __name__ == "__main__":
    from marlkit.cli import main

    raise SystemExit(main())
