"""The prompt-lookup hint an EAGLE-1 drafter may read beside its usual inputs
(``eagle.lookup_hint``).

The hint of position p is the token prompt lookup (PLD; ``decoder.drafts.tables.prompt_lookup`` with
γ = 1) proposes after ``ids[..p]``: the token that followed the most recent earlier occurrence of
the longest suffix n-gram of ``ids[..p]`` (n = 3, 2, 1; 0: no earlier occurrence, no hint). Its
strength tells the drafter n and whether the hint of ``ids[..p-1]`` was ``ids[p]`` (prompt lookup
has just been right: a loop or a copy is running). Train and decoder compute it from the same tokens
the drafter entry sees, so a trained drafter meets the same inputs at decode time: the verified
prefix, then its own drafts.

Why: the base model's greedy answers loop and copy their prompt. On the de demo pool's greedy
answers the hint equals the target's next token at 79 % of the answer positions, where the drafters
trained on ~30K tokens reach α₁ 0.3–0.4 alone. The drafter learns when to trust it (a few
parameters, little data) instead of learning to copy through attention (many examples).
"""

from __future__ import annotations

import torch

MAX_NGRAM = 3
# n = 0..3, and whether the previous position's hint was the token that came
STRENGTHS = 2 * (MAX_NGRAM + 1)


def earlier_occurrence(
    ids: list[int], max_ngram: int = MAX_NGRAM, min_ngram: int = 1
) -> tuple[int, int] | None:
    """(start, n) of the most recent earlier occurrence of the longest suffix n-gram of ``ids`` (n =
    max..min), or None: prompt lookup's search (``decoder.drafts.tables.prompt_lookup`` proposes
    what follows it)."""
    n_tok = len(ids)
    for n in range(min(max_ngram, n_tok - 1), min_ngram - 1, -1):
        tail = ids[-n:]
        for start in range(n_tok - n - 1, -1, -1):  # most recent earlier occurrence first
            if ids[start : start + n] == tail:
                return start, n
    return None


def _lookup(ids: list[int], max_ngram: int) -> tuple[int, int]:
    found = earlier_occurrence(ids, max_ngram)
    return (ids[found[0] + found[1]], found[1]) if found else (0, 0)


def lookup_hint(ids: list[int], max_ngram: int = MAX_NGRAM) -> tuple[int, int]:
    """(hint id, strength) for the last position of ``ids``: strength = n + (MAX_NGRAM + 1) if the
    hint of ``ids[:-1]`` was ``ids[-1]`` (prompt lookup has just been right: a loop or a copy is
    running); (0, 0) — or (0, MAX_NGRAM + 1) — without an earlier occurrence."""
    h, n = _lookup(ids, max_ngram)
    hp, np_ = _lookup(ids[:-1], max_ngram) if len(ids) > 1 else (0, 0)
    return h, n + (max_ngram + 1) * int(np_ > 0 and hp == ids[-1])


def lookup_hints(ids: list[int], max_ngram: int = MAX_NGRAM) -> tuple[list[int], list[int]]:
    """:func:`lookup_hint` of every prefix ``ids[..p]`` at once (one pass, a dict of last
    occurrences per n)."""
    # n-gram → its last end position
    last: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram + 1)]
    hint, strength = [0] * len(ids), [0] * len(ids)
    for p in range(len(ids)):
        # an earlier occurrence needs n ≤ p (its follower lies inside)
        for n in range(min(max_ngram, p), 0, -1):
            q = last[n].get(tuple(ids[p - n + 1 : p + 1]))
            if q is not None:
                hint[p], strength[p] = ids[q + 1], n
                break
        # grams ending at p become earlier occurrences after it
        for n in range(1, min(max_ngram, p + 1) + 1):
            last[n][tuple(ids[p - n + 1 : p + 1])] = p
    for p in range(len(ids) - 1, 0, -1):  # the previous position's hint came true
        if strength[p - 1] > 0 and hint[p - 1] == ids[p]:
            strength[p] += max_ngram + 1
    return hint, strength


def has_hint(strength: torch.Tensor, max_ngram: int = MAX_NGRAM) -> torch.Tensor:
    return strength % (max_ngram + 1) > 0


def hint_tensors(
    ids: torch.Tensor, max_ngram: int = MAX_NGRAM
) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] → (hint ids [B, T], strengths [B, T]) long, per row (right padding only adds later
    positions)."""
    rows = [lookup_hints(r, max_ngram) for r in ids.tolist()]
    h = torch.tensor([r[0] for r in rows], dtype=torch.long, device=ids.device).view_as(ids)
    n = torch.tensor([r[1] for r in rows], dtype=torch.long, device=ids.device).view_as(ids)
    return h, n


def hint_inputs(
    embed, hint_ids: torch.Tensor, strength: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hint ids, strengths) [..] → the ``hints`` an EAGLE drafter's forward reads: the frozen
    target embedding of each hint (zero where the strength is 0: no hint) and the strengths."""
    with torch.no_grad():
        e = embed(hint_ids).float() * has_hint(strength).unsqueeze(-1)
    return e, strength


def entry_hints(embed, prefixes: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """The hints of drafter entries [1, k] whose token prefixes (each ending with the entry's token)
    are given."""
    got = [lookup_hint(p) for p in prefixes]
    ids = torch.tensor([[g[0] for g in got]], dtype=torch.long, device=device)
    n = torch.tensor([[g[1] for g in got]], dtype=torch.long, device=device)
    return hint_inputs(embed, ids, n)
