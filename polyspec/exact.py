"""Shape-invariant target forwards: each position's logits bitwise the same whether it is computed
alone (plain decoding) or inside a k-token verification or a draft tree — what makes speculative
decoding lossless in bf16 too.

Where a bf16 forward differs today (``tests/polyspec/test_exact.py``; evidence:
docs/experiments.md#lossless-in-bf16-shape-invariant-forwards-2026-11-28-code-910d58d--db05400):

- **attention**: PyTorch's SDPA takes another path for 1 query than for k (and oneDNN's bf16
  ``p @ V`` rounds differently at 1 row than at k rows), so the first layer's attention output
  already differs in the last bit; by the head the logits differ by up to 0.4, enough to flip a
  near-tie.
- the oneDNN-prepacked linears (``polyspec.packed``), norms, rotary embeddings and the head: bitwise
  the same row at 1 and at k rows on the Intel Xeon (AMX) where this was measured (packed bf16 and
  fp32 weights; fp32 weights too small to pack are multiplied by MKL, whose 1-row GEMV and k-row
  GEMM round differently). On AMD Zen 4 (AVX512-BF16, no AMX) a packed layer (bf16 or fp32) with
  more than 1024 input features is not: a lone row takes another kernel.

The invariant mode (``POLYSPEC_EXACT``, ``load_target(..., exact=…)``, ``--exact``) therefore

1. computes decode-time attention (at most ``MAX_ROWS`` query positions) in fp32 with every GEMM at
   one shape: queries in blocks of ``QUERY_BLOCK`` positions (zero-padded), keys and values at their
   *absolute* positions in chunks of ``KEY_CHUNK`` (a sliding layer's dropped keys and a block's
   other rows are zeros or masked), the softmax's sum and ``p·V`` reduced chunk by chunk and the
   chunks added in position order (``cumsum``). A position's output then depends on its query and
   the keys it may see, wherever they sit in the forward. A tree verification's rows see different
   ancestors at the same positions: each row gets its own copy of the tree's chunks, its ancestors
   written at their positions (as plain decoding of that branch has them). Forwards with more rows
   (prefills) keep SDPA — a prompt is prefilled once, the same way, for every method. Where it was
   measured (synthetic tensors of both targets' head shapes, this CPU): a row's slot in a
   fixed-shape block and trailing zero keys do not change its bits; the GEMM's row count (1 vs k
   queries) and shifting the keys by whole chunks inside one GEMM do — hence the fixed block, the
   absolute positions and the chunk-by-chunk sums, where chunks a row cannot see add exact zeros;
2. makes every linear layer row-invariant: packed where this CPU can pack (every size, not only the
   large ones), else (CUDA, CPUs without oneDNN bf16) ``polyspec.packed.RowInvariantLinear``,
   zero-padded to ``ROW_BLOCK`` rows so that one GEMM shape serves 1 to ``ROW_BLOCK`` rows (not
   measured on a GPU yet). A packed shape is probed once at load (``rows_invariant``) and padded
   too where this CPU's kernel rounds a lone row otherwise (AMD Zen 4 without AMX: inputs wider
   than 1024 features).

    # or exact="auto" (POLYSPEC_EXACT, else off)
    target = load_target("gemma3-270m", exact=True)
    # the same on any transformers causal LM; idempotent
    make_exact(model)

vLLM's batch-invariant mode and SGLang's deterministic inference do the same for a server (fixed
reduction orders whatever the batch); this is the single-request version for polyspec's decoder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyspec.errors import PolyspecError

if TYPE_CHECKING:  # torch loads with the model: the decoder's commands parse their arguments first
    import torch
    from torch import nn

NAME = "polyspec_exact"
# query positions one attention GEMM computes (a verification of ≤ 16 tokens: one block)
QUERY_BLOCK = 16
KEY_CHUNK = 64  # keys are zero-padded to a multiple of this (fewer distinct GEMM shapes)
# forwards with more query positions (prefills) run SDPA: computed once, shared by every method
MAX_ROWS = 64
# (polyspec.packed.MAX_ROWS, the row-padded linears' bound, is the same:
# tests/polyspec/test_exact.py holds them equal; this module stays free of torch at import,
# which the bench's CLI needs, so it cannot import packed's)

_MODES = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def add_exact_argument(ap) -> None:
    """``--exact auto|on|off`` for the decoder's commands (passed to ``load_target(exact=…)`` as it
    is)."""
    ap.add_argument(
        "--exact",
        choices=["auto", "on", "off"],
        default="auto",
        help="shape-invariant target forwards, so that speculative greedy output equals plain "
        "decoding in "
        "bf16 too (auto: POLYSPEC_EXACT, else off: it costs 2-19%% of speed on a 2-core CPU)",
    )


def exact_wanted(exact: bool | str | None, device: torch.device, dtype: torch.dtype) -> bool:
    """Resolve the switch: an explicit bool wins; ``None``/``"auto"`` reads ``POLYSPEC_EXACT``
    (1/0/auto), whose ``auto`` turns the invariant mode on where it is measured to cost ≤ 10 %
    (``AUTO_ON``: nowhere yet)."""
    if isinstance(exact, bool):
        return exact
    value = str(
        exact if exact not in (None, "auto") else os.environ.get("POLYSPEC_EXACT", "auto")
    ).lower()
    if value == "auto":
        return (device.type, str(dtype).removeprefix("torch.")) in AUTO_ON
    if value not in _MODES:
        raise PolyspecError(f"POLYSPEC_EXACT / exact must be auto, 1 or 0, not {value!r}")
    return _MODES[value]


# where ``auto`` turns the invariant mode on (device type, dtype): where it costs ≤ 10 % of speed.
# None yet: on a 2-core bf16 CPU it costs up to ~20 % (evidence:
# docs/experiments.md#lossless-in-bf16-shape-invariant-forwards-2026-11-28-code-910d58d--db05400)
AUTO_ON: set[tuple[str, str]] = set()


def exact_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface (query [B, Hq, W, d], key/value [B, Hkv, L, d], additive or
    bool mask [B, 1, W, L]) → ([B, W, Hq, d], None). One request (B = 1) and W ≤ ``MAX_ROWS``:
    fixed-shape fp32 GEMMs (module docstring); otherwise SDPA."""
    import torch
    from torch.nn import functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    B, Hq, W, d = query.shape
    if B != 1 or W > MAX_ROWS or kwargs.get("sinks") is not None:
        # SDPA has no softcap (Gemma-2): the model's own eager attention has
        if softcap is not None:
            import importlib

            eager = importlib.import_module(type(module).__module__).eager_attention_forward
            return eager(
                module,
                query,
                key,
                value,
                attention_mask,
                dropout=dropout,
                scaling=scaling,
                softcap=softcap,
                **kwargs,
            )
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    Hkv, L = key.shape[1], key.shape[2]
    # query heads per key/value head (transformers' repeat_kv: kv head j serves q heads j·g …
    # j·g+g−1)
    g = Hq // Hkv
    M, C, dev = QUERY_BLOCK * g, KEY_CHUNK, query.device
    scale = scaling if scaling is not None else d**-0.5
    lay = _layout(attention_mask, kwargs.get("position_ids"), W, L, g, dev)
    P, base, a0, n_chunks = L - W, lay.base, lay.a0, lay.n_chunks
    shared = L if lay.chain else P  # a tree's own keys go to each row's copy of its region below
    k = key.new_zeros((Hkv, n_chunks * C, d), dtype=torch.float32)
    k[:, base - a0 : base - a0 + shared] = key[0, :, :shared]
    v = value.new_zeros((Hkv, n_chunks * C, d + 1), dtype=torch.float32)
    # e·[V | 1]: each chunk's GEMM also sums its weights (the softmax's denominator, chunk by chunk)
    v[..., d] = 1.0
    v[:, base - a0 : base - a0 + shared, :d] = value[0, :, :shared]
    q_all = query[0].float().view(Hkv, g, W, d).transpose(1, 2)  # [Hkv, W, g, d]
    out = query.new_empty((W, Hq, d))
    for r0, b in zip(range(0, W, QUERY_BLOCK), lay.blocks):
        rows = min(QUERY_BLOCK, W - r0)
        # padded rows: zero queries seeing every key (no NaN); their output is dropped
        q = F.pad(q_all[:, r0 : r0 + rows].reshape(Hkv, rows * g, d), (0, 0, 0, M - rows * g))
        s = _scores(q, k, b, scale, softcap)  # [Hkv, M, n·C]
        region = None
        # a tree: each row sees its own ancestors at their absolute positions (rows ≠ one K/V)
        if not lay.chain:
            region = (lay.first - a0) // C * C  # from the chunk of the tree's root on
            kr = _row_region(k, key, region, rows, r0, lay.allowed_new, lay.at)  # [rows, Hkv, R, d]
            # [rows, Hkv, R, d + 1]
            vr = _row_region(v, value, region, rows, r0, lay.allowed_new, lay.at)
            # [rows, Hkv, M, R]
            sr = _scores(q.expand(rows, -1, -1, -1), kr, b[:, region:], scale, softcap)
            # row i's slots: its scores against its own keys
            s[:, : rows * g, region:] = _own_slots(sr, rows, g)
        e = torch.exp(s - s.amax(dim=-1, keepdim=True))  # masked → exactly 0
        part = torch.matmul(
            e.view(Hkv, M, n_chunks, C).transpose(1, 2), v.view(Hkv, n_chunks, C, d + 1)
        )
        # [Hkv, n, M, d + 1]; a tree row's chunks from the region on: against its own V
        if region is not None:
            c = region // C
            # [Hkv, n−c, M, C]
            er = e[:, :, region:].reshape(Hkv, M, n_chunks - c, C).transpose(1, 2)
            # [rows, Hkv, n−c, M, d+1]
            pr = torch.matmul(er.unsqueeze(0), vr.view(rows, Hkv, n_chunks - c, C, d + 1))
            part[:, c:, : rows * g] = _own_slots(pr.transpose(2, 3), rows, g).transpose(1, 2)
        # [Hkv, M, d + 1]: chunk partials added in position order (cumsum's order, cheaper)
        acc = part[:, 0]
        for j in range(1, n_chunks):
            acc = acc + part[:, j]
        o = acc[..., :d] / acc[..., d:]
        out[r0 : r0 + rows] = (
            o[:, : rows * g].view(Hkv, rows, g, d).transpose(0, 1).reshape(rows, Hq, d)
        )
    return out.unsqueeze(0), None


