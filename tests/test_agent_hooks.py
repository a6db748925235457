"""The agent base's hooks leave MAPPO and IPPO bit-identical.

The golden files under ``tests/data/agent_hooks/`` hold the weights, metrics and episode returns of
short fixed-seed runs. A deliberate change of an algorithm's maths regenerates its file
(``python tests/test_agent_hooks.py CASE``) and says why in the commit.

Bit-identity only means something with kernels that give the same bits on every x86-64 CPU: with
torch's default (AVX512 or AVX2) kernels the same run differs at about 1e-6 between an Intel and an
AMD machine. So each case runs in a process of its own with scalar ATen kernels, MKL's conditional
numerical reproducibility and oneDNN off (``DETERMINISTIC``), in which the runs were made too; there
they agree bit for bit whichever instruction set MKL is allowed to use.
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).parent / "data" / "agent_hooks"
DETERMINISTIC = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE,STRICT"}
SCRIPTED = {"description": "scripted", "env": {"type": "pettingzoo", "factory": "toy_envs:scripted",
                                               "kwargs": {"length": 7}}}
GRU = {"name": "gru", "hidden_sizes": [32], "rnn_hidden": 32}

# name -> (agent, env, overrides): mpe_spread for the plain path; the scripted env for agents that
# die and appear mid-episode, truncation finals and (with a GRU) the hidden-state plumbing. MAPPO's
# golden runs are of its critic on the global state (critic_input: state), the one they were made with.
CASES = {
    "mappo_spread": ("MAPPO", "mpe_spread", {"agents.MAPPO.critic_input": "state"}),
    "ippo_spread": ("IPPO", "mpe_spread", {}),
    "mappo_gru_scripted": ("MAPPO", "scripted", {"agents.MAPPO.actor": GRU, "agents.MAPPO.critic": GRU,
                                                 "agents.MAPPO.chunk_length": 5,
                                                 "agents.MAPPO.critic_input": "state"}),
    "ippo_scripted": ("IPPO", "scripted", {"agents.IPPO.epochs": 3, "agents.IPPO.minibatches": 2}),
}


def _run(case: str, root: Path) -> dict:
    """One golden case in this process (which must have started with ``DETERMINISTIC`` set)."""
    import marlkit
    agent, env, extra = CASES[case]
    if env == "scripted":
        import yaml
        env = str(root / "scripted.yaml")
        Path(env).write_text(yaml.safe_dump(SCRIPTED))
    torch.backends.mkldnn.enabled = False
    result = marlkit.run(agent=agent, env=env, seed=5, **{
        "runner.run_root": str(root / "runs"), "runner.progress": False, "logger": "none",
        "runner.parallels": 2, "runner.horizon": 10, "runner.total_steps": 60, "runner.save_interval": 60,
        "runner.vectorize": "sync", **extra})   # collection and update take turns, as when the runs were made
    modules = torch.load(result.run_dir / "latest.pt", weights_only=False)["groups"]["agents"]["modules"]
    metrics = {k: v for k, v in result.metrics.items() if not k.startswith("perf/")}
    return {"modules": modules, "metrics": metrics, "episode_returns": result.episode_returns}


def _run_deterministic(case: str, out: Path) -> dict:
    """One golden case in a fresh process with CPU-independent kernels, its result saved to ``out``."""
    subprocess.run([sys.executable, __file__, "--run", case, str(out)], check=True,
                   env={**os.environ, **DETERMINISTIC}, cwd=Path(__file__).parent)
    return torch.load(out, weights_only=False)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_mappo_and_ippo_match_their_golden_runs_bit_for_bit(case, tmp_path):
    golden = torch.load(GOLDEN / f"{case}.pt", weights_only=False)
    now = _run_deterministic(case, tmp_path / "now.pt")
    assert now["metrics"] == golden["metrics"]
    assert now["episode_returns"] == golden["episode_returns"]
    assert now["modules"].keys() == golden["modules"].keys()
    for name, value in golden["modules"].items():
        torch.testing.assert_close(now["modules"][name], value, rtol=0, atol=0, msg=name)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    if sys.argv[1:2] == ["--run"]:   # a child of _run_deterministic
        case, out = sys.argv[2], Path(sys.argv[3])
        with tempfile.TemporaryDirectory() as tmp:
            torch.save(_run(case, Path(tmp)), out)
    else:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name in sys.argv[1:] or CASES:
            _run_deterministic(name, GOLDEN / f"{name}.pt")
            print("wrote", GOLDEN / f"{name}.pt")
