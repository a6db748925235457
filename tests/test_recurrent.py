"""Recurrent agents train on exactly the memory they acted with, also where single agents' episodes
end while their env goes on (per-agent episodes, ``tests/toy_envs.py:FieldsEnv``)."""
from pathlib import Path

import pytest
import yaml

import torch

import marlkit
from marlkit.agents.ippo import IPPO
from marlkit.agents.mappo import MAPPO
from marlkit.config import ConfigError
from marlkit.registry import register_agent

GRU = {"name": "gru", "hidden_sizes": [16], "rnn_hidden": 16}


def _first_update(tiny, agent, lengths, length=40, **extra):
    """One update of one epoch and one minibatch: its approx_kl compares the log-probs that training
    recomputes with those acting drew, before any gradient step."""
    env = Path(tiny["runner.run_root"]).parent / "fields.yaml"
    env.write_text(yaml.safe_dump({"description": "per-agent episodes",
                                   "env": {"type": "fields", "lengths": lengths, "length": length}}))
    settings = {**tiny, "runner.parallels": 2, "runner.horizon": 20, "runner.total_steps": 40,
                f"agents.{agent}.epochs": 1, f"agents.{agent}.minibatches": 1,
                f"agents.{agent}.actor": GRU, f"agents.{agent}.critic": GRU, **extra}
    return marlkit.run(agent=agent, env=str(env), imports=["toy_envs"], seed=3, **settings)


@pytest.mark.parametrize("agent", ["MAPPO", "IPPO"])
@pytest.mark.parametrize("lengths, length", [([3, 5, 7], 40), ([50, 50, 50], 8)],
                         ids=["per_agent_ends", "env_ends_only"])
def test_training_replays_the_memory_acting_had(tiny, agent, lengths, length):
    run = _first_update(tiny, agent, lengths, length)
    assert run.steps == 40 and run.episode_returns     # 20 steps per env: episodes ended inside the rollout
    assert run.metrics["agents/approx_kl"] < 1e-7


class _Replaying:
    """An agent whose loss also reports how far the critic's values in training are from those it
    gave while acting (stored in the rollout; no value normalisation, so they are compared as they
    are). Module-level classes: the env workers that act get the agents pickled by name."""

    def loss(self, batch):
        loss, metrics = super().loss(batch)
        with torch.no_grad():
            value, _ = self.values(batch["obs"], batch["state"], self.split_hidden(batch["hidden"][0])[1],
                                   batch["episode_start"])
            metrics["value_replay_error"] = (value - batch["old_value"]).abs().max()
        return loss, metrics


@register_agent("MAPPO_replaying")
class MAPPOReplaying(_Replaying, MAPPO):
    pass


@register_agent("IPPO_replaying")
class IPPOReplaying(_Replaying, IPPO):
    pass


@pytest.mark.parametrize("agent", ["MAPPO_replaying", "IPPO_replaying"])
def test_a_recurrent_critic_keeps_one_memory_per_agent(tiny, agent):
    """MAPPO's critic reads one global state, but each agent's value is of its own episode: its memory
    resets where the agent's episode starts, in acting and training alike."""
    run = _first_update(tiny, agent, [3, 5, 7], **{f"agents.{agent}.value_norm": False})
    assert run.metrics["agents/value_replay_error"] < 1e-5
    assert run.metrics["agents/approx_kl"] < 1e-7


@pytest.mark.parametrize("agent, message", [
    ("COMA", r"agents\.COMA\.actor\.name: 'gru' is recurrent, but COMA's actor is feed-forward"),
    ("MAT", r"agents\.MAT\.actor: MAT does not use this setting"),
])
def test_agents_that_are_not_recurrent_refuse_a_recurrent_model_at_config_time(tiny, agent, message):
    with pytest.raises(ConfigError, match=message):
        _first_update(tiny, agent, [3, 5, 7])
    assert not Path(tiny["runner.run_root"]).exists()


def test_the_gru_runs_each_stretch_between_episode_starts_as_the_step_by_step_recurrence_would():
    """One GRU call per stretch with no episode start gives the per-step recurrence's features, final
    memory and gradients to float rounding; a start zeroes the memory of its own row only."""
    from marlkit.config import ModelConfig
    from marlkit.networks.rnn import GRU as GRUModel
    torch.manual_seed(0)
    model = GRUModel((6,), ModelConfig(name="gru", hidden_sizes=[8], rnn_hidden=8))
    length, batch = 12, 4
    x = torch.randn(length, batch, 6)
    hidden = torch.randn(batch, 8)
    starts = torch.zeros(length, batch, dtype=torch.bool)
    starts[3, 0] = starts[3, 2] = starts[8, 1] = starts[0, 3] = True   # a start at step 0 is the caller's

    features, last = model(x, hidden, starts)
    assert features.shape == (length, batch, 8) and last.shape == (batch, 8)

    h, steps = hidden, []
    for t in range(length):
        if t > 0:
            h = h * (~starts[t]).unsqueeze(-1).float()
        z = model.mlp(x[t])
        h = model.gru(z.unsqueeze(0), h.unsqueeze(0))[1].squeeze(0)
        steps.append(model.norm(h))
    torch.testing.assert_close(features, torch.stack(steps), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(last, h, rtol=1e-6, atol=1e-6)

    grads = torch.autograd.grad(features.square().sum(), list(model.parameters()))
    step_grads = torch.autograd.grad(torch.stack(steps).square().sum(), list(model.parameters()))
    for a, b in zip(grads, step_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    # row 0's memory after its start at step 3 is the same as a fresh run from step 3 on
    fresh, _ = model(x[3:, :1], torch.zeros(1, 8))
    torch.testing.assert_close(features[3:, :1], fresh, rtol=1e-6, atol=1e-6)
