"""``runners.optimizer.AdamW``: torch's AdamW to the bit, without importing ``torch._dynamo``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runners.optimizer import AdamW

ROOT = Path(__file__).resolve().parents[1]

# trains a small model 6 steps from a fixed seed with the optimizer named by argv[1], passes its state dict through
# load_state_dict, and saves the weights and the state dict; says whether torch._dynamo was imported meanwhile
TRAIN = """
import sys
import torch
from runners.optimizer import AdamW

def train(make, fused):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = make([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=1e-2,
                     betas=(0.9, 0.95), fused=fused)
    for step in range(6):
        x = torch.randn(8, 16)
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
        if step == 2:  # as a checkpoint and its resume do
            optimizer.load_state_dict(optimizer.state_dict())
    return {"weights": [p.detach().clone() for p in model.parameters()], "state": optimizer.state_dict()}

make = AdamW if sys.argv[1] == "ours" else torch.optim.AdamW
torch.save({fused: train(make, fused) for fused in (True, False)}, sys.argv[2])
print("torch._dynamo" in sys.modules)
"""


def trained(which: str, tmp_path: Path) -> tuple[dict, bool]:
    out = tmp_path / f"{which}.pt"
    done = subprocess.run([sys.executable, "-c", TRAIN, which, str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return torch.load(out), done.stdout.strip() == "True"


def same(a: object, b: object) -> bool:
    """Bitwise equality of nested state dicts, lists and tensors."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.slow
def test_it_trains_to_the_bit_as_torchs_adamw_and_never_imports_dynamo(tmp_path):
    ours, ours_dynamo = trained("ours", tmp_path)
    torchs, torchs_dynamo = trained("torch", tmp_path)
    assert not ours_dynamo, "runners.optimizer.AdamW imported torch._dynamo"
    assert torchs_dynamo, "torch's AdamW no longer imports torch._dynamo: runners.optimizer can go"
    for fused in (True, False):
        assert same(ours[fused]["weights"], torchs[fused]["weights"]), f"fused={fused}: other weights"
        assert same(ours[fused]["state"], torchs[fused]["state"]), f"fused={fused}: another state dict"


def test_it_loads_torchs_state_dict_and_keeps_hooks_and_grad_mode():
    """A checkpoint written with ``torch.optim.AdamW`` resumes in it, and the other way round; step hooks run once
    a step; the update runs without autograd, and the caller's grad mode comes back."""
    weight = torch.nn.Parameter(torch.ones(3))
    theirs = torch.optim.AdamW([weight], lr=0.1)
    weight.grad = torch.full((3,), 0.5)
    theirs.step()
    ours = AdamW([weight], lr=0.1)
    ours.load_state_dict(theirs.state_dict())
    assert same(ours.state_dict(), theirs.state_dict())
    calls: list[str] = []
    ours.register_step_pre_hook(lambda *_: calls.append("pre"))
    ours.register_step_post_hook(lambda *_: calls.append("post"))
    before = weight.detach().clone()
    ours.step()
    assert calls == ["pre", "post"] and not torch.equal(weight, before) and torch.is_grad_enabled()
    assert weight.grad_fn is None and ours.state_dict()["state"][0]["step"].item() == 2
    ours.zero_grad()
    assert weight.grad is None
