"""oneDNN-prepacked linear layers for frozen models on CPU, bf16 and fp32 (the target, the decoder's
drafters).

``nn.Linear`` hands the BLAS a plain row-major weight and nothing is reordered ahead of time, so at
the few rows a speculative step verifies the GEMM is neither memory-bound nor flat. The weight is
reordered once into oneDNN's blocked layout and multiplied by ``torch.ops.mkldnn._linear_pointwise``
(the op torch.compile's CPU freezing pass emits for frozen linears). Packed, the default target's
head costs less than with ``nn.Linear`` and grows less with the rows, in bf16 and in fp32; the rows
the reorder is told to expect matter, so each dtype has its hint (``ROWS_HINT``).
``python -m decoder.calibrate.costs`` prints the whole target's curve on any machine (evidence:
docs/experiments.md#packed-linears-on-cpu).

fp32 packed at that hint is also *batch-invariant*: a row's output is bitwise the same whether the
GEMM has 1 or 16 rows (MKL's ``F.linear`` is not: its 1-row GEMV and k-row GEMM round differently).
So in a k-token verification the packed linears compute what a 1-token forward computes. Small fp32
weights stay ``nn.Linear`` (``MIN_NUMEL``).

    # 0 on GPUs, on dtypes other than fp32/bf16, where the ops are missing or where this CPU cannot
    # run them (bf16 packing needs AVX512BW-class CPUs)
    n = pack_linears(model)

The packed copy costs the weights' size again in memory; ``.weight`` stays the module's parameter
(tied embeddings, ``state_dict`` and everything that reads the weight see the original). With
autograd on, the module falls back to ``F.linear``: only inference runs the packed op.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn
from torch.nn import functional as F

# The rows oneDNN's reorder is told to expect (its ``batch_size`` argument picks the blocked
# layout). bf16: 1 (flat as it is); fp32: 8 (flat up to 12 rows, and batch-invariant) (evidence:
# docs/experiments.md#packed-linears-on-cpu)
ROWS_HINT = {torch.bfloat16: 1, torch.float32: 8}
# The smallest weight (elements) packed by default. oneDNN's fp32 call costs ~55 µs however small
# the GEMM, so small fp32 weights stay with MKL; from 1024×640 up packing wins. bf16 packs every
# linear (evidence: docs/experiments.md#packed-linears-on-cpu)
MIN_NUMEL = {torch.bfloat16: 0, torch.float32: 1 << 19}
# How close a packed probe must come to ``F.linear`` before anything is swapped: rounding of the
# dtype, no more.
_PROBE_TOL = {torch.bfloat16: 2e-2, torch.float32: 1e-4}


def packing_available(weight: torch.Tensor) -> bool:
    """CPU, bf16 or fp32, this torch build has oneDNN's linear reorder and pointwise ops, and this
    CPU runs them for the weight's dtype (oneDNN's bf16 path needs AVX512-BF16, AVX-NE-CONVERT or
    AVX512BW/VL/DQ: not on AVX2 CPUs)."""
    return weight.device.type == "cpu" and weight.dtype in ROWS_HINT and _cpu_can_pack(weight.dtype)


@functools.cache
def _cpu_can_pack(dtype: torch.dtype) -> bool:
    ops = getattr(torch.ops, "mkldnn", None)
    if not (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    ):
        return False
    try:
        ops._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), ROWS_HINT[dtype])
    # "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"
    except RuntimeError:
        return False
    return True


class PackedLinear(nn.Module):
    """``nn.Linear`` whose inference GEMM reads a oneDNN-reordered copy of the weight.

    The copy follows the weight: it is made again when the weight changes in place, is replaced
    (``.to``, ``.float``, ``load_state_dict``) or is deep-copied (the copy is dropped and rebuilt on
    the next call; oneDNN's opaque tensor cannot be copied). Off the CPU, or in a dtype that is not
    packed, the layer is a plain ``F.linear``."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed, self._packed_for = None, None
        self._repack_if_stale()

    def _repack_if_stale(self) -> bool:
        """Whether a current packed copy exists (made now if the weight changed since it was
        made)."""
        w = self.weight
        if not packing_available(w):
            self.packed, self._packed_for = None, None
            return False
        try:
            version = w._version
        # an inference-mode tensor keeps no version counter (and cannot be changed in place)
        except RuntimeError:
            version = None
        key = (w.data_ptr(), w.dtype, tuple(w.shape), version)
        if key != self._packed_for:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), ROWS_HINT[w.dtype])
            self._packed_for = key
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        ) or not self._repack_if_stale():
            return F.linear(x, self.weight, self.bias)
        y = torch.ops.mkldnn._linear_pointwise(
            x.reshape(-1, x.shape[-1]).contiguous(), self.packed, self.bias, "none", [], ""
        )
        return y.view(*x.shape[:-1], self.out_features)

    # deepcopy / pickle: oneDNN's opaque tensor has no storage to copy; rebuilt on use
    def __getstate__(self):
        return {**self.__dict__, "packed": None, "_packed_for": None}

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, "
            f"packed=oneDNN({str(self.weight.dtype).removeprefix('torch.')})"
        )


# the invariant mode's linears that cannot be packed (polyspec.exact): rows padded to a multiple of
# ROW_BLOCK, up to MAX_ROWS rows (a decode-time forward; more is a prefill, computed once for every
# method)
ROW_BLOCK, MAX_ROWS = 16, 64


