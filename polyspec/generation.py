"""The rules every stage that generates shares, so that they all end an answer at the same token and
sample from the same distribution: synth's transformers engine, the decoder's methods and
transformers' own loops in its bench, and train's held-out answers.

- :func:`eos_ids`: the ids an answer ends at (transformers' ``generate`` stops at the same ones).
- :class:`Stopper`: EOS, a stop string (for base models the prompt format's next-turn marker), or
  ``max_new_tokens``, checked token by token on the emitted stream, so a method that emits several
  tokens per step stops at exactly the token autoregressive decoding stops at; :func:`cut_at_stop`
  applies it to a finished answer.
- :func:`top_p_filter`: the nucleus (top-p) of a sampling distribution.

A stop string is text: it is looked for in the text the answer returns
(``skip_special_tokens=True``), and :func:`polyspec.prompts.truncate_at_stop` cuts it off that text.
A special token (``<|im_end|>``) ends an answer as one of :func:`eos_ids`, as in vLLM, whose stop
strings are matched on the same text.
"""

from __future__ import annotations

from typing import Any

import torch

from polyspec.prompts import truncate_at_stop


def eos_ids(target: Any) -> set[int]:
    """The ids transformers' ``generate`` stops at: the generation config's EOS (an id or a list)
    and the tokenizer's."""
    ids = set()
    gen_eos = getattr(getattr(target.model, "generation_config", None), "eos_token_id", None)
    for x in (gen_eos, target.tokenizer.eos_token_id):
        if isinstance(x, int):
            ids.add(x)
        elif x:
            ids.update(int(i) for i in x)
    return ids


def stop_window(stop: list[str]) -> int:
    """How many trailing tokens to decode to see every stop string that ends in the newest one: a
    character is at most 4 bytes and a byte-level token holds at least one, so a stop string spans
    at most 4 tokens a character; + 2 because the window's first token may decode differently alone
    (a stripped leading space, half a character); 24 at least. Decoding the window, not the whole
    answer, keeps the check linear in its length."""
    return max(24, 4 * max((len(s) for s in stop), default=0) + 2)


def tail_has_stop(tokenizer: Any, tail: Any, stop: list[str]) -> bool:
    """Whether the text of ``tail`` (the last :func:`stop_window` token ids of a stream) holds a
    stop string."""
    return truncate_at_stop(tokenizer.decode(tail, skip_special_tokens=True), stop)[1]


class Stopper:
    """The emitted stream of one answer: ``push`` each step's tokens, keep what it says, stop when
    ``done``.

    The token that completes a stop string is kept (``tokens``, as EOS is); ``text()`` leaves both
    out. Checked in the order EOS, stop string, ``max_new_tokens``: a token that is both ends the
    answer as the first."""

    def __init__(self, tokenizer: Any, eos_ids: set[int], stop: list[str], max_new_tokens: int):
        self.tok, self.eos, self.stop, self.max = (
            tokenizer,
            set(eos_ids),
            [s for s in stop if s],
            max_new_tokens,
        )
        self.window = stop_window(self.stop)
        self.tokens: list[int] = []
        self.reason: str | None = None  # eos | stop | length, once done

    def push(self, new: list[int]) -> int:
        """Append ``new`` until the stream ends; returns how many of them were kept."""
        for i, t in enumerate(new):
            self.tokens.append(t)
            if t in self.eos:
                self.reason = "eos"
            elif self.stop and tail_has_stop(self.tok, self.tokens[-self.window :], self.stop):
                self.reason = "stop"
            elif len(self.tokens) >= self.max:
                self.reason = "length"
            if self.reason:
                return i + 1
        return len(new)

    @property
    def done(self) -> bool:
        return self.reason is not None

    @property
    def remaining(self) -> int:
        return self.max - len(self.tokens)

    def text(self) -> str:
        """The answer's text: EOS ids and special tokens left out, cut before the first stop
        string."""
        text = self.tok.decode(
            [t for t in self.tokens if t not in self.eos], skip_special_tokens=True
        )
        return truncate_at_stop(text, self.stop)[0]


def cut_at_stop(tokenizer: Any, tokens: list[int], stop: list[str]) -> list[int]:
    """A finished answer up to the token that completes a stop string (all of it if none does):
    where :class:`Stopper` stops it (its EOS and length left to whoever generated it)."""
    return tokens[: Stopper(tokenizer, set(), stop, len(tokens)).push(tokens)]


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Probabilities [.., V] → the same with every id outside the nucleus set to 0 (not
    renormalised).

    The nucleus is the smallest set of most probable ids whose mass reaches ``top_p``: in descending
    order, an id is kept while the mass before it is below ``top_p`` (transformers' and vLLM's
    rule); ``top_p ≥ 1`` keeps all."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    sorted_p = sorted_p.masked_fill(sorted_p.cumsum(-1) - sorted_p >= top_p, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_p)
