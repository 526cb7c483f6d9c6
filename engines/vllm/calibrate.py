"""The hybrid's shortest n-gram match ``m``, calibrated from two curves the vLLM check measures in
one run (``python -m engines.vllm``, ``--hybrid-min auto``):

- **prompt lookup's acceptance by match length**: on the plain engine's own greedy answers to the
  held-out prompts, at every answer position, vLLM's n-gram rule (the longest suffix of ``1 …
  n_max`` tokens that occurred before, its earliest occurrence;
  ``vllm/v1/spec_decode/ngram_proposer.py``) proposes up to ``k`` tokens; how many of them the
  answer continues with is what vLLM would accept.
  Grouped by the match's length L: the share of positions and the mean accepted tokens.
- **the drafter's acceptance**: vLLM's own α_i at batch 1 and the step cost 1 + a + c·k fitted from
  the drafter's sweep (:mod:`engines.draft_length`).

A step that takes the n-gram row verifies ``k`` drafts and expects 1 + A(L) tokens; one that takes
the drafter's verifies ``d`` and expects 1 + Σα_i (i ≤ d); the EAGLE drafter drafts in every step
either way (the plugin runs it on the whole batch), so the n-gram row pays only its longer
verification, c per token beyond ``d`` (c as fitted, which also holds the drafting's share: an upper
bound). ``m`` is the shortest L from which on every longer observed match is worth it: (1 + A(L)) /
(1 + c·k) ≥ (1 + Σα) / (1 + c·d). No L qualifies: no n-gram rows (m past n_max)."""

from __future__ import annotations

from collections.abc import Sequence


def ngram_proposals(tokens: Sequence[int], start: int, n_max: int, k: int) -> list[tuple[int, int]]:
    """For each position t ≥ ``start`` of ``tokens`` (prompt + answer; the answer from ``start``):
    (L, accepted): the length of vLLM's n-gram match on ``tokens[:t]`` (0: none) and how many of its
    proposed tokens ``tokens[t:]`` continues with. vLLM's rule: the longest L ≤ n_max whose last L
    tokens occurred before, drafting what followed their earliest occurrence (up to ``k`` tokens,
    no further than the context)."""
    earliest: list[dict[tuple[int, ...], int]] = [{} for _ in range(n_max + 1)]
    out = []
    for t in range(len(tokens)):
        if t >= start:
            found = (0, 0)
            for n in range(min(n_max, t - 1), 0, -1):
                j = earliest[n].get(tuple(tokens[t - n : t]))
                if j is not None:
                    proposal = tokens[j + n : min(j + n + k, t)]
                    acc = 0
                    while acc < len(proposal) and t + acc < len(tokens):
                        if proposal[acc] != tokens[t + acc]:
                            break
                        acc += 1
                    found = (n, acc)
                    break
            out.append(found)
        # the n-grams ending at t - 1 (the suffixes just looked up) become visible from t + 1 on:
        # a suffix never matches itself
        for n in range(1, min(n_max, t) + 1):
            earliest[n].setdefault(tuple(tokens[t - n : t]), t - n)
    return out


def ngram_curve(contexts: list[tuple[list[int], int]], n_max: int, k: int) -> dict[int, dict]:
    """Over (tokens, answer start) pairs: per match length L (0 = no match): positions, their
    share, and the mean accepted tokens."""
    counts: dict[int, list[int]] = {}
    for tokens, start in contexts:
        for n, acc in ngram_proposals(tokens, start, n_max, k):
            counts.setdefault(n, []).append(acc)
    total = sum(len(v) for v in counts.values()) or 1
    return {
        n: {
            "positions": len(v),
            "share": round(len(v) / total, 4),
            "accepted": round(sum(v) / len(v), 4),
        }
        for n, v in sorted(counts.items())
    }


def choose_ngram_min(
    curve: dict[int, dict], alpha: Sequence[float], d: int, k: int, c: float, n_max: int
) -> dict:
    """``m`` (module docstring) and why: the drafter's and each match length's tokens per cost.
    No observed length worth it: ``n_max + 1`` (no n-gram rows)."""
    drafter = (1 + sum(alpha[:d])) / (1 + c * d)
    per_len = {
        n: (1 + v["accepted"]) / (1 + c * k) for n, v in curve.items() if n > 0 and v["positions"]
    }
    good = [n for n in sorted(per_len) if all(per_len[x] >= drafter for x in per_len if x >= n)]
    m = good[0] if good else n_max + 1
    return {
        "ngram_min": m,
        "drafter_value": round(drafter, 4),
        "ngram_value": {n: round(v, 4) for n, v in per_len.items()},
        "ngram_share": round(sum(curve[n]["share"] for n in curve if n >= m), 4),
    }
