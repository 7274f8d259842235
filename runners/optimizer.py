"""torch's AdamW, run without importing ``torch._dynamo`` where nothing compiles.

``torch.optim.Optimizer`` wraps ``add_param_group``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` in
``torch._disable_dynamo``, and ``Adam.step`` in ``_use_grad_for_differentiable``; each wrapper imports
``torch._dynamo`` at its first call (``torch/_compile.py``, ``torch/optim/optimizer.py``, torch 2.13). That import
costs 1.7 CPU-seconds on a 2-core Intel Xeon (AVX-512, fp32 matmul peak 327 GFLOP/s), as long as importing torch
itself: paid by every process that trains (each ``nas train`` that ``nas rerun`` launches, each search's fork
server), though only ``--compile`` uses Dynamo. (A run of several processes pays it anyway: the constructor of
``DistributedDataParallel`` imports Dynamo.)

Outside a graph that Dynamo traces, the wrappers do nothing but that import:

- ``torch._dynamo.disable(fn)`` only changes what Dynamo does when it traces a caller of ``fn``;
- ``_use_grad_for_differentiable`` puts two ``torch._dynamo.graph_break()`` calls (no-ops in eager mode) around the
  update, which it runs with grad mode set to ``defaults["differentiable"]``.

Nothing here traces an optimizer: ``--compile`` compiles the model's forward alone (``runners.proxy.compile_model``)
and steps the optimizer in eager mode. So each method calls the function torch wrapped (``inspect.unwrap``, through
what ``functools.wraps`` recorded) with the same grad mode: the same update, bit for bit, and the same state dict
(``tests/test_optimizer.py``). Where a torch version wraps nothing, or something else, torch's own method runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch


def _innermost(method: Callable) -> Callable | None:
    """The function that ``method``'s wrappers call in the end, or None where ``method`` is not wrapped."""
    inner = inspect.unwrap(method)
    return None if inner is method else inner


_ADD_PARAM_GROUP = _innermost(torch.optim.Optimizer.add_param_group)
_ZERO_GRAD = _innermost(torch.optim.Optimizer.zero_grad)
_STATE_DICT = _innermost(torch.optim.Optimizer.state_dict)
_LOAD_STATE_DICT = _innermost(torch.optim.Optimizer.load_state_dict)
_STEP = _innermost(torch.optim.Adam.step)  # AdamW's own (AdamW is Adam with decoupled weight decay)


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW``: its arguments, update, hooks and state dict unchanged; see the module's docstring."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if _ADD_PARAM_GROUP is None:
            return super().add_param_group(param_group)
        return _ADD_PARAM_GROUP(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if _ZERO_GRAD is None:
            return super().zero_grad(set_to_none)
        return _ZERO_GRAD(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        if _STATE_DICT is None:
            return super().state_dict()
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if _LOAD_STATE_DICT is None:
            return super().load_state_dict(state_dict)
        return _LOAD_STATE_DICT(self, state_dict)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        if _STEP is None:
            return super().step(closure)
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _STEP(self, closure)
