"""``precision: bfloat16``: the update's convolutions and matmuls in bfloat16 (torch's autocast),
weights, gradients, Adam's moments and the action distributions in float32, and learning as in
float32."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

import marlkit
from conftest import LEARNING
from marlkit.precision import loss_precision, update_precision
from marlkit.api import build_config
from marlkit.config import ConfigError, ModelConfig
from marlkit.networks.distributions import ActionHead
from marlkit.random_streams import GeneratorNoise
from marlkit.registry import get_agent
from marlkit.spec import EnvSpec, GroupSpec
from marlkit.storage import Bootstrap, Collected, StorageLayout, Transition

E, T, A, VIEW, ACTIONS = 4, 8, 3, (13, 13, 5), 5


def _cnn_mappo(precision: str):
    cfg = build_config("MAPPO", "mpe_spread", **{"agents.MAPPO.precision": precision}).agents["MAPPO"]
    cfg.actor = ModelConfig(name="cnn", hidden_sizes=[64])
    cfg.epochs, cfg.minibatches = 2, 2
    group = GroupSpec("agents", [f"agent_{i}" for i in range(A)], spaces.Box(0, 255, VIEW, np.uint8),
                      spaces.Discrete(ACTIONS))
    return get_agent("MAPPO")(group, EnvSpec({"agents": group}, (7,)), cfg, seed=0)


def _batch(agent):
    """A full rollout of random views acted on by ``agent`` (acting is float32 in both precisions),
    as the batch its update learns from."""
    rng = np.random.default_rng(0)
    storage = agent.make_storage(StorageLayout(agent.group, agent.env, E, T))
    rollout = storage.next_rollout()
    mask, allowed = np.ones((E, A), bool), np.ones((E, A, ACTIONS), bool)
    for _ in range(T):
        obs = rng.integers(0, 256, (E, A, *VIEW)).astype(np.uint8)
        state = rng.normal(size=(E, 7)).astype(np.float32)
        out = agent.act(obs, state, mask, allowed, None)
        rollout.add(Transition(obs, state, mask, allowed, out.actions, out.log_prob, out.value,
                               rng.normal(size=(E, A)).astype(np.float32), np.zeros((E, A), bool),
                               np.zeros((E, A), bool), np.zeros(E, bool), obs, state))
    return storage.finish(Collected(rollout, Bootstrap(obs, state, mask, allowed, None)))


def test_bfloat16_runs_the_updates_layers_in_bfloat16_and_keeps_weights_gradients_and_adam_float32():
    agents = {p: _cnn_mappo(p) for p in ("float32", "bfloat16")}
    start = [p.detach().clone() for p in agents["float32"].modules.parameters()]
    layers, metrics = {}, {}
    for precision, agent in agents.items():
        # the same weights and the same batch: only the precision of the update differs
        assert all(torch.equal(a, b) for a, b in zip(start, agent.modules.parameters()))
        data = agent.training_data(_batch(agent))   # values and advantages: float32 in both
        seen = layers[precision] = set()
        heads = {id(m.linear) for m in agent.modules.modules() if isinstance(m, ActionHead)}

        def record(m, inputs, out, seen=seen, heads=heads):
            seen.add(("ActionHead" if id(m) in heads else type(m).__name__, out.dtype))
        hooks = [m.register_forward_hook(record) for m in agent.modules.modules()
                 if isinstance(m, (nn.Conv2d, nn.Linear))]
        metrics[precision] = agent.optimise(data, T)
        for hook in hooks:
            hook.remove()
    assert layers["float32"] == {("Conv2d", torch.float32), ("Linear", torch.float32), ("ActionHead", torch.float32)}
    assert layers["bfloat16"] == {("Conv2d", torch.bfloat16), ("Linear", torch.bfloat16),
                                  ("ActionHead", torch.float32)}
    low = agents["bfloat16"]
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in low.modules.parameters())
    moments = [v for state in low.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    assert moments and all(v.dtype == torch.float32 for v in moments)
    # the same update to about bfloat16's 3 digits, and not the very same one
    for key in ("policy_loss", "value_loss", "entropy"):
        assert metrics["bfloat16"][key] == pytest.approx(metrics["float32"][key], rel=0.05, abs=2e-3), key
    moved = [(a - s, b - s) for a, b, s in zip(agents["float32"].modules.parameters(), low.modules.parameters(), start)]
    assert any(not torch.equal(a, b) for a, b in moved)
    step32 = torch.cat([a.flatten() for a, _ in moved])
    step16 = torch.cat([b.flatten() for _, b in moved])
    assert torch.nn.functional.cosine_similarity(step32, step16, dim=0) > 0.9


def test_the_action_distribution_stays_float32_under_autocast():
    agent = _cnn_mappo("bfloat16")
    obs = torch.randint(0, 256, (1, 2, A, *VIEW), dtype=torch.uint8)
    with loss_precision(agent.device, "bfloat16"):
        dist, _ = agent.policy(obs, torch.zeros(1, 2, 7), None, torch.zeros(1, 2, A, dtype=torch.bool), None)
    assert dist.log_probs.dtype == torch.float32
    assert torch.allclose(dist.log_probs.exp().sum(-1), torch.ones(1, 2, A))


def test_features_in_bfloat16_fill_the_present_slots_beside_absent_ones():
    """CUDA's autocast leaves the encoder's features in bfloat16 where copying them beside the absent
    slots' zeros needs them float32 (CPU's autocast promotes that copy itself, so this CPU cannot
    show it): a forward hook stands in for CUDA's autocast here (no GPU)."""
    agent = _cnn_mappo("bfloat16")
    obs = torch.randint(0, 256, (1, 2, A, *VIEW), dtype=torch.uint8)
    present = torch.tensor([[[True, False, True], [False, True, True]]])
    hook = agent.modules["actor"].register_forward_hook(lambda m, i, out: (out[0].bfloat16(), out[1]))
    try:
        features, _ = agent.actor.encode(agent.modules["actor"], obs, None, None, ids=False, present=present)
    finally:
        hook.remove()
    assert features.dtype == torch.float32
    assert not features[~present].any()                      # absent slots: zeros, never encoded
    assert features[present].abs().sum(-1).gt(0).all()


