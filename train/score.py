"""The training score that predicts the decoder: its greedy chain procedure, replayed on held-out
answers.

The decoder (``decoder/core.py``, chain γ, greedy) prefills the prompt (one target forward, the
first answer token), then per step drafts γ tokens, verifies them in one forward and keeps the
leading matches plus the target's own next token. On a held-out prompt whose greedy answer ``x``
(ending where the decoder ends: EOS, the prompt format's stop strings, max tokens) and target
features ``f`` are known, every step is determined:

    p ← start                        # x[..p] known: the prefill produced x[start]
    while p < n - 1:
        d_1..d_γ ← drafter(f[<p], x[≤p])      # EAGLE: own features after the first draft
        a ← leading i with d_i = x[p+i]       (at most n − 2 − p: the step's own token must fit)
        p ← p + a + 1; steps += 1

τ = (n − start) / (1 + steps): answer tokens per target forward, what the bench reports. The
drafter's context at each step holds the target's features of the verified tokens only (the decoder
rebuilds it the same way), so in exact arithmetic this is the decoder's count; rounding of the
verify forward is the only difference.
"""

from __future__ import annotations

import copy

import torch

from polyspec.lookup import entry_hints, hint_inputs, hint_tensors
from train.objectives import draft_logits, uses_hints


def walk(n: int, start: int, gamma: int, propose) -> list[int]:
    """Accepted drafts per step of the chain procedure; ``propose(p)`` → (hits of d_1..d_γ against
    x[p+1..])."""
    accepted, p = [], start
    while p < n - 1:
        # as the decoder: drafts + the target's own token fit the tokens left
        hits = propose(p)[: n - 2 - p]
        a = 0
        while a < len(hits) and hits[a]:
            a += 1
        accepted.append(a)
        p += a + 1
    return accepted


@torch.no_grad()
def eagle_chain(
    drafter,
    embed,
    head_w,
    ids_s,
    seq: torch.Tensor,
    start: int,
    f: torch.Tensor,
    gamma: int,
    softcap: float | None = None,
    aux: torch.Tensor | None = None,
    first_hits: list[bool] | None = None,
) -> list[int]:
    """seq [1, n] greedy ids, f [1, n, H] (aux [1, n, 3H] for EAGLE-3) → accepted drafts per step.
    ``first_hits`` (a list) receives, for every answer position, whether the teacher-forced first
    draft (the target's own features of the whole prefix) is the next answer token.

    Entry p of the drafter reads [embed(x_p) ‖ f_{p-1}] and attends to entries ≤ p only, so one
    teacher-forced pass over entries 1..n-1 gives every step's first draft and the cache a step
    continues from (that pass's first p entries: what the decoder's drafter holds after syncing the
    verified prefix x[..p]); only steps whose first draft hits draft on, from a copy of that cache
    cut back to p entries."""
    g_all = aux if aux is not None else f
    n = seq.shape[1]
    x = seq[0]
    if n < 2:
        return []
    pos = torch.arange(1, n, device=seq.device).unsqueeze(0)
    # entry p reads the prompt-lookup hint of x[..p]; a draft's, of x[..p] + drafts
    hinted = uses_hints(drafter)
    kw = (
        {"hints": tuple(t[:, 1:n] for t in hint_inputs(embed, *hint_tensors(seq)))}
        if hinted
        else {}
    )
    pred_all, past_all = drafter(
        embed(seq[:, 1:n]).float(), g_all[:, : n - 1], position_ids=pos, use_cache=True, **kw
    )
    # first[p-1]: d_1 of step p
    first = ids_s[draft_logits(drafter, pred_all[0], head_w, softcap).argmax(-1)]
    if first_hits is not None:  # first[p-1] drafts x[p+1], p = start .. n-2
        first_hits += (first[start - 1 : n - 2] == x[start + 1 : n]).tolist()

    def propose(p: int) -> list[bool]:
        if p + 2 >= n:
            return []
        d = first[p - 1]
        hits = [bool(d == x[p + 1])]
        if not hits[0] or gamma == 1:
            return hits  # later drafts cannot be accepted: no need to draft them
        past = copy.deepcopy(past_all)
        past.crop(-(n - 1 - p))  # entries 1..p: the verified prefix
        h = pred_all[:, p - 1 : p]
        prefix = x[: p + 1].tolist()
        for i in range(1, gamma):
            pos = torch.tensor([[p + i]], device=seq.device)
            prefix.append(int(d))
            kw = {"hints": entry_hints(embed, [prefix], seq.device)} if hinted else {}
            h, past = drafter(
                embed(d.view(1, 1)).float(),
                h,
                position_ids=pos,
                past_key_values=past,
                use_cache=True,
                **kw,
            )
            d = ids_s[draft_logits(drafter, h[0, -1], head_w, softcap).argmax(-1)]
            if p + 2 + i >= n:
                break
            hits.append(bool(d == x[p + 1 + i]))
            if not hits[-1]:
                break
        return hits

    return walk(n, start, gamma, propose)


