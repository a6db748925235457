"""How a rollout ``[T, E, ...]`` is cut into minibatches ``[L, B, ...]``."""
import numpy as np
import pytest
import torch

from marlkit.storage import minibatches


def _rollout(T: int = 6, E: int = 4, A: int = 3) -> dict[str, np.ndarray]:
    step = np.arange(T * E, dtype=np.float32).reshape(T, E)
    return {"step": step, "obs": np.broadcast_to(step[:, :, None, None], (T, E, A, 2)).copy(),
            "image": np.random.default_rng(0).integers(0, 256, (T, E, A, 5, 5, 3), dtype=np.uint8)}


@pytest.mark.parametrize("num_minibatches,chunk_length", [(1, 1), (3, 1), (4, 2), (1, 2), (2, 3)])
def test_every_sample_lands_in_exactly_one_minibatch_with_its_own_rows(num_minibatches, chunk_length):
    data = _rollout()
    batches = list(minibatches(data, num_minibatches, chunk_length, np.random.default_rng(1)))
    assert len(batches) == num_minibatches
    seen = torch.cat([b["step"].reshape(-1) for b in batches])
    assert sorted(seen.tolist()) == list(range(24))
    for b in batches:
        assert b["step"].shape[0] == chunk_length and b["obs"].shape[2:] == (3, 2)
        # the agents of one sample stay together, and a chunk is consecutive steps of one env
        assert torch.equal(b["obs"][..., 0, 0], b["step"])
        assert (torch.diff(b["step"], dim=0) == 4).all()


@pytest.mark.parametrize("num_minibatches,chunk_length", [(1, 1), (3, 1), (2, 3)])
def test_rows_say_where_in_the_rollout_each_sample_lies(num_minibatches, chunk_length):
    """``rows`` [L, B] is each sample's ``t * E + e``: here its step number."""
    for batch in minibatches(_rollout(), num_minibatches, chunk_length, np.random.default_rng(1), rows=True):
        assert batch["rows"].shape == batch["step"].shape and batch["rows"].dtype == torch.int64
        assert torch.equal(batch["rows"].float(), batch["step"])
    assert "rows" not in next(minibatches(_rollout(), 3, 1, np.random.default_rng(1)))


def test_one_minibatch_of_single_steps_is_the_rollout_itself():
    """Its order would change only the float summation order of the gradient, so it is neither
    shuffled nor copied."""
    data = _rollout()
    rng = np.random.default_rng(1)
    [batch] = minibatches(data, 1, 1, rng)
    assert torch.equal(batch["step"], torch.arange(24, dtype=torch.float32).reshape(1, 24))
    assert batch["obs"].shape == (1, 24, 3, 2)
    assert all(batch[k].data_ptr() == data[k].ctypes.data for k in data)
    assert rng.bit_generator.state == np.random.default_rng(1).bit_generator.state   # nothing drawn