@pytest.mark.parametrize("space", [spaces.Discrete(ACTIONS), spaces.MultiDiscrete([3, 4]), spaces.Box(-1, 1, (2,))])
def test_the_action_heads_logits_are_computed_in_float32_under_autocast(space):
    """The head's own product in float32 too, not only its output cast back: logits rounded to
    bfloat16 put the log-probs of a PPO ratio off by a percent against acting's."""
    head = ActionHead(space, 64)
    with torch.no_grad():
        head.linear.weight.normal_()
        # features as autocast's layers before the head give them: bfloat16
        features = (torch.randn(256, 64) * 3).to(torch.bfloat16)
        plain = head(features.float())
        with loss_precision(torch.device("cpu"), "bfloat16"):
            under = head(features)
        action = plain.sample(GeneratorNoise(torch.Generator().manual_seed(0)))
    assert torch.equal(under.log_prob(action), plain.log_prob(action))
    assert under.log_prob(action).dtype == torch.float32


@pytest.mark.slow
def test_mappo_in_bfloat16_learns_on_mpe_spread(tiny):
    """As MAPPO in float32 does (tests/test_agents.py): clearly better than the random policy
    (about -26.6) within 30k env steps, its MLPs' matmuls in bfloat16: -21.6 here (seeds 2 and 3
    gave -21.3 and -22.8 with the packaged env workers)."""
    run = marlkit.run(agent="MAPPO", env="mpe_spread", seed=1, **{**tiny, **LEARNING, "runner.total_steps": 30_000,
                                                                  "agents.MAPPO.precision": "bfloat16"})
    late = np.mean([r["agents"] for r in run.episode_returns[-64:]])
    assert late > -26.6 + 2.0, late