@torch.no_grad()
def score_eagle(
    drafter, embed, head_w, ids_s, seqs: list[dict], gamma: int, softcap: float | None = None
) -> dict:
    """:func:`summarize` of :func:`eagle_chain` over held-out sequences ``{"seq": [1, n], "start",
    "f": [1, n, H], "aux": [1, n, 3H] or None}`` (the training score, and
    ``pipelines.score_check``'s)."""
    per_seq, first_hits = [], []
    for d in seqs:
        seq, aux = d["seq"], d.get("aux")
        acc = eagle_chain(
            drafter,
            embed,
            head_w,
            ids_s,
            seq,
            d["start"],
            d["f"].float().to(seq.device),
            gamma,
            softcap,
            aux=None if aux is None else aux.float().to(seq.device),
            first_hits=first_hits,
        )
        per_seq.append((seq.shape[1] - d["start"], acc))
    out = summarize(per_seq, gamma)
    # the first draft's accuracy at every answer position, teacher-forced: beside α₁ (the same
    # draft, at the positions decoding visits) it tells a train/decode mismatch from noise
    if first_hits:
        out["top1_teacher_forced"] = round(sum(first_hits) / len(first_hits), 4)
    return out


@torch.no_grad()
def small_lm_chain(
    model, ids_s: torch.Tensor | None, seq: torch.Tensor, start: int, gamma: int
) -> list[int]:
    """A small LM drafting greedily from the verified prefix equals teacher forcing while its drafts
    match: one forward gives every step's hits."""
    logits = model(input_ids=seq).logits[0, :-1]
    pred = ids_s[logits[:, ids_s].argmax(-1)] if ids_s is not None else logits.argmax(-1)
    match = (pred == seq[0, 1:]).tolist()  # match[j]: the prediction for x[j+1] from x[≤j]
    return walk(seq.shape[1], start, gamma, lambda p: match[p : p + gamma])


def summarize(per_seq: list[tuple[int, list[int]]], gamma: int) -> dict:
    """[(answer tokens, accepted per step)] → τ, accepted drafts per step, α_i = share of steps
    accepting ≥ i."""
    tokens = sum(t for t, _ in per_seq)
    steps = [a for _, acc in per_seq for a in acc]
    forwards = len(per_seq) + len(steps)
    if not per_seq or not tokens:
        return {"tau": 0.0, "accept_len": 0.0, "alpha": [], "steps": 0, "sequences": 0}
    return {
        "tau": round(tokens / forwards, 4),
        "accept_len": round(sum(steps) / max(1, len(steps)), 4),
        "alpha": [
            round(sum(a >= i for a in steps) / max(1, len(steps)), 4) for i in range(1, gamma + 1)
        ],
        "steps": len(steps),
        "sequences": len(per_seq),
        "tokens": tokens,
    }
