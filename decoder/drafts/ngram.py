"""Training-free draft sources: n-gram tables built from the text itself, no bundle needed.

- ``PromptLookup`` (``pld``): prompt lookup decoding — the longest recent n-gram that occurred
  earlier proposes what followed it (also the loop-aware chain of ``adaspec`` and ``hybrid``);
- ``TokenRecycling`` (``ngram-tree``): Token Recycling / UNISPEC confidence tree from an adjacency
  matrix (``decoder.drafts.tables``);
- ``SpectraSource`` (``spectra``): SPECTRA CORE + RETRIEVAL (``decoder.drafts.spectra``).
"""

from __future__ import annotations

from decoder.drafts.tables import RecyclingTable, copy_after
from decoder.drafts.types import DecodeState, DraftSource, Proposal, Verified
from polyspec.lookup import earlier_occurrence


class PromptLookup(DraftSource):
    """PLD (transformers' ``prompt_lookup_num_tokens``): the most recent earlier occurrence of the
    longest suffix n-gram (n = 3..1) proposes the ``gamma`` tokens that followed it.

    ``grow_to`` (the hybrid's lookup; ``pld`` itself stays transformers' method): a loop-aware
    variant — the copy runs on into its own proposal when the loop's period is shorter than the
    depth (``prompt_lookup(extend=)``), and after a step that kept the whole chain the next one is
    twice as deep, up to ``grow_to``; any rejection resets it to ``gamma``. The base model's greedy
    loops are where PLD's whole chains get kept."""

    name = "pld"

    def __init__(self, gamma: int = 10, max_ngram: int = 3, grow_to: int | None = None):
        self.gamma, self.max_ngram, self.grow_to = gamma, max_ngram, grow_to
        self.depth = gamma
        self.match_len = 0  # n of the last proposal's suffix n-gram (0: no match)

    def begin(self, ctx: DecodeState) -> None:
        self.depth = self.gamma

    def propose(self, ctx: DecodeState) -> Proposal:
        g, seen = min(self.depth, ctx.max_depth), ctx.tokens[: ctx.pend + 1]
        found = earlier_occurrence(seen, self.max_ngram) if g > 0 else None
        self.match_len = found[1] if found else 0
        return Proposal.chain(
            copy_after(seen, found, g, extend=self.grow_to is not None), self.name
        )

    def update(self, ctx: DecodeState, v: Verified) -> None:
        if self.grow_to is None:
            return
        proposed = v.proposed_by(self.name)
        whole = proposed > 0 and v.kept_from(self.name) >= proposed
        self.depth = min(2 * self.depth, self.grow_to) if whole else self.gamma


class TokenRecycling(DraftSource):
    """Token Recycling / UNISPEC confidence tree from an adjacency matrix refreshed by every
    verification."""

    name = "ngram-tree"
    tree_capable = True

    def __init__(
        self,
        vocab_size: int,
        k: int = 8,
        nodes: int = 12,
        first_width: int = 8,
        width: int = 4,
        depth: int = 4,
        threshold: float = 0.02,
        gamma: int = 4,
    ):
        self.recycler = RecyclingTable(vocab_size, k)
        self.nodes, self.first_width, self.width, self.depth = nodes, first_width, width, depth
        self.threshold, self.gamma = threshold, gamma

    def propose(self, ctx: DecodeState) -> Proposal:
        root = ctx.tokens[ctx.pend]
        if not ctx.tree_ok:  # follow the top-1 edges
            out, t = [], root
            for _ in range(min(self.gamma, ctx.max_depth)):
                t = int(self.recycler.adj[t, 0])
                if t < 0:
                    break
                out.append(t)
            return Proposal.chain(out, self.name)
        tok, parent, _ = self.recycler.tree(
            root,
            self.nodes,
            self.first_width,
            self.width,
            min(self.depth, ctx.max_depth + 1),
            self.threshold,
        )
        return Proposal(tok, parent, [self.name] * len(tok))

    def update(self, ctx: DecodeState, v: Verified) -> None:
        rows, ids, probs = v.top(self.recycler.k)  # the kept branch's inputs teach their rows
        self.recycler.set_rows([v.inputs[i] for i in rows], ids, probs)


class SpectraSource(DraftSource):
    """SPECTRA: CORE's forward/backward n-gram guesses first, RETRIEVAL's fill the budget."""

    name = "spectra"
    tree_capable = True

    def __init__(self, spectra, nodes: int = 12, topk: int = 8):
        self.spectra, self.nodes, self.topk = spectra, nodes, topk

    @property
    def max_nodes(self) -> int:
        """Its own budget (``Spectra.propose`` never goes past it), which may exceed the
        decoder's."""
        return self.nodes

    def begin(self, ctx: DecodeState) -> None:
        # the prompt is known text (Alg. 1 line 3)
        self.spectra.observe(ctx.tokens[: ctx.prompt_len])

    def propose(self, ctx: DecodeState) -> Proposal:
        if ctx.max_depth < 1:
            return Proposal()
        tok, parent = self.spectra.propose(ctx.tokens[: ctx.pend + 1], self.nodes, ctx.max_depth)
        p = Proposal(list(tok), list(parent), [self.name] * len(tok))
        return p if ctx.tree_ok else p.first_chain()

    def update(self, ctx: DecodeState, v: Verified) -> None:
        rows, ids, probs = v.top(self.topk)
        top_ids: list[list[int]] = [[] for _ in v.inputs]
        top_probs: list[list[float]] = [[] for _ in v.inputs]
        for r, i, p in zip(rows, ids.tolist(), probs.tolist()):
            top_ids[r], top_probs[r] = i, p
        self.spectra.update(
            v.inputs, v.parents, top_ids, top_probs, v.path, ctx.tokens[: ctx.pend + 1]
        )
