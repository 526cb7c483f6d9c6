"""Verification rules: what the target keeps of a draft.

- greedy: keep the longest draft prefix equal to the target's argmax, then the target's own argmax
  (UNISPEC Alg. 2) → exactly the target's greedy output;
- sampling: speculative rejection sampling (Leviathan et al. 2023; "Towards Fast Multilingual LLM
  Inference", Appendix Alg. 1): keep draft token d with probability min(1, p(d)/q(d)); at the first
  rejection sample from norm(max(0, p − q)); if all are kept, sample the bonus token from p. q is
  the drafter's distribution over its reduced vocabulary, zero elsewhere, so the output distribution
  is exactly the target's p.
"""

from __future__ import annotations

import torch

from polyspec.generation import top_p_filter


def warp(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Target logits [.., V] → sampling probabilities after temperature and nucleus (top-p)
    filtering."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        probs = top_p_filter(probs, top_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


BLOCK = 256


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)``, exactly (ties → the first index, as torch), for [.., V] rows: the
    maximum of each block of 256, then the first block holding the row's maximum, then the first
    index inside it. On CPU a bf16 argmax over 262,144 ids is a scalar loop (~2 ms a row here);
    block maxima are one vectorised pass."""
    V = logits.shape[-1]
    if V % BLOCK or V < 16 * BLOCK:
        return logits.argmax(-1)
    blocks = logits.reshape(*logits.shape[:-1], V // BLOCK, BLOCK)
    b = blocks.amax(-1).argmax(-1, keepdim=True)  # first block whose maximum is the row's maximum
    inner = (
        blocks.gather(-2, b.unsqueeze(-1).expand(*b.shape, BLOCK))
        .squeeze(-2)
        .argmax(-1, keepdim=True)
    )
    return (b * BLOCK + inner).squeeze(-1)


def topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, ids) of the top-k of each row of [n, V], exactly (up to the order of tied values):
    every top-k value lies in one of the k blocks with the largest maxima, so only those k·256
    candidates are ranked."""
    n, V = logits.shape
    if V % BLOCK or V < 16 * BLOCK or k > 64:
        return logits.topk(k, dim=-1)
    blocks = logits.view(n, V // BLOCK, BLOCK)
    _, bi = blocks.amax(-1).topk(k, dim=-1)
    cand = blocks.gather(1, bi.unsqueeze(-1).expand(n, k, BLOCK)).reshape(n, k * BLOCK)
    v, j = cand.topk(k, dim=-1)
    return v, bi.gather(1, j // BLOCK) * BLOCK + j % BLOCK


def accept_greedy(drafts: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """drafts [γ], target_logits [γ+1, V] → (number kept, next token)."""
    best = argmax(target_logits).tolist()
    n = 0
    while n < len(drafts) and drafts[n] == best[n]:
        n += 1
    return n, best[n]


def accept_sampled(
    drafts: list[int], q: list[torch.Tensor], p: torch.Tensor, gen: torch.Generator, guess=None
) -> tuple[int, int]:
    """drafts [γ]; q[i] the drafter's full-vocabulary distribution d_i was sampled from; p [γ+1, V]
    the target's (warped) distributions → (number kept, next token). ``guess``: a callable → (token,
    q [V]) or None, asked only when every draft was kept: the guess is judged by the same rule as
    one more draft (SPIDE Alg. 1 line 28), so the next token is still distributed as p[γ]."""
    for i, d in enumerate(drafts):
        replacement = _judge(d, q[i], p[i], gen)
        if replacement is not None:
            return i, replacement
    g = guess() if guess is not None else None
    if g is not None:
        replacement = _judge(g[0], g[1], p[len(drafts)], gen)
        return len(drafts), g[0] if replacement is None else replacement
    return len(drafts), sample(p[len(drafts)], gen)


def _judge(d: int, q: torch.Tensor, p: torch.Tensor, gen: torch.Generator) -> int | None:
    """Keep draft d (q [V] the distribution it was drawn from, p [V] the target's) with probability
    min(1, p/q): None when kept, else the replacement drawn from norm(max(0, p − q))."""
    r = torch.rand((), generator=gen).item()
    if r * float(q[d]) < float(p[d]):  # r < p/q without dividing by a tiny q
        return None
    residual = (p - q).clamp_min(0.0)
    total = residual.sum()
    return sample(residual / total if total > 0 else p, gen)


def sample(probs: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(probs.float().cpu(), 1, generator=gen).item())
