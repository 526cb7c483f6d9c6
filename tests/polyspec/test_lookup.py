"""polyspec/lookup.py: the prompt-lookup hint drafters read is prompt lookup's own first token, for
every prefix."""

from __future__ import annotations

import random

import torch

from decoder.drafts.tables import prompt_lookup
from polyspec.lookup import hint_tensors, lookup_hint, lookup_hints


def test_the_hint_of_every_prefix_is_prompt_lookups_first_token():
    rng = random.Random(0)
    seqs = [
        [rng.randrange(v) for _ in range(rng.randrange(1, 80))]
        for v in (3, 8, 40)
        for _ in range(30)
    ]
    seqs.append([5, 6, 7, 5, 6, 7, 5, 6])  # a loop: 3-grams match
    found, hits = {0: 0, 1: 0, 2: 0, 3: 0}, 0
    for ids in seqs:
        hint, n = lookup_hints(ids)
        for p in range(len(ids)):
            pld = prompt_lookup(ids[: p + 1], 1)
            assert (hint[p], n[p]) == lookup_hint(ids[: p + 1])
            assert [hint[p]] == pld if n[p] % 4 else pld == []
            came_true = p > 0 and prompt_lookup(ids[:p], 1) == [ids[p]]
            assert n[p] // 4 == came_true
            found[n[p] % 4] += 1
            hits += came_true
    # every length (and none) exercised
    assert all(found[k] > 20 for k in found) and hits > 100, (found, hits)
    # strength = n-gram length + 4 when the previous position's hint came true
    assert lookup_hints([5, 6, 7, 5, 6, 7, 5, 6]) == (
        [0, 0, 0, 6, 7, 5, 6, 7],
        [0, 0, 0, 1, 6, 7, 7, 7],
    )


def test_hint_tensors_are_per_row():
    ids = torch.tensor([[1, 2, 1, 2], [3, 3, 3, 0]])
    h, n = hint_tensors(ids)
    assert h.tolist() == [[0, 0, 2, 1], [0, 3, 3, 0]] and n.tolist() == [[0, 0, 1, 6], [0, 1, 6, 0]]
