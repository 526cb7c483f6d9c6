"""Losses of the drafters (their held-out score is train/score.py).

Shapes: B batch, T tokens, H hidden, s reduced vocabulary. ``f`` are the target's last hidden states
(post final norm: what its LM head reads); ``f[:, t]`` predicts token ``x[:, t+1]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from polyspec.drafter_kind import DrafterKind
from polyspec.drafter_models import attention_bias, gather_rows
from polyspec.lookup import hint_inputs, hint_tensors


@torch.no_grad()
def target_features(
    target_model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    aux_layers: list[int] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """[B, T] → f [B, T, H] from the frozen target's base model (its LM head is not run); with
    ``aux_layers`` (EAGLE-3) also [B, T, 3H]: those entries of ``output_hidden_states``,
    concatenated."""
    base = target_model.get_decoder()
    out = base(
        input_ids=input_ids,
        attention_mask=attention_mask,
        use_cache=False,
        output_hidden_states=aux_layers is not None,
    )
    if aux_layers is None:
        return out.last_hidden_state
    return out.last_hidden_state, torch.cat([out.hidden_states[i] for i in aux_layers], dim=-1)


def is_eagle3(drafter) -> bool:
    return DrafterKind.of(drafter) is DrafterKind.EAGLE3  # DDP's wrapper too


def uses_hints(drafter) -> bool:
    """An EAGLE-1 drafter that reads prompt-lookup hints (``eagle.lookup_hint``,
    ``polyspec.lookup``)."""
    return bool(getattr(getattr(drafter, "module", drafter), "lookup_hint", False))


def draft_logits(
    drafter, pred: torch.Tensor, head_w: torch.Tensor, softcap: float | None = None
) -> torch.Tensor:
    """Logits over the reduced vocabulary: the frozen target head rows (EAGLE-1) or the drafter's
    own draft-vocabulary head (EAGLE-3); both index the same top-s ids."""
    if is_eagle3(drafter):
        return getattr(drafter, "module", drafter).logits(pred)
    return reduced_logits(pred, head_w, softcap)


def reduced_logits(
    h: torch.Tensor, head_w: torch.Tensor, softcap: float | None = None
) -> torch.Tensor:
    """h [.., H] @ head_w [s, H]^T → [.., s] (the target head restricted to the language's top-s
    ids)."""
    logits = h.to(head_w.dtype) @ head_w.T
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


@torch.no_grad()
def target_probs(
    f_rows: torch.Tensor, head_w: torch.Tensor, softcap: float | None = None
) -> torch.Tensor:
    """The target's next-token distribution over the s ids from its features [N, H] → [N, s]
    float32, rounded through fp16 so that a kept copy (:class:`TargetProbs`) and a fresh one are the
    same numbers."""
    return torch.softmax(reduced_logits(f_rows, head_w, softcap).float(), dim=-1).half().float()


@torch.no_grad()
def in_vocab_rows(
    f_rows: torch.Tensor, full_w: torch.Tensor, in_draft: torch.Tensor, chunk: int = 512
) -> torch.Tensor:
    """[N] bool: whether the target's argmax over its whole vocabulary (features [N, H] @ head [V,
    H]^T; a softcap keeps the argmax) is one of the draft ids (``in_draft`` [V] bool). Chunks of
    rows bound the [·, V] logits."""
    out = [in_draft[(x.to(full_w.dtype) @ full_w.T).argmax(-1)] for x in f_rows.split(chunk)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool, device=f_rows.device)


def loss_rows(loss_mask: torch.Tensor, step: int = 0) -> torch.Tensor:
    """[B, T] loss mask → [B, T-1-step] mask of the rows the step-``step`` head reads: pred_t feeds
    the head for token x_{t+2+step}."""
    L = loss_mask.shape[1] - 1 - step
    m = torch.zeros_like(loss_mask[:, :L])
    m[:, : L - 1] = loss_mask[:, 2 + step :]
    return m


class TargetProbs:
    """The step-0 targets of :func:`eagle_loss` (the target's distribution at every loss row) per
    example, kept in fp16 up to ``max_bytes`` after the first time an example is seen. They depend
    only on the example, so later epochs skip the target-head GEMM and its softmax (a third of the
    head work of a step)."""

    def __init__(self, head_w: torch.Tensor, softcap: float | None, max_bytes: float):
        self.head_w, self.softcap, self.max_bytes = head_w, softcap, max_bytes
        self.kept: dict[int, torch.Tensor] = {}
        self.bytes = 0

    def __call__(self, index: list[int], f: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
        """[rows, s] in :func:`eagle_loss`'s row order (batch row, then position) for the examples
        ``index``."""
        m = loss_rows(loss_mask).bool()
        new = [b for b, e in enumerate(index) if e not in self.kept]
        if new:  # one GEMM for the batch's examples not kept yet
            rows = torch.cat([f[b, 1:][m[b]] for b in new])
            fresh = target_probs(rows, self.head_w, self.softcap).split(
                [int(m[b].sum()) for b in new]
            )
            got = dict(zip(new, fresh))
            for b, p in got.items():
                if self.bytes + 2 * p.numel() <= self.max_bytes:
                    self.kept[index[b]] = p.to("cpu", torch.float16)
                    self.bytes += 2 * p.numel()
        else:
            got = {}
        return torch.cat(
            [
                got[b] if b in got else self.kept[e].to(f.device, torch.float32)
                for b, e in enumerate(index)
            ]
        )


def eagle_loss(
    drafter,
    embed,
    head_w,
    batch: dict,
    f: torch.Tensor,
    cfg,
    softcap: float | None = None,
    generator: torch.Generator | None = None,
    aux: torch.Tensor | None = None,
    p0: torch.Tensor | None = None,
    packed: bool = True,
    keep0: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """EAGLE-1 objective, optionally unrolled ``cfg.ttt_steps`` times (EAGLE-3 training-time test).

    Step i predicts f_{t+1+i} from [embed(x_{t+1+i}) ‖ g_t], where g = f (+ noise) at step 0 and the
    drafter's own step-(i-1) predictions afterwards; weight ``ttt_decay**i``. Loss: SmoothL1 to the
    next feature + CE against the target's distribution restricted to the same s ids, on loss-mask
    positions (``cfg.token_loss`` lk_hybrid: :func:`lk_hybrid` there instead, ``accept_est_i``
    logged). EAGLE-3 (``aux`` = fused target layers as the step-0 input): CE through the drafter's
    own head only. ``p0``: the step-0 target distribution at the loss rows, kept from an earlier
    epoch (:class:`TargetProbs`); step i's are step 0's, i rows on (both are the target's at token
    t+2+i).
    ``packed`` (EAGLE-3): each step runs only the entries the loss reads — step i's loss rows and
    the entries later steps continue from —; step 0's other entries give keys and values only
    (``query_rows``). The same loss as running every entry (``packed=False``, the reference), with a
    finetune's prompt rows skipped. ``keep0`` (bool, step 0's loss rows; :func:`in_vocab_rows`): the
    rows whose target argmax lies in the draft vocabulary; the others leave the token loss (and
    top-1), as EAGLE-3's reference training masks them (``eagle.mask_out_of_vocab``); step i's row t
    is step 0's row t + i, like ``p``.
    """
    eagle3 = is_eagle3(drafter)
    ids, mask = batch["input_ids"], batch["loss_mask"]
    T = ids.shape[1]
    emb, hints = _drafter_inputs(drafter, embed, ids)
    g = _step0_input(f, aux, cfg, generator)
    total, metrics = 0.0, {}
    # EAGLE-3's training-time test: step i's entry t attends as the decoder's (i+1)-th draft does —
    # to the entries of the verified prefix (step 0, entries ≤ t: true features) and to its own
    # chain (entry t of steps 1..i) — through one KV cache that keeps every step's keys
    # (``ttt_mask``). EAGLE-1 unrolls without it.
    steps = min(cfg.ttt_steps, T - 2)
    # the token loss (``eagle.token_loss``; a config without the option, as some callers pass: kl)
    lk = getattr(cfg, "token_loss", "kl") == "lk_hybrid"
    ttt = eagle3 and cfg.ttt_steps > 1
    masks = [loss_rows(mask, i) for i in range(steps)]
    packs = _step_rows(masks) if eagle3 and packed else None
    unroll = _Unroll(drafter, emb, hints, ids, packs, ttt)
    for i in range(steps):
        L = T - 1 - i  # positions t = 0..T-2-i
        pos = torch.arange(1 + i, T, device=ids.device).unsqueeze(0).expand(ids.shape[0], -1)
        m = masks[i]
        at = m.nonzero(as_tuple=True)  # the loss rows (batch row, position), in row-major order
        pred, out = unroll.forward(i, L, pos, g, at)
        denom = m.sum().clamp_min(1.0)
        w_rows = m[at]
        feat = _feature_loss(pred, f, m, i, denom, eagle3)
        # the head only where the loss reads it (prompt and padding rows are ~40 % of a finetune
        # batch): rows are picked before the [·, s] GEMMs, forward and backward
        if i == 0:
            p = p_step0 = p0 if p0 is not None else target_probs(f[:, 1:][at], head_w, softcap)
            # a step-0 loss row's place in p_step0
            row0 = torch.cumsum((m != 0).reshape(-1), 0).view_as(m) - 1
        else:  # step i's row t is step 0's row t + i (loss_rows)
            p = p_step0[row0[:, i:][at]]
        tok_denom = denom
        # the token loss on rows whose target argmax the draft vocabulary holds
        if keep0 is not None:
            w_rows = w_rows * keep0[row0[:, i:][at]].to(w_rows.dtype)
            tok_denom = w_rows.sum().clamp_min(1.0)
        logq = torch.log_softmax(draft_logits(drafter, out, head_w, softcap).float(), dim=-1)
        ce_rows = -(p * logq).sum(-1)
        ce = tok = (ce_rows * w_rows).sum() / tok_denom
        if lk:  # the same rows, weights and targets; "LK Losses"' hybrid instead of the CE
            tok, accept = lk_hybrid(ce_rows, logq, p, w_rows, tok_denom, cfg.lk_eta)
            metrics.update({f"lk_{i}": float(tok.detach()), f"accept_est_{i}": float(accept)})
        w = cfg.ttt_decay**i
        total = total + w * (cfg.feature_loss_weight * feat + cfg.token_loss_weight * tok)
        acc = _top1(logq, p, w_rows, tok_denom)
        metrics.update(
            {
                f"feat_loss_{i}": float(feat.detach()),
                f"ce_{i}": float(ce.detach()),
                f"top1_{i}": float(acc),
            }
        )
        g = pred  # next step reads the drafter's own features
    return total, metrics


def _drafter_inputs(drafter, embed, ids: torch.Tensor) -> tuple[torch.Tensor, tuple | None]:
    """The tokens' embeddings (fp32) and, for a hint-reading drafter, every prefix's hints."""
    with torch.no_grad():
        # a bf16 target's embedding feeds the fp32 drafter (autocast on CUDA)
        emb = embed(ids).float()
        # prompt-lookup hints of every prefix (``eagle.lookup_hint``): entry t+1+i reads those of
        # ids[..t+1+i]
        hints = hint_inputs(embed, *hint_tensors(ids)) if uses_hints(drafter) else None
    return emb, hints


def _step0_input(
    f: torch.Tensor, aux: torch.Tensor | None, cfg, generator: torch.Generator | None
) -> torch.Tensor:
    """g at step 0: the target's features (EAGLE-3: ``aux``), with ``feature_noise`` added."""
    g = (aux if aux is not None else f)[:, :-1]
    if cfg.feature_noise > 0:
        noise = torch.rand(g.shape, generator=generator, device="cpu").to(g.device, g.dtype)
        g = g + (noise * 2 - 1) * cfg.feature_noise
    return g