def test_a_precision_not_offered_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"agents\.MAPPO\.precision.*half.*float32.*bfloat16"):
        build_config("MAPPO", "mpe_spread", **{"agents.MAPPO.precision": "half"})


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["AVX2", "AVX512_CORE_VNNI"])
def test_a_cpu_without_bfloat16_instructions_updates_auto_in_float32_and_warns_of_bfloat16_once(isa):
    """oneDNN held to an instruction set without bfloat16 (``ONEDNN_MAX_CPU_ISA``), as on a CPU
    that has none: AVX2, or AVX-512 as a Skylake or Cascade Lake Xeon has it, on which oneDNN's own
    check passes and emulates bfloat16. ``auto`` runs float32 there, and a run asking for bfloat16
    is told once that it is slower."""
    script = ("import logging, torch\n"
              "logging.basicConfig()\n"
              "from marlkit.precision import cpu_has_bfloat16, loss_precision, update_precision\n"
              "assert not cpu_has_bfloat16()\n"
              "assert update_precision('auto', torch.device('cpu')) == 'float32'\n"
              "for asked in ('bfloat16', 'bfloat16', 'float32', 'bfloat16'):\n"
              "    with loss_precision(torch.device('cpu'), asked):\n"
              "        torch.ones(2, 2) @ torch.ones(2, 2)\n")
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "ONEDNN_MAX_CPU_ISA": isa},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "bfloat16 instructions" in line]
    assert len(warned) == 1 and "set the agent's precision to float32" in warned[0], done.stderr


@pytest.mark.parametrize("agent", ["MAPPO", "IPPO", "MAT", "COMA"])
def test_every_on_policy_agent_updates_in_bfloat16(tiny, agent):
    run = marlkit.run(agent=agent, env="mpe_spread", seed=1, **{**tiny, f"agents.{agent}.precision": "bfloat16"})
    assert run.steps == 40
    losses = {k: v for k, v in run.metrics.items() if k.startswith("agents/") and k.endswith("_loss")}
    assert losses and all(np.isfinite(v) for v in losses.values()), run.metrics


def test_a_resumed_run_updates_in_the_precision_it_began_with(caplog):
    """``auto`` decides per device, so a run resumed on another machine keeps what its checkpoint
    says it began with (and says so); weights loaded into a new run, or a precision the config
    names, decide afresh. The checkpoint is this machine's, its ``precision`` set to the one this
    CPU would not pick, as another machine's would be."""
    here = _cnn_mappo("auto").precision
    there = "float32" if here == "bfloat16" else "bfloat16"
    state = _cnn_mappo("auto").state_dict()
    assert state["precision"] == here
    state["precision"] = there
    resumed = _cnn_mappo("auto")
    with caplog.at_level("WARNING", logger="marlkit.agents.on_policy"):
        resumed.load_state_dict(state)
    assert resumed.precision == there
    assert any(f"resumed in {there}" in r.getMessage() for r in caplog.records), caplog.text
    fresh = _cnn_mappo("auto")
    fresh.load_state_dict(state, weights_only=True)
    assert fresh.precision == here
    named = _cnn_mappo(here)
    named.load_state_dict(state)
    assert named.precision == here


def test_auto_on_a_gpu_is_float32_and_a_named_precision_is_kept(monkeypatch):
    """No GPU here: ``auto`` on a CUDA device must not ask this CPU (which may have AVX512-BF16)
    nor the GPU. On an H200, bfloat16 slowed the packaged image updates at every size measured."""
    monkeypatch.setattr("marlkit.precision.cpu_has_bfloat16", lambda: True)
    assert update_precision("auto", torch.device("cpu")) == "bfloat16"
    assert update_precision("auto", torch.device("cuda", 1)) == "float32"
    assert update_precision("bfloat16", torch.device("cuda", 1)) == "bfloat16"
    assert update_precision("float32", torch.device("cuda", 1)) == "float32"
