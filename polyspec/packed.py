"""oneDNN-prepacked linear layers for frozen models on CPU in bf16 (the target, the decoder's drafters).

``nn.Linear`` hands oneDNN a plain row-major weight and oneDNN reorders nothing ahead of time, so at the few rows a
speculative step verifies, the bf16 GEMM is neither memory-bound nor flat. Measured on the 2-core avx512_bf16 host
(FACTS.md), the default target's head [262144, 640]: 21 ms at 1 row, 32 ms at 10, 41 ms at 16 with ``nn.Linear``;
14 ms flat up to 12 rows with the weight reordered once into oneDNN's blocked layout and multiplied by
``torch.ops.mkldnn._linear_pointwise`` (the op torch.compile's CPU freezing pass emits for frozen linears). With
every linear of the target packed, a target forward at context 200 went from 47.5 to 38 ms at 1 token and from
61 to 44 ms at 10, logits bit-identical (``python -m decoder.costs`` prints the curve on any machine).

    n = pack_linears(model)          # 0 when not CPU + bf16, or the ops are missing: nothing changes

The packed copy costs the weights' size again in memory; ``.weight`` stays the module's parameter (tied
embeddings, ``state_dict`` and everything that reads the weight see the original). With autograd on, the
module falls back to ``F.linear``: only inference runs the packed op.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def packing_available(weight: torch.Tensor) -> bool:
    """CPU, bf16, and this torch build has oneDNN's linear reorder and pointwise ops."""
    ops = getattr(torch.ops, "mkldnn", None)
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))


class PackedLinear(nn.Module):
    """``nn.Linear`` whose inference GEMM reads a oneDNN-reordered copy of the weight."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return F.linear(x, self.weight, self.bias)
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]).contiguous(), self.packed, self.bias,
                                               "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, packed=oneDNN"


def pack_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` (CPU, bf16) by a ``PackedLinear``; returns how many. A first
    layer whose packed output differs from ``F.linear`` beyond bf16 rounding stops it (nothing replaced)."""
    found = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear and packing_available(child.weight)]
    if not found:
        return 0
    try:
        probe = PackedLinear(found[0][2])
        x = torch.randn(3, probe.in_features, dtype=torch.bfloat16)
        with torch.inference_mode():
            ok = torch.allclose(probe(x).float(), F.linear(x, probe.weight, probe.bias).float(), rtol=2e-2, atol=2e-2)
    except RuntimeError:
        return 0
    if not ok:
        return 0
    for i, (parent, name, child) in enumerate(found):
        setattr(parent, name, probe if i == 0 else PackedLinear(child))  # the probe is the first layer's, packed once
    return len(found)