class _Unroll:
    """The drafter's forward at each unrolled step of one :func:`eagle_loss` call, and what the
    steps share: the inputs, the packed steps' rows, the TTT KV cache and its keys' lengths."""

    def __init__(self, drafter, emb: torch.Tensor, hints, ids: torch.Tensor, packs, ttt: bool):
        self.drafter, self.emb, self.hints, self.ids, self.packs, self.ttt = (
            drafter,
            emb,
            hints,
            ids,
            packs,
            ttt,
        )
        self.cache, self.lengths = (DynamicCache() if ttt else None), []

    def forward(self, i: int, L: int, pos: torch.Tensor, g: torch.Tensor, at) -> tuple:
        """Step i's drafter output and its entries at the loss rows ``at``: packed, TTT or plain."""
        if self.packs is not None:
            return self.packed(i, L, pos, g, at)
        h = self.hints
        kw = {} if h is None else {"hints": (h[0][:, 1 + i :], h[1][:, 1 + i :])}
        if self.ttt:
            return self.ttt_step(i, L, pos, g, at)
        return self.plain(i, L, pos, g, at, kw)

    def packed(self, i: int, L: int, pos: torch.Tensor, g: torch.Tensor, at) -> tuple:
        """A packed step (EAGLE-3): the entries at step i's rows only; step 0's others give keys
        and values only."""
        rows, where = self.packs[i]
        if i == 0:
            pred, self.cache = self.drafter(
                self.emb[:, 1:],
                g[:, :L],
                position_ids=pos,
                past_key_values=self.cache,
                use_cache=self.ttt,
                query_rows=rows,
            )
        # the entries at ``rows`` only, each reading the previous step's output at its position
        else:
            T = self.ids.shape[1]
            prev = gather_rows(self.packs[i - 1][1], rows)
            mask4 = ttt_mask_rows(T - 1, [r for r, _ in self.packs[1 : i + 1]], self.emb.dtype)
            pred, self.cache = self.drafter(
                gather_rows(self.emb[:, 1 + i :], rows),
                gather_rows(g, prev),
                position_ids=gather_rows(pos, rows),
                attention_mask=mask4,
                past_key_values=self.cache,
                use_cache=True,
            )
        return pred, pred[at[0], where[at]]

    def ttt_step(self, i: int, L: int, pos: torch.Tensor, g: torch.Tensor, at) -> tuple:
        """An unpacked TTT step (EAGLE-3): every entry, attending through the shared KV cache."""
        ids, emb = self.ids, self.emb
        mask4 = (
            ttt_mask(self.lengths, L, ids.shape[0], emb.dtype, ids.device) if self.lengths else None
        )
        pred, self.cache = self.drafter(
            emb[:, 1 + i :],
            g[:, :L],
            position_ids=pos,
            attention_mask=mask4,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.lengths.append(L)
        return pred, pred[at]

    def plain(self, i: int, L: int, pos: torch.Tensor, g: torch.Tensor, at, kw: dict) -> tuple:
        """A step without a cache (EAGLE-1, or EAGLE-3 with one step): every entry."""
        pred, _ = self.drafter(self.emb[:, 1 + i :], g[:, :L], position_ids=pos, **kw)
        return pred, pred[at]


def _feature_loss(
    pred: torch.Tensor, f: torch.Tensor, m: torch.Tensor, i: int, denom, eagle3: bool
) -> torch.Tensor:
    """Step i's SmoothL1 to the target's next features at the loss rows (0 for EAGLE-3)."""
    if eagle3:  # its features are its own (no regression target)
        feat = torch.zeros((), device=pred.device)
    else:
        tgt = f[:, 1 + i :]
        feat = (
            F.smooth_l1_loss(pred.float(), tgt.float(), reduction="none").mean(-1) * m
        ).sum() / denom
    return feat


def lk_hybrid(
    ce_rows: torch.Tensor,
    logq: torch.Tensor,
    p: torch.Tensor,
    w_rows: torch.Tensor,
    tok_denom,
    eta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The lk_hybrid token loss of vllm-project/speculators (``losses/eager.py``: "LK Losses: Direct
    Acceptance Rate Optimization for Speculative Decoding", arXiv 2602.23881) over N loss rows: per
    row λ·KL(p‖q) + (1 − λ)·(1 − α), where α = Σ_v min(p_v, q_v) is the draft's expected acceptance
    under speculative sampling (1 − α: the total-variation distance) and λ = exp(−η·α), α detached
    there (a weight, not differentiated): KL's gradient while the overlap is small, the acceptance
    term's as it grows. Weighted like the CE (``w_rows`` [N] over ``tok_denom``).

    ce_rows [N] = −Σ p log q, logq [N, s], p [N, s] → (loss, the weighted mean α: ``accept_est``).
    """
    kl_rows = ce_rows + torch.xlogy(p, p).sum(-1)  # KL = CE − H(p), with 0·log 0 = 0
    alpha = torch.minimum(p, logq.exp()).sum(-1)
    lam = torch.exp(-eta * alpha.detach())
    rows = lam * kl_rows + (1.0 - lam) * (1.0 - alpha)
    loss = (rows * w_rows).sum() / tok_denom
    accept = (alpha.detach() * w_rows).sum() / tok_denom
    return loss, accept


def _top1(logq: torch.Tensor, p: torch.Tensor, w_rows: torch.Tensor, tok_denom) -> torch.Tensor:
    """The weighted share of loss rows whose draft argmax is the target's (no gradient)."""
    with torch.no_grad():
        acc = ((logq.argmax(-1) == p.argmax(-1)).float() * w_rows).sum() / tok_denom
    return acc


def _step_rows(masks: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The entries each unrolled step runs when packed: step i's loss rows and every entry step i+1
    continues from (step i+1's entry t reads step i's output at t). Per step: rows [B, N] (a batch
    row's entries in order, -1 after them) and where [B, L] (an entry's index in rows, -1 if it is
    not run)."""
    need, out = None, []
    for m in reversed(masks):
        q = m != 0
        if need is not None:
            q = q.clone()
            q[:, : need.shape[1]] |= need
        need = q
        B, L = q.shape
        n = max(int(q.sum(1).max()), 1)
        t = torch.arange(L, device=q.device).expand(B, L)
        rows = torch.where(q, t, t + L).sort(dim=1).values[:, :n]
        rows = torch.where(rows < L, rows, torch.full_like(rows, -1))
        where = torch.where(q, torch.cumsum(q.long(), 1) - 1, torch.full_like(t, -1))
        out.append((rows, where))
    return out[::-1]


def ttt_mask(lengths: list[int], L: int, batch: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The additive attention mask [B, 1, L, Σlengths + L] of training-time-test step i =
    len(lengths) ≥ 1 (EAGLE-3): its query t may see step 0's keys 0..t (the verified prefix's
    entries, causal) and key t of every later step (its own earlier drafts), itself included; the
    keys are ordered step by step, as the cache holds them."""
    t = torch.arange(L, device=device)[:, None]
    blocks = [torch.arange(lengths[0], device=device)[None, :] <= t]
    blocks += [torch.arange(n, device=device)[None, :] == t for n in (*lengths[1:], L)]
    allowed = torch.cat(blocks, dim=1)
    return attention_bias(allowed, dtype)[None, None].expand(batch, 1, *allowed.shape)


def ttt_mask_rows(prefix: int, rows: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """:func:`ttt_mask` for packed steps: step i = len(rows) runs the entries ``rows[-1]`` [B, N];
    the keys are step 0's ``prefix`` entries (all of them), then each packed step's. Entry t sees
    step 0's keys 0..t and its own position's key in every later step (padding entries, -1, see each
    other, never a real entry)."""
    q = rows[-1]
    t = q.clamp_min(0).unsqueeze(-1)
    blocks = [torch.arange(prefix, device=q.device).view(1, 1, prefix) <= t]
    blocks += [r.unsqueeze(1) == q.unsqueeze(-1) for r in rows]
    return attention_bias(torch.cat(blocks, dim=-1), dtype).unsqueeze(1)


def small_lm_loss(model, batch: dict) -> tuple[torch.Tensor, dict]:
    """Next-token cross-entropy on loss-mask positions (response tokens when finetuning)."""
    logits = (
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        .logits[:, :-1]
        .float()
    )
    tgt = batch["input_ids"][:, 1:]
    m = batch["loss_mask"][:, 1:]
    ce = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none"
    ).view_as(m)
    loss = (ce * m).sum() / m.sum().clamp_min(1.0)
    acc = ((logits.argmax(-1) == tgt).float() * m).sum() / m.sum().clamp_min(1.0)
    return loss, {"ce": float(loss.detach()), "top1": float(acc)}
