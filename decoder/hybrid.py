"""``hybrid``: the drafter and the n-gram sources in one verification forward, and ``merge``, which unites
proposals into one trie."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from decoder.draft_types import DecodeState, DraftSource, Proposal, Verified
from decoder.drafter_source import DrafterSource
from decoder.ngram import SpideTable
from decoder.ngram_sources import PromptLookup
from polyspec.errors import PolyspecError


@dataclass
class _Arm:
    """Running means of the tokens and the seconds of one kind of hybrid step (with or without the drafter)."""

    n: int = 0
    tokens: float = 0.0
    secs: float = 0.0

    def add(self, tokens: float, secs: float, memory: float = 0.1) -> None:
        self.n += 1
        a = max(memory, 1.0 / self.n)  # the plain mean until 1/n < memory, then an exponential one
        self.tokens += a * (tokens - self.tokens)
        self.secs += a * (secs - self.secs)

    @property
    def rate(self) -> float:
        """Tokens per second."""
        return self.tokens / self.secs if self.secs > 0 else 0.0


class HybridSource(DraftSource):
    """The drafter and the n-gram sources in one verification forward (greedy: one merged tree).

    Each step the n-gram sources propose for free: prompt lookup's loop-aware chain (``PromptLookup(grow_to=)``)
    first, whole, then SPECTRA's guesses filling the device's flat-verify budget (``nodes``, ``calibration.json``
    ``tree_budget``); the candidates are merged into one trie (shared prefixes share nodes) and whichever branch
    the target follows wins the step. The trained drafter runs only where prompt lookup found no match — measured
    on the cpu-full bundle (en, 568 steps), the drafter added 0.06 tokens per step beside a prompt-lookup match
    and 0.8 where there was none — and there only while it pays. Whether it pays is measured, not modelled: on
    no-match steps the hybrid keeps two running means per drafter language, tokens per second of the steps that
    ran the drafter and of those that did not (each from the start of ``propose`` to the end of ``update``:
    drafting, the larger verification, every table update); the first ``warmup`` steps of each kind alternate,
    then the faster kind runs and the other is re-measured every ``probe_every`` no-match steps. Inside a step
    the drafter drafts a chain token by token while the estimated probability that the next draft survives
    (SPIDE table of its confidences) times the time an accepted token saves exceeds its measured cost per token.
    Sampling: a chain from the source with the best recent acceptance (Leviathan rejection sampling stays exact).
    """

    name = "hybrid"
    needs_feats = True
    tree_capable = True

    def __init__(self, drafter: DrafterSource | None, ngram: list[DraftSource], nodes: int = 12,
                 gamma_max: int = 6, probe_every: int = 8, warmup: int = 3):
        if not ngram or not isinstance(ngram[0], PromptLookup):
            raise PolyspecError("hybrid: the first n-gram source must be prompt lookup (its match decides the drafter)")
        self.drafter, self.ngram, self.nodes = drafter, ngram, nodes
        self.gamma_max, self.probe_every, self.warmup = gamma_max, probe_every, warmup
        self.draft_tok_s = 0.002  # running mean cost of one drafted token (s); measured from the first step
        self.arms: dict[str | None, dict[bool, _Arm]] = {}  # drafter language → {ran the drafter: its steps}
        self.acc_rate = {s.name: 0.5 for s in ngram} | ({drafter.name: 0.5} if drafter else {})
        self.since_probe = 0  # no-match decisions since the other kind was last re-measured
        self.used_drafter = self.no_match = False
        self._t0, self._measured = 0.0, None  # the step being timed, and the arm it counts for
        self._warm_lang = None  # the drafter language whose cache is warm (its first step catches up a whole prompt)
        if drafter is not None:
            drafter.spide = drafter.spide or SpideTable()

    @property
    def max_nodes(self) -> int:
        """The most nodes one step can propose (prompt lookup's chain goes in whole, past the budget)."""
        return max([self.nodes] + [max(s.gamma, s.grow_to or 0) for s in self.ngram if isinstance(s, PromptLookup)])

    @property
    def aux_layers(self) -> list[int] | None:
        """The drafter's (EAGLE-3: the target layers its features come from)."""
        return self.drafter.aux_layers if self.drafter is not None else None

    def begin(self, ctx: DecodeState) -> None:
        self._warm_lang = None
        for s in self.sources:
            s.begin(ctx)

    @property
    def sources(self) -> list[DraftSource]:
        return ([self.drafter] if self.drafter else []) + self.ngram

    def _tau(self) -> float:
        """Rough tokens per step from the sources' recent acceptance."""
        return 1.0 + sum(self.acc_rate.values()) / max(len(self.acc_rate), 1)

    def arm(self, ran_drafter: bool) -> _Arm:
        """The measured no-match steps of the current drafter language that ran (or skipped) the drafter."""
        lang = getattr(self.drafter, "lang", None)
        return self.arms.setdefault(lang, {True: _Arm(), False: _Arm()})[ran_drafter]

    def _drafter_pays(self, ctx: DecodeState) -> bool:
        """Whether this no-match step runs the drafter: alternate until both kinds are measured, then the one
        with more tokens per second, the other one every ``probe_every``-th step (its estimate stays current)."""
        if self.drafter is None or ctx.max_depth < 1:
            return False
        on, off = self.arm(True), self.arm(False)
        if min(on.n, off.n) < self.warmup:
            return on.n <= off.n
        better = on.rate > off.rate
        self.since_probe += 1
        if self.since_probe >= self.probe_every:
            self.since_probe = 0
            return not better
        return better

    def propose(self, ctx: DecodeState) -> Proposal:
        self._t0 = time.perf_counter()
        self.used_drafter = self.no_match = False  # set below for the greedy tree only: update() measures those
        if ctx.temperature > 0 or not ctx.tree_ok:
            best = max(self.sources, key=lambda s: self.acc_rate[s.name])
            p = best.propose(ctx) if best is not self.drafter else self._drafter_chain(ctx)
            return p if p.is_chain else p.first_chain()  # sampling: core gives n-gram drafts point-mass q
        cands = [s.propose(ctx) for s in self.ngram]
        self.no_match = ctx.max_depth >= 1 and not cands[0].tokens  # cands[0]: prompt lookup (the factory's order)
        self.used_drafter = self.no_match and self._drafter_pays(ctx)
        self._measured = self.arm(self.used_drafter) if self.no_match else None
        if self.used_drafter:
            if self.drafter.lang != self._warm_lang:  # its first step of a request or language syncs a whole
                self._measured, self._warm_lang = None, self.drafter.lang  # prompt: a one-off, not its step cost
            cands.insert(1, self._drafter_chain(ctx))
        # prompt lookup's chain (first) goes in whole, as deep as it matched; the others fill the device's flat
        # budget only (past it every extra node costs verification time: on the 2-core CPU in bf16 verify(k)
        # rises from ~1.1 forwards at 6 tokens to ~2 at 15), so they pay where PLD has little or nothing
        return merge(cands, max(self.nodes, len(cands[0].tokens)), ctx.max_depth)

    def _drafter_chain(self, ctx: DecodeState) -> Proposal:
        """Draft while P(all drafts so far survive) · (time an accepted token saves) > cost of one more draft."""
        d = self.drafter
        tau = self._tau()
        saved = (ctx.step_s or 0.03) / tau
        threshold = min(0.9, self.draft_tok_s / max(saved, 1e-6))
        t0 = time.perf_counter()
        tokens, qs, _ = d.draft_chain(ctx, min(self.gamma_max, ctx.max_depth), threshold)
        if tokens:
            self.draft_tok_s = 0.8 * self.draft_tok_s + 0.2 * (time.perf_counter() - t0) / (len(tokens) + 1)
        return Proposal.chain(tokens, d.name, qs if ctx.temperature > 0 else None, d.lang, d.size)

    def update(self, ctx: DecodeState, v: Verified) -> None:
        for name in [s.name for s in self.sources]:  # acceptance per source: did the kept path run through its nodes?
            if v.proposed_by(name):
                self.acc_rate[name] = 0.9 * self.acc_rate[name] + 0.1 * min(v.kept_from(name), 4) / 4
        if self.used_drafter and self.drafter is not None:
            self.drafter.learn_lengths(v)
        for s in self.sources:
            s.update(ctx, v)
        if self._measured is not None:  # the whole step: drafting, verification, the updates above
            if ctx.feats.is_cuda:
                torch.cuda.synchronize(ctx.feats.device)
            self._measured.add(v.kept or 1 + v.accepted, time.perf_counter() - self._t0)


def merge(cands: list[Proposal], budget: int, max_depth: int) -> Proposal:
    """Union of proposals as one trie (shared prefixes share nodes), in the order given, at most ``budget``
    nodes and ``max_depth`` deep; a node's origin names every source that proposed it ("a+b")."""
    out = Proposal()
    children: dict[tuple[int, int], int] = {}  # (parent node, token) → node
    for c in cands:
        depth = c.depth
        where: list[int] = []  # candidate node → merged node (or -2: dropped)
        for i, (t, p) in enumerate(zip(c.tokens, c.parents)):
            mp = -1 if p < 0 else where[p]
            if mp == -2 or depth[i] > max_depth:
                where.append(-2)
                continue
            key = (mp, t)
            if key in children:
                n = children[key]
                if c.origin[i] not in out.origin[n].split("+"):
                    out.origin[n] += "+" + c.origin[i]
            elif len(out.tokens) < budget:
                n = children[key] = len(out.tokens)
                out.tokens.append(t), out.parents.append(mp), out.origin.append(c.origin[i])
            else:
                n = -2
            where.append(n)
        if c.lang is not None and out.lang is None:
            out.lang, out.vocab_size = c.lang, c.vocab_size
    return out

