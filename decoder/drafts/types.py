"""The draft-source interface and the data that passes between a source and the decoding loop.

    # a new request (prompt in ctx.tokens); tables that learn online persist
    src.begin(ctx)
    # → Proposal: a tree (a chain is a tree whose parents are -1, 0, 1, …)
    prop = src.propose(ctx)
    …one target forward verifies it (decoder.core)…
    # what the target kept, and its own predictions from that same forward
    src.update(ctx, verified)

Modelled on transformers' ``candidate_generator.py`` (get_candidates / update_candidate_strategy):
the loop in ``decoder.core`` knows nothing of how a source drafts; it verifies whatever tree a
source proposes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from decoder.loop.verify import topk


@dataclass
class Proposal:
    """Draft nodes to verify after the pending token. ``parents[i]``: index of node i's parent among
    the nodes, -1 for a child of the pending token (parents always come before children). ``q[i]``
    (sampling, chains only): the full-vocabulary distribution node i was drawn from."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    # which source proposed each node (hybrid accounting)
    origin: list[str] = field(default_factory=list)
    q: list[torch.Tensor] | None = None
    lang: str | None = None
    vocab_size: int | None = None

    @classmethod
    def chain(cls, tokens: list[int], origin: str, q=None, lang=None, vocab_size=None) -> Proposal:
        return cls(
            list(tokens),
            list(range(-1, len(tokens) - 1)),
            [origin] * len(tokens),
            q,
            lang,
            vocab_size,
        )

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @property
    def depth(self) -> list[int]:
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def first_chain(self) -> Proposal:
        """The branch through each node's first child (sources list their best guess first)."""
        keep, want = [], -1
        for i, p in enumerate(self.parents):
            if p == want:
                keep.append(i)
                want = i
        return Proposal(
            [self.tokens[i] for i in keep],
            list(range(-1, len(keep) - 1)),
            [self.origin[i] for i in keep],
            None,
            self.lang,
            self.vocab_size,
        )


@dataclass
class DecodeState:
    """What a source may read. ``tokens[pend]`` is the pending token (emitted, not yet in the
    target's cache); ``feats[p]`` the target's features at verified position p (EAGLE drafters read
    them)."""

    tokens: list[int]
    feats: torch.Tensor
    prompt_len: int
    pend: int = 0
    max_depth: int = 0  # drafts past this would overrun max_new_tokens
    # False: sampling, or the tree would cross a sliding window → propose a chain
    tree_ok: bool = True
    temperature: float = 0.0
    gen: torch.Generator | None = None
    step_s: float = 0.0  # running mean of one verification forward (s), for cost-aware sources


@dataclass
class Verified:
    """One verification forward. ``inputs`` = [pending, *nodes]; ``parents`` index into inputs (-1
    for the pending token); ``logits`` [n, V] of the target after each input; ``path`` = indices
    into inputs of the accepted branch (starts with 0); ``kept`` = tokens emitted after stopping
    rules; ``verify_s`` seconds."""

    inputs: list[int]
    parents: list[int]
    logits: torch.Tensor
    path: list[int]
    origin: list[str]
    kept: int = 0
    verify_s: float = 0.0
    # drafting beside this verification (SPIDE's parallel half, decoder.drafts.spide_parallel), set
    # by the source's update: "hit": its continuation is the next proposal; "drop": discarded; "":
    # none drafted
    parallel: str = ""
    spec_s: float = 0.0  # seconds the drafting beside the verification took
    # of which done before the loop needed its result (hidden behind the verification)
    hidden_s: float = 0.0
    _top: tuple | None = None

    @property
    def accepted(self) -> int:
        return len(self.path) - 1

    def proposed_by(self, name: str) -> int:
        """Nodes of this step that source ``name`` proposed (merged nodes name every proposer:
        "a+b")."""
        return sum(1 for o in self.origin if name in o.split("+"))

    def kept_from(self, name: str) -> int:
        """Nodes on the kept branch that source ``name`` proposed."""
        return sum(1 for i in self.path[1:] if name in self.origin[i - 1].split("+"))

    def top(self, k: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """(rows, ids [r, k], confidences [r, k]) of the target's top-k next tokens after the inputs
        of the kept branch (``rows`` = ``path``: off-branch rows follow rejected tokens, and ranking
        them all would cost as much as a forward at 262K ids). Confidences are softmax-normalised
        over the top k (no pass over the whole vocabulary); they rank and prune guesses, which the
        target verifies anyway. Computed once per step and shared by every source that learns from
        it."""
        if self._top is None or self._top[1].shape[1] < k:
            v, j = topk(self.logits[self.path], k)
            self._top = (self.path, j, torch.softmax(v.float(), -1))
        return self._top[0], self._top[1][:, :k], self._top[2][:, :k]


class DraftSource:
    """The interface. ``propose`` must respect ``ctx.max_depth`` and return a chain when
    ``not ctx.tree_ok``.

    What the decoding loop needs from a source it reads from these attributes (never from the
    method's name): ``needs_feats`` (the target's features are kept for it: EAGLE drafters read
    them), ``tree_capable`` (it may propose trees; where the loop must ask for chains it says so
    once), ``aux_layers`` (the target layers whose hidden states form its features: EAGLE-3; None:
    the last layer) and ``max_nodes`` (the most nodes one proposal may hold; None: the decoder's
    node budget ``tree_nodes``) and ``guesses_bonus`` (sampling: when a chain is kept whole, the
    loop judges ``bonus_guess()`` as one more draft instead of drawing the target's next token
    directly)."""

    name = "source"
    needs_feats = False
    tree_capable = False
    aux_layers: list[int] | None = None
    max_nodes: int | None = None
    guesses_bonus = False

    def begin(self, ctx: DecodeState) -> None:
        """A new request; ``ctx.tokens`` is the prompt plus the first pending token."""

    def propose(self, ctx: DecodeState) -> Proposal:
        raise NotImplementedError

    def bonus_guess(self) -> tuple[int, torch.Tensor] | None:
        """(token, q [V] it was drawn from): a guess of the target's token after a chain kept whole,
        which the loop keeps with probability min(1, p/q) like a draft (``guesses_bonus``, sampling
        only); None: no guess."""
        return None

    def update(self, ctx: DecodeState, v: Verified) -> None:
        """After the step: ``ctx.tokens`` already holds the kept tokens (the new pending one
        last)."""