@dataclass
class _Layout:
    """Where this forward's keys sit (absolute positions) and what each query may see: the same for
    every layer that gets the same mask, so computed once per forward and kind of layer."""

    first: int  # position of the forward's first token (the pending one)
    # absolute position of cache column 0 (> 0 where a sliding layer dropped its oldest keys)
    base: int
    # the forward's tokens are consecutive positions (else a tree: positions are depths)
    chain: bool
    a0: int  # absolute position of the layout's first column: the chunk holding the first key
    n_chunks: int
    at: torch.Tensor  # layout column of each of the forward's tokens
    allowed_new: torch.Tensor  # bool [W, W]: which of the forward's tokens each query sees
    # per block of QUERY_BLOCK queries: the additive mask [QUERY_BLOCK·g, n·C] (0 / −inf)
    blocks: list


# (mask, key, layout) of the last forwards: a layout is reused while its mask object is
_LAYOUTS: list = []


def _layout(mask, position_ids, W: int, L: int, g: int, dev) -> _Layout:
    import torch

    C, inf, P = KEY_CHUNK, float("-inf"), L - W
    pos = position_ids[0, -W:].tolist() if position_ids is not None else list(range(P, L))
    key = (tuple(pos), W, L, g)
    for m, k, lay in _LAYOUTS:
        if m is mask and k == key:
            return lay
    first = pos[0]
    base = first - P
    # Keys and values sit at their absolute positions, from the first chunk that holds one: a key's
    # place in every reduction is the same in plain decoding and in any verification (chunk
    # boundaries are absolute positions)
    a0 = base // C * C
    n_chunks = -(-(max(pos) + 1 - a0) // C)
    allowed = _allowed(mask, W, L, dev)
    bias = torch.full((W, n_chunks * C), inf, device=dev)
    bias[:, base - a0 : base - a0 + P] = torch.where(allowed[:, :P], 0.0, inf)
    at = torch.tensor(pos, device=dev) - a0
    # a tree's nodes share positions: set what each row sees
    rows, cols = allowed[:, P:].nonzero(as_tuple=True)
    bias[rows, at[cols]] = 0.0
    blocks = []
    for r0 in range(0, W, QUERY_BLOCK):
        # padded rows see every key (no NaN); their output is dropped
        b = bias.new_zeros((QUERY_BLOCK, n_chunks * C))
        b[: min(QUERY_BLOCK, W - r0)] = bias[r0 : r0 + QUERY_BLOCK]
        blocks.append(b.repeat_interleave(g, dim=0))
    lay = _Layout(
        first, base, pos == list(range(first, first + W)), a0, n_chunks, at, allowed[:, P:], blocks
    )
    # holding the mask keeps its id from being reused while it is cached
    _LAYOUTS.insert(0, (mask, key, lay))
    del _LAYOUTS[4:]
    return lay


def _scores(q, k, bias, scale: float, softcap):
    """scale · q [.., M, d] · k [.., N, d]ᵀ (soft-capped where the model caps its attention logits)
    + bias [M, N]: one ``baddbmm`` (batched dims flattened), the same call for every forward."""
    import torch

    if softcap is not None:
        s = torch.matmul(q, k.transpose(-1, -2)) * scale
        return torch.tanh(s / softcap) * softcap + bias
    if q.dim() == 3:
        return torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)
    lead, (M, d), N = q.shape[:-2], q.shape[-2:], k.shape[-2]
    s = torch.baddbmm(bias, q.reshape(-1, M, d), k.reshape(-1, N, d).transpose(1, 2), alpha=scale)
    return s.view(*lead, M, N)


