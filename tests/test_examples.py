"""The examples run as documented, on a tiny budget."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(args, tmp_path, **env):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, **env})


@pytest.mark.slow
def test_custom_env_example_trains_through_yaml(tmp_path):
    out = run([str(EXAMPLES / "custom_env.py"), "--steps", "4000", "--run-root", str(tmp_path)], tmp_path)
    assert out.returncode == 0, out.stderr
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("eval return of the walkers")][0]
    before, after = [float(x.split()[0].rstrip(",")) for x in line.split(": ")[1].split(" before training, ")]
    assert after > before      # the walkers learn to meet
    assert list(tmp_path.glob("rendezvous/MAPPO/*/benchmark.json"))


@pytest.mark.slow
def test_custom_agent_example_runs_from_the_cli(tmp_path):
    listing = run([str(EXAMPLES / "custom_agent.py"), "--list"], tmp_path)
    assert "MAPPO_ENT_DECAY" in listing.stdout
    out = run([str(EXAMPLES / "custom_agent.py"), "--agent", "MAPPO_ENT_DECAY", "--env", "mpe_spread",
               "--set", "runner.total_steps=800", "runner.parallels=4", f"runner.run_root={tmp_path}",
               "runner.progress=false", "agents.MAPPO_ENT_DECAY.decay_until=0.5", "--logger", "console"], tmp_path)
    assert out.returncode == 0, out.stderr
    coefs = [float(tok.split("=")[1]) for ln in out.stdout.splitlines() for tok in ln.split()
             if tok.startswith("agents/entropy_coef=")]
    assert coefs and coefs[-1] == 0.0          # decayed to zero halfway through training
    # the same agent through the installed command with --import
    out = run(["-m", "marlkit", "--import", "custom_agent", "--list"], tmp_path, PYTHONPATH=str(EXAMPLES))
    assert "MAPPO_ENT_DECAY" in out.stdout


@pytest.mark.slow
def test_custom_mixer_example_trains_from_the_cli(tmp_path):
    """A VDN subclass with a mixer of its own, registered in one file: it appears in --list, trains
    from the CLI (its mixer's weights move away from their start) and loads through --import."""
    import torch
    listing = run([str(EXAMPLES / "custom_mixer.py"), "--list"], tmp_path)
    assert "WVDN" in listing.stdout
    out = run([str(EXAMPLES / "custom_mixer.py"), "--agent", "WVDN", "--env", "mpe_spread", "--set",
               "runner.total_steps=2000", "runner.parallels=4", "runner.vectorize=sync", f"runner.run_root={tmp_path}",
               "runner.progress=false", "agents.WVDN.initial_weight=0.5", "agents.WVDN.batch_size=8"], tmp_path)
    assert out.returncode == 0, out.stderr
    [latest] = tmp_path.glob("mpe_spread/WVDN/*/latest.pt")
    weights = torch.load(latest, weights_only=False)["groups"]["agents"]["modules"]["mixer.w"]
    assert weights.shape == (3,) and not torch.allclose(torch.nn.functional.softplus(weights), torch.tensor(0.5))
    out = run(["-m", "marlkit", "--import", "custom_mixer", "--list"], tmp_path, PYTHONPATH=str(EXAMPLES))
    assert "WVDN" in out.stdout


@pytest.mark.slow
def test_custom_actor_critic_example_trains_from_the_cli(tmp_path):
    """An actor-critic of one's own (its policy, acting and actor loss) on the off-policy
    actor-critic base: listed, trained from the CLI on continuous actions (its critic's weights move,
    its noise falls to the final value) and loaded through --import."""
    import torch
    listing = run([str(EXAMPLES / "custom_actor_critic.py"), "--list"], tmp_path)
    assert "DECAY_DDPG" in listing.stdout
    out = run([str(EXAMPLES / "custom_actor_critic.py"), "--agent", "DECAY_DDPG", "--env", "mpe_spread_continuous",
               "--set", "runner.total_steps=1200", "runner.parallels=4", "runner.vectorize=sync",
               "runner.log_interval=400", f"runner.run_root={tmp_path}", "runner.progress=false",
               "agents.DECAY_DDPG.learning_starts=400", "agents.DECAY_DDPG.batch_size=32",
               "agents.DECAY_DDPG.decay_steps=800", "--logger", "console"], tmp_path)
    assert out.returncode == 0, out.stderr
    noise = [float(tok.split("=")[1]) for ln in out.stdout.splitlines() for tok in ln.split()
             if tok.startswith("agents/exploration_noise=")]
    assert noise and noise[-1] == pytest.approx(0.05)
    [latest] = tmp_path.glob("mpe_spread_continuous/DECAY_DDPG/*/latest.pt")
    state = torch.load(latest, weights_only=False)["groups"]["agents"]
    assert state["gradient_steps"] > 0
    modules = state["modules"]
    assert not torch.equal(modules["critic_0_head.weight"], modules["target_critic_0_head.weight"])
    out = run(["-m", "marlkit", "--import", "custom_actor_critic", "--list"], tmp_path, PYTHONPATH=str(EXAMPLES))
    assert "DECAY_DDPG" in out.stdout
