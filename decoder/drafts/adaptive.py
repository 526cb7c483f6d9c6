"""ADASPEC Alg. 2: choose the drafter language ℓ and vocabulary size s from recent tokens.

The language mask M_lang [|L|·|S|, |V|] (row s·|L| + l marks V_l[:S[s]], lines 6–16) comes from the
bundle. Every u generated tokens the last w tokens form the context mask (lines 28–33); the overlap
with each row (lines 36–37) plus the offset z·(|S|−1−s), which favours smaller (cheaper) heads
(lines 17–18, 38), is maximised (line 39) and the row gives ℓ = L[p mod |L|], s = S[p div |L|]
(lines 40–41).

Overlap counts *distinct* tokens (the context mask is a set). ``fixed_lang`` / ``fixed_size``
restrict the argmax to one language or one size: the ablations of ADASPEC Table 2.
"""

from __future__ import annotations

import torch

from vocab.masks import size_offsets


class LanguageSelector:
    def __init__(
        self,
        mask: torch.Tensor,
        languages: list[str],
        sizes: list[int],
        window: int = 10,
        step: int = 5,
        offset: float = 2.0,
        fixed_lang: str | None = None,
        fixed_size: int | None = None,
    ):
        L, S = len(languages), len(sizes)
        if mask.shape[0] != L * S:
            raise ValueError(f"language mask has {mask.shape[0]} rows, expected {L}·{S}")
        self.mask, self.languages, self.sizes = mask.bool(), list(languages), list(sizes)
        self.window, self.step = window, step
        rows = torch.arange(L * S)
        self.offset = size_offsets(L, S, offset)  # line 18: [z·(|S|−1), …, z, 0] per size chunk
        allowed = torch.ones(L * S, dtype=torch.bool)
        if fixed_lang is not None:
            allowed &= rows % L == self.languages.index(fixed_lang)
        if fixed_size is not None:
            allowed &= rows // L == self.sizes.index(fixed_size)
        self.allowed = allowed
        self.since = 0  # tokens generated since the last decision

    def choose(self, context: list[int]) -> tuple[str, int, torch.Tensor]:
        """Lines 29–41 on the token ids ``context`` → (language, size, scores per row)."""
        ctx = torch.as_tensor(sorted(set(context)), dtype=torch.long)
        overlap = self.mask[:, ctx].sum(1).float() if len(ctx) else torch.zeros(self.mask.shape[0])
        scores = (overlap + self.offset).masked_fill(~self.allowed, float("-inf"))
        p = int(scores.argmax())
        L = len(self.languages)
        return self.languages[p % L], self.sizes[p // L], scores

    def due(self, new_tokens: int) -> bool:
        """Lines 24–27: run the mechanism once at least u tokens arrived since the last run (a step
        can emit several tokens, so 'i mod u = 0' becomes 'u or more since last time')."""
        self.since += new_tokens
        if self.since >= self.step:
            self.since = 0
            return True
        return False
