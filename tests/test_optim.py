"""marlkit's Adam and gradient clipping give torch's bits and read and write torch's state_dict, and
building and stepping them does not import PyTorch's compiler package."""
import subprocess
import sys

import pytest
import torch
from torch import nn

from marlkit.optim import Adam, clip_grad_norm


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(7, 16), nn.ReLU(), nn.LayerNorm(16), nn.Linear(16, 3))


def _groups(model: nn.Module) -> list[dict]:
    return [{"params": list(model[0].parameters()), "lr": 3e-3},
            {"params": list(model[2].parameters()) + list(model[3].parameters()), "lr": 1e-3}]


def _train(model: nn.Module, optimizer, clip, steps: int, seed: int = 0) -> list[float]:
    data = torch.Generator().manual_seed(seed)
    norms = []
    for i in range(steps):
        x = torch.randn(32, 7, generator=data)
        loss = model(x).pow(2).mean()
        if i % 3 == 2:   # a parameter without a gradient this step is left alone, state and all
            loss = loss + 0.0 * model[0].weight.sum()
        optimizer.zero_grad()
        loss.backward()
        if i % 3 == 1:
            model[0].bias.grad = None
        norms.append(float(clip(list(model.parameters()), 1.3)))
        optimizer.step()
        optimizer.param_groups[1]["lr"] *= 0.9   # a schedule changes lr between steps
    return norms


class _TorchAdam(torch.optim.Adam):
    def zero_grad(self):
        super().zero_grad(set_to_none=True)


@pytest.mark.exact
def test_adam_and_clipping_give_torchs_bits():
    ours, theirs = _model(1), _model(1)
    norms = _train(ours, Adam(_groups(ours), eps=1e-5), clip_grad_norm, 12)
    expected = _train(theirs, _TorchAdam(_groups(theirs), eps=1e-5, fused=True), nn.utils.clip_grad_norm_, 12)
    assert norms == expected
    assert min(norms) < 1.3 < max(norms)   # clipping scaled some steps and left others
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


@pytest.mark.exact
def test_state_dict_goes_both_ways_with_torchs_adam():
    """A checkpoint written by torch's Adam loads into marlkit's and training continues with the
    same bits, and the other way round."""
    model, reference = _model(2), _model(2)
    ours = Adam(_groups(model), eps=1e-5)
    theirs = _TorchAdam(_groups(reference), eps=1e-5, fused=True)
    _train(model, ours, clip_grad_norm, 4)
    _train(reference, theirs, nn.utils.clip_grad_norm_, 4)
    mine = ours.state_dict()
    assert mine["param_groups"] == theirs.state_dict()["param_groups"]
    assert mine["state"].keys() == theirs.state_dict()["state"].keys()

    swapped_ours = Adam(_groups(reference), eps=1e-5)
    swapped_ours.load_state_dict(theirs.state_dict())
    swapped_theirs = _TorchAdam(_groups(model), eps=1e-5, fused=True)
    swapped_theirs.load_state_dict(mine)
    _train(reference, swapped_ours, clip_grad_norm, 3, seed=1)
    _train(model, swapped_theirs, nn.utils.clip_grad_norm_, 3, seed=1)
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_a_state_of_other_group_sizes_is_refused():
    model = _model(3)
    with pytest.raises(ValueError, match=r"groups of sizes \[2, 4\], this optimiser \[6\]"):
        Adam([{"params": list(model.parameters()), "lr": 1e-3}]).load_state_dict(Adam(_groups(model)).state_dict())


@pytest.mark.parametrize("key,value", [("weight_decay", 0.01), ("amsgrad", True), ("maximize", True)])
def test_a_setting_it_does_not_implement_is_refused(key, value):
    groups = _groups(_model(4))
    groups[1][key] = value
    with pytest.raises(ValueError, match=rf"parameter group 1: {key}={value!r} is not supported by marlkit's Adam"):
        Adam(groups)


def test_no_compiler_import():
    code = ("import sys, torch; from marlkit.optim import Adam, clip_grad_norm\n"
            "m = torch.nn.Linear(3, 1); o = Adam([{'params': m.parameters(), 'lr': 1e-3}])\n"
            "m(torch.ones(2, 3)).sum().backward(); clip_grad_norm(list(m.parameters()), 1.0); o.step()\n"
            "o.load_state_dict(o.state_dict()); print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
