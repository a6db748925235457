import os
import sys
from pathlib import Path

# make test-exact: test process K (pytest-xdist's worker gwK) runs under the K-th CPU capability
# named here (K modulo their number), set before torch is imported (its kernels are chosen then;
# the processes a test starts inherit it). With several capabilities each process runs every exact
# test (--dist each); with one, the processes share the exact tests out
EXACT_CAPABILITIES = [c for c in os.environ.get("MARLKIT_EXACT_CAPABILITIES", "").split(",") if c]
if EXACT_CAPABILITIES and os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    worker = int(os.environ["PYTEST_XDIST_WORKER"][2:])
    os.environ["ATEN_CPU_CAPABILITY"] = EXACT_CAPABILITIES[worker % len(EXACT_CAPABILITIES)]

import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parent.parent / "benchmarks"))   # benchmarks/grid_battle.py
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


def write_env_yaml(path: Path, factory: str, kwargs: dict | None = None, **sections) -> str:
    """A user-style env YAML around a toy factory; ``sections`` are merged at the top level."""
    data = {"description": "test env", "env": {"type": "pettingzoo", "factory": factory, "kwargs": kwargs or {}}}
    for key, value in sections.items():
        if key == "env":
            data["env"].update(value)
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture
def battle_yaml(tmp_path):
    """The grid battle of ``benchmarks/grid_battle.py`` (teams ``red``, ``blue``; image views, agents
    dying) as an env YAML; keyword arguments add keys to its ``env`` section."""
    def make(n_agents: int = 4, max_cycles: int = 12, **env) -> str:
        return write_env_yaml(tmp_path / "battle.yaml", "grid_battle:make_env",
                              {"n_agents": n_agents, "max_cycles": max_cycles},
                              env={"groups": {"red": ["red_*"], "blue": ["blue_*"]}, **env})
    return make


@pytest.fixture
def env_yaml(tmp_path):
    def make(factory, kwargs=None, name="toy.yaml", **sections):
        return write_env_yaml(tmp_path / name, factory, kwargs, **sections)
    return make


@pytest.fixture
def tiny(tmp_path):
    """Overrides that make any run small, quiet and local to the test."""
    return {"runner.run_root": str(tmp_path / "runs"), "runner.progress": False, "logger": "none",
            "runner.parallels": 2, "runner.horizon": 10, "runner.total_steps": 40,
            "runner.eval_episodes": 2, "runner.eval_parallels": 2, "runner.eval_interval": 20}


# The learning tests' mpe_spread runs: 16 envs of 25 steps, stepped in the test's own process. With
# the other test process keeping the second core busy, the packaged YAML's two env workers cost a
# fifth more CPU for the same run (POCA's 30k steps: 85.8 CPU-seconds against 68.3), all of it pipes.
LEARNING = {"runner.parallels": 16, "runner.horizon": 25, "runner.vectorize": "sync"}


def assert_same_training(a, b, group: str = "agents") -> None:
    """Two runs (``RunResult``) trained alike, bit for bit: steps, metrics (timings aside), episode
    returns and the weights in their ``latest.pt``."""
    assert a.steps == b.steps
    for key, value in a.metrics.items():
        if not key.startswith("perf/"):
            assert b.metrics[key] == value, key
    assert a.episode_returns == b.episode_returns
    wa = torch.load(a.run_dir / "latest.pt", weights_only=False)["groups"][group]["modules"]
    wb = torch.load(b.run_dir / "latest.pt", weights_only=False)["groups"][group]["modules"]
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=0, msg=name)


def assert_close_training(a, b, group: str = "agents", rel: float = 1e-4) -> None:
    """Two runs trained alike up to float rounding: where torch's kernels round a batch of another
    size differently (acting on blocks of other sizes), the last bits of log-probs and values
    differ, and so do, slightly, the metrics and weights; steps, actions and so episodes agree."""
    assert a.steps == b.steps
    for key, value in a.metrics.items():
        if not key.startswith("perf/"):
            assert b.metrics[key] == pytest.approx(value, rel=rel, abs=1e-6), key
    assert len(a.episode_returns) == len(b.episode_returns)
    for x, y in zip(a.episode_returns, b.episode_returns):
        assert x == pytest.approx(y, rel=rel, abs=1e-6)
    wa = torch.load(a.run_dir / "latest.pt", weights_only=False)["groups"][group]["modules"]
    wb = torch.load(b.run_dir / "latest.pt", weights_only=False)["groups"][group]["modules"]
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=rel, atol=1e-6, msg=name)


def best_by_the_rule(evaluations: list[dict]) -> dict:
    """The evaluation best.pt should hold: the first, replaced only by one that beats it by more
    than the noise (``marlkit.runners.statistics.beats``)."""
    from marlkit.runners.statistics import beats
    best = evaluations[0]
    for row in evaluations[1:]:
        if beats(row, best):
            best = row
    return best


def learn_from(agent, transitions, bootstrap, progress=None) -> dict:
    """``agent.update`` on a rollout of ``transitions`` (one per step, ``[E, A, ...]``) and the
    ``bootstrap`` after them, stored as the collector stores them."""
    from marlkit.storage import Collected, StorageLayout
    num_envs = len(transitions[0].agent_mask)
    storage = agent.make_storage(StorageLayout(agent.group, agent.env, num_envs, len(transitions)))
    rollout = storage.next_rollout()
    for transition in transitions:
        rollout.add(transition)
    return agent.update(storage.finish(Collected(rollout, bootstrap)), progress)


def empty_rollout(agent, num_envs: int, horizon: int):
    """The rollout ``agent``'s storage gives a collect of ``num_envs`` envs and ``horizon`` steps."""
    from marlkit.storage import StorageLayout
    return agent.make_storage(StorageLayout(agent.group, agent.env, num_envs, horizon)).next_rollout()


def pytest_report_header(config):
    if EXACT_CAPABILITIES:
        return f"exact tests under each of the CPU capabilities {', '.join(EXACT_CAPABILITIES)}"


def pytest_sessionstart(session):
    """Where a worker was given a capability, its torch must run under it (a typo would not)."""
    wanted = os.environ.get("ATEN_CPU_CAPABILITY") if EXACT_CAPABILITIES else None
    if wanted and torch.backends.cpu.get_cpu_capability().lower() != wanted.lower():
        raise pytest.UsageError(f"ATEN_CPU_CAPABILITY={wanted}, but torch runs "
                                f"{torch.backends.cpu.get_cpu_capability()} kernels")
