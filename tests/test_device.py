"""With ``device: cuda`` the update runs on the GPU while the env workers act on the CPU. Runs where
torch sees a CUDA GPU; elsewhere skipped (the CPU half, the workers' CPU copies of the policy, is
tested in test_worker_acting.py)."""
import numpy as np
import pytest
import torch

import marlkit

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("agent", ["MAPPO", "QMIX"])
def test_the_update_runs_on_the_gpu_while_cpu_workers_act(tiny, agent):
    run = marlkit.run(agent=agent, env="mpe_spread", device="cuda", seed=1, **{
        **tiny, "runner.parallels": 4, "runner.horizon": 25, "runner.vectorize": "subprocess", "runner.workers": 2,
        "runner.total_steps": 1000, f"agents.{agent}.{'batch_size' if agent == 'QMIX' else 'epochs'}": 4})
    assert run.steps == 1000
    assert all(np.isfinite(v) for k, v in run.metrics.items() if not k.startswith("perf/"))
    saved = torch.load(run.run_dir / "latest.pt", weights_only=False, map_location=None)
    weights = [v for v in saved["groups"]["agents"]["modules"].values() if v.is_floating_point()]
    assert weights and all(v.device.type == "cuda" for v in weights)   # learned on the GPU