def _own_slots(x, rows: int, g: int):
    """x [rows, Hkv, M, …] (every row's copy of the whole block) → [Hkv, rows·g, …]: of copy i, only
    row i's g query slots (a copy, no arithmetic)."""
    Hkv, M, rest = x.shape[1], x.shape[2], x.shape[3:]
    per = x.reshape(rows, Hkv, M // g, g, *rest)[:, :, :rows]  # [rows, Hkv, rows, g, …]
    own = per.diagonal(dim1=0, dim2=2)  # [Hkv, g, …, rows]
    own = own.movedim(-1, 1)  # [Hkv, rows, g, …]
    return own.reshape(Hkv, rows * g, *rest)


def _row_region(buf, new, region: int, rows: int, r0: int, allowed_new, at):
    """Per row of a tree block: a copy of ``buf`` (the shared keys or values at absolute positions)
    from column ``region`` on, with the row's visible tree tokens (``allowed_new`` [W, W]: its
    ancestors and itself) written at their absolute columns ``at``. → [rows, Hkv, R, d]."""
    out = buf[:, region:].unsqueeze(0).repeat(rows, 1, 1, 1)
    r, j = allowed_new[r0 : r0 + rows].nonzero(as_tuple=True)
    d = new.shape[-1]  # a values buffer carries a column of ones beyond d (exact_attention)
    out[r, :, at[j] - region, :d] = (
        new[0, :, j + (new.shape[2] - allowed_new.shape[1])].transpose(0, 1).float()
    )
    return out


def _allowed(mask: torch.Tensor | None, W: int, L: int, device) -> torch.Tensor:
    """bool [W, L]: where a query may attend, from transformers' mask (additive with the dtype's
    minimum, or bool) or, for None, the causal rule of the last W positions."""
    import torch

    if mask is None:
        return torch.arange(L, device=device).view(1, -1) <= torch.arange(
            L - W, L, device=device
        ).view(-1, 1)
    m = mask[0, 0, :, -L:] if mask.dim() == 4 else mask[-W:, -L:]
    return m if m.dtype == torch.bool else m.float() > torch.finfo(m.dtype).min / 2


def make_exact(model: nn.Module, pack: bool = True) -> dict[str, int]:
    """Switch ``model`` (a transformers causal LM) to the invariant mode: the attention above, and
    every linear layer packed (CPU, where oneDNN can and ``pack``) or row-padded
    (``RowInvariantLinear``); a packed layer whose kernel a probe finds rounding 1 row otherwise
    than several (``polyspec.packed.rows_invariant``) is both. Idempotent. Returns {"packed": n,
    "row_padded": n} (linears of each kind now; a packed and padded one counts in both)."""
    from torch import nn
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    from polyspec.packed import (
        PackedLinear,
        RowInvariantLinear,
        pack_linears,
        rows_invariant,
    )

    AttentionInterface.register(NAME, exact_attention)
    # always a 4D mask, never "None = causal"
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, eager_mask)
    model.set_attn_implementation(NAME)
    # every size: fp32 weights below packed.MIN_NUMEL would stay MKL's, which is not row-invariant
    if pack:
        pack_linears(model, min_numel=0)
    probed: dict[tuple, bool] = {}  # per (features in, out, dtype, bias): the probe's answer
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            # not packed: CUDA, a CPU without oneDNN for the dtype, ``pack=False``, POLYSPEC_PACK=0
            if type(child) is nn.Linear:
                setattr(parent, name, RowInvariantLinear(child))
            elif type(child) is PackedLinear:
                w = child.weight
                shape = (child.in_features, child.out_features, w.dtype, child.bias is not None)
                if shape not in probed:
                    probed[shape] = rows_invariant(child)
                # a packed kernel that rounds one row otherwise than several (AMD Zen 4): padded
                if not probed[shape]:
                    setattr(parent, name, RowInvariantLinear(child))
    padded = [m for m in model.modules() if type(m) is RowInvariantLinear]
    packed = [m for m in model.modules() if type(m) is PackedLinear]
    packed += [m for m in padded if type(m.kernel) is PackedLinear]
    return {"packed": len(packed), "row_padded": len(padded)}


def is_exact(model: nn.Module) -> bool:
    """Whether ``make_exact`` switched this model."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME


__all__ = [
    "AUTO_ON",
    "KEY_CHUNK",
    "MAX_ROWS",
    "NAME",
    "QUERY_BLOCK",
    "add_exact_argument",
    "exact_attention",
    "exact_wanted",
    "is_exact",
    "make_exact",
]