class RowInvariantLinear(nn.Module):
    """``nn.Linear`` whose GEMM always has a multiple of ``ROW_BLOCK`` rows (zero-padded), so that a
    row is multiplied by the same kernel whether 1 or ``ROW_BLOCK`` rows share the call. For the
    invariant mode where the linear cannot be prepacked (``polyspec.packed``): CUDA, or a CPU
    without oneDNN for the dtype; or a packed layer whose kernel rounds a lone row otherwise.

    The wrapped layer (``nn.Linear``, ``PackedLinear``, any linear) is the kernel, not a child
    module: its ``weight`` and ``bias`` are this module's own parameters, so ``state_dict`` keys and
    ``named_parameters`` stay the plain model's (``q_proj.weight``, never ``q_proj.inner.weight``)
    and whatever copies, saves or hashes a target's weights by name sees the same names in either
    mode."""

    def __init__(self, linear: nn.Module):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # the same Parameter objects (tied embeddings and .weight readers see the original)
        self.weight, self.bias = linear.weight, linear.bias
        # plain attribute, not a submodule: its parameters are registered once, here
        object.__setattr__(self, "kernel", linear)

    def _kernel(self) -> nn.Module:
        """The wrapped layer, pointed at this module's parameters again if they were replaced
        (``load_state_dict(assign=True)``, ``tie_weights``, a conversion that makes new ones)."""
        k = self.kernel
        if k.weight is not self.weight:
            k.weight = self.weight
        if k.bias is not self.bias:
            k.bias = self.bias
        return k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        n = flat.shape[0]
        if n > MAX_ROWS:  # a prefill: shared by every method (polyspec.exact), not padded
            return self._kernel()(x)
        pad = -n % ROW_BLOCK
        if pad:
            flat = torch.cat([flat, flat.new_zeros(pad, flat.shape[1])])
        return self._kernel()(flat)[:n].view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"row_block={ROW_BLOCK}, kernel={self.kernel!r}"


# Output elements a row-invariance probe compares (over as many random rows as that takes): a
# kernel that rounds otherwise at 1 row flips ~1 bf16 element in 4,000, so the probe sees ~16.
_PROBE_ELEMENTS = 1 << 16


@torch.inference_mode()
def rows_invariant(layer: nn.Module) -> bool:
    """Whether ``layer`` (a linear) gives each row bitwise the same output alone (a plain decoding
    step) as inside a ``ROW_BLOCK``-row GEMM (a verification), probed on seeded random rows. Not
    everywhere so: on AMD Zen 4 (AVX512-BF16, no AMX) oneDNN's packed GEMM, bf16 and fp32, takes
    another kernel for 1 row than for 2 or more once the input has over 1024 features (evidence:
    docs/experiments.md#exact-mode-on-amd-zen-4-a-lone-rows-kernel-2026-12-02-code-d2a9b6a--this-fix)."""
    w = layer.weight
    rows = min(1024, max(ROW_BLOCK, -(-_PROBE_ELEMENTS // layer.out_features)))
    rows = -(-rows // ROW_BLOCK) * ROW_BLOCK
    g = torch.Generator(device=w.device).manual_seed(0)
    x = torch.randn(rows, layer.in_features, generator=g, device=w.device).to(w.dtype)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(rows)])
    together = torch.cat([layer(x[i : i + ROW_BLOCK]) for i in range(0, rows, ROW_BLOCK)])
    return torch.equal(alone, together)


def pack_linears(model: nn.Module, min_numel: int | None = None) -> int:
    """Nothing when the environment sets ``POLYSPEC_PACK=0`` (every stage then runs plain
    ``nn.Linear``: to measure a benchmark both ways). Otherwise replace every ``nn.Linear`` of
    ``model`` (CPU, bf16 or fp32) whose weight has at least ``min_numel`` elements (default:
    ``MIN_NUMEL`` of its dtype) by a ``PackedLinear``; returns how many. Per dtype, a first layer
    that this CPU cannot pack, or whose packed output differs from ``F.linear`` beyond the dtype's
    rounding, leaves that dtype's layers as they were (``packing_available`` already left out what
    this CPU cannot pack)."""
    if os.environ.get("POLYSPEC_PACK", "1").lower() in ("0", "false", "no", "off"):
        return 0
    found = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
        and packing_available(child.weight)
        and child.weight.numel()
        >= (MIN_NUMEL[child.weight.dtype] if min_numel is None else min_numel)
    ]
    swapped = 0
    for dtype in ROWS_HINT:
        layers = [f for f in found if f[2].weight.dtype == dtype]
        if not layers:
            continue
        try:
            probe = PackedLinear(layers[0][2])
            x = torch.randn(3, probe.in_features, dtype=dtype)
            with torch.inference_mode():
                tol = _PROBE_TOL[dtype]
                ok = torch.allclose(
                    probe(x).float(),
                    F.linear(x, probe.weight, probe.bias).float(),
                    rtol=tol,
                    atol=tol,
                )
        except RuntimeError:
            continue
        if not ok:
            continue
        for i, (parent, name, child) in enumerate(layers):
            # the probe is the first layer's, packed once
            setattr(parent, name, probe if i == 0 else PackedLinear(child))
        swapped += len(layers)
    return swapped
