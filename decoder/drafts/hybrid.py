"""``hybrid``: the drafter and the n-gram sources in one verification forward, and ``merge``, which
unites proposals into one trie."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from decoder.drafts.ngram import PromptLookup
from decoder.drafts.tables import SpideTable
from decoder.drafts.trained import DrafterSource
from decoder.drafts.types import DecodeState, DraftSource, Proposal, Verified
from polyspec.errors import PolyspecError


@dataclass
class _Arm:
    """Running means of the tokens and the seconds of one kind of hybrid step."""

    # the weight of the running means (a new request restarts it, see ``HybridSource.begin``)
    n: int = 0
    tokens: float = 0.0
    secs: float = 0.0
    seen: int = 0  # steps measured in all

    def add(self, tokens: float, secs: float, memory: float = 0.1) -> None:
        self.n += 1
        self.seen += 1
        a = max(memory, 1.0 / self.n)  # the plain mean until 1/n < memory, then an exponential one
        self.tokens += a * (tokens - self.tokens)
        self.secs += a * (secs - self.secs)

    @property
    def rate(self) -> float:
        """Tokens per second."""
        return self.tokens / self.secs if self.secs > 0 else 0.0


# What a hybrid step proposes, by the kind of step. On a no-match step (prompt lookup found
# nothing): SPECTRA's guesses filling the device's flat-verify budget, with or without the drafter's
# chain first. Neither proposing nothing (one plain forward, what ``pld`` does there) nor the
# drafter's chain alone is an arm beside SPECTRA: inside the calibrated budget a SPECTRA tree costs
# about a plain forward and keeps at least its token, and the drafter's chain merged with SPECTRA's
# fill costs what the chain alone costs. Without SPECTRA (no n-gram tables), the arms are the plain
# forward and the drafter. Where the node budget was not measured on this device and dtype (no
# calibration entry, or nodes chosen by hand), nothing says a SPECTRA tree costs about a forward, so
# the plain forward stays an arm (``plain_arm``).
# (evidence: docs/experiments.md#the-hybrids-no-match-arms-re-measured-spectra-with-or-without-the-drafter-per-request-language-2026-11-26-bf16-host-code-4e660b4--c990d3a)  # noqa: E501
NO_MATCH_ARMS = ("spectra", "drafter+spectra")
NO_SPECTRA_ARMS = ("plain", "drafter")
# A *blank* step: prompt lookup found no match and SPECTRA has no guess either (its tables hold
# nothing after the context's last tokens). Only the drafter can propose there, so its arms are
# those of a hybrid without SPECTRA. Known before choosing (both lookups are free), it is a step
# kind of its own, so that the drafter's cost there is not charged to steps where SPECTRA's guess
# already held what the drafter adds.
# (evidence: docs/experiments.md#where-the-hybrids-steps-go-and-blank-steps-and-weak-matches-as-step-kinds-of-their-own-2026-11-26-bf16-host-code-9c376c4--5c964f3)  # noqa: E501
BLANK_ARMS = NO_SPECTRA_ARMS
# SPECTRA beside a prompt-lookup match is not an arm: its wider trees cost verification time and its
# extra nodes were rarely the kept branch
# (evidence: docs/experiments.md#the-hybrid-beside-prompt-lookup-on-held-out-prompts--mixed-the-xeons-16-row-cliff-calibration-that-picks-the-same-γ-2026-11-26-bf16-host-code-4539a98--this-sections-commits)  # noqa: E501
MATCH_ARMS = ("pld",)
# A *weak* match: prompt lookup matched only the last token (a 1-gram). Such chains often keep
# nothing, so SPECTRA's guesses beside the chain (the rest of the flat budget) are an arm of their
# own (evidence: docs/experiments.md#the-hybrids-weak-matches)
WEAK_ARMS = ("pld", "pld+spectra")


class HybridSource(DraftSource):
    """The drafter and the n-gram sources in one verification forward (greedy: one merged tree),
    chosen per step by measured throughput.

    Each step prompt lookup's loop-aware chain (``PromptLookup(grow_to=)``) and SPECTRA's guesses
    are looked up first (free, ~0.2 ms); what they found makes the step's kind, and each kind has
    its arms:

    - *match* (a 2- or 3-gram lookup match; ``MATCH_ARMS``): prompt lookup's chain alone (SPECTRA's
      fill beside it was measured slower);
    - *weak* (a 1-gram match; ``WEAK_ARMS``): the chain, with or without SPECTRA's guesses filling
      the rest of the budget;
    - *no-match* (no lookup match, SPECTRA guesses; ``NO_MATCH_ARMS``): SPECTRA's guesses filling
      the device's flat-verify budget (``nodes``: ``calibration.json`` ``tree_budget`` − 1; merged
      into one trie, shared prefixes share nodes), with or without the trained drafter's chain first
      (where the node budget was not measured on this device, ``plain_arm``: the plain forward as
      well);
    - *blank* (neither; ``BLANK_ARMS``, also every no-match step of a hybrid without SPECTRA): a
      plain forward, what ``pld`` does, or the drafter's chain.

    Which arm pays is measured, not modelled (SPIDE's "measure, then decide" applied to whole steps;
    a bandit over step kinds): per request language (``lang_of``: fastText's label of the prompt),
    drafter language and step kind, running means of the tokens and the seconds of the steps each
    arm ran (each from the start of ``propose`` to the end of ``update``: lookup, drafting, the
    verification, every table update). The means of a request language carry over from request to
    request; where the language is unknown they are kept only as a prior worth ``prior_steps`` steps
    (``begin``: what pays depends on the request's language). The first ``warmup`` steps of each
    kind try the arms in turn; then the fastest arm runs, and every ``probe_every``-th step of the
    kind re-measures the arm measured longest ago, so a drafter that does not pay on a language's
    requests costs only its probes. Inside a drafter step the drafter drafts a chain token by token
    while the estimated probability that the next draft survives (SPIDE table of its confidences)
    times the time an accepted token saves exceeds its measured cost per token. The drafter runs on
    no-match steps only: beside a prompt-lookup match it adds almost nothing (evidence:
    docs/experiments.md#the-hybrids-drafter-on-no-match-steps-only). Sampling: a chain from the
    source with the best recent acceptance (Leviathan rejection sampling stays exact); the arms are
    not measured there.
    """

    name = "hybrid"
    needs_feats = True
    tree_capable = True

    def __init__(
        self,
        drafter: DrafterSource | None,
        ngram: list[DraftSource],
        nodes: int = 12,
        gamma_max: int = 6,
        probe_every: int = 8,
        warmup: int = 3,
        prior_steps: int = 1,
        lang_of: Callable[[list[int]], str | None] | None = None,
        plain_arm: bool = False,
    ):
        if not ngram or not isinstance(ngram[0], PromptLookup):
            raise PolyspecError(
                "hybrid: the first n-gram source must be prompt lookup (its match decides the "
                "drafter)"
            )
        self.drafter, self.ngram, self.nodes = drafter, ngram, nodes
        self.gamma_max, self.probe_every, self.warmup = gamma_max, probe_every, warmup
        self.prior_steps = prior_steps
        # prompt ids → the request's language (None: unknown); keys the arms' measurements
        self.lang_of = lang_of
        # a plain forward beside SPECTRA's arms (the node budget was not measured here)
        self.plain_arm = plain_arm
        # blank steps (no lookup match, no SPECTRA guess) and weak matches (a 1-gram) are kinds of
        # their own (``scripts/experiments/hybrid_ab.py``'s ``noblank`` and ``noweak`` turn them off
        # to compare)
        self.split_blank = self.split_weak = True
        self.request_lang: str | None = None
        # running mean cost of one drafted token (s); measured from the first step
        self.draft_tok_s = 0.002
        # (request language, drafter language, step kind) → arm → its measured steps
        self.arms: dict[tuple[str | None, str | None, str], dict[str, _Arm]] = {}
        self.last_tried: dict[tuple, dict[str, int]] = {}  # … → arm → decision it last ran at
        self.decisions: dict[tuple, int] = {}  # decisions taken per key
        # "kind:arm" → steps it ran, over every request (``chosen``: per arm)
        self.by_kind: dict[str, int] = {}
        self.acc_rate = {s.name: 0.5 for s in ngram} | ({drafter.name: 0.5} if drafter else {})
        self.used_drafter = self.no_match = False
        self.choice: str | None = None  # this step's arm (None: sampling or a chain-only fallback)
        self._t0, self._measured = 0.0, None  # the step being timed, and the arm it counts for
        # the drafter language whose cache is warm (its first step catches up a whole prompt)
        self._warm_lang = None
        if drafter is not None:
            drafter.spide = drafter.spide or SpideTable()

    @property
    def max_nodes(self) -> int:
        """The most nodes one step can propose (prompt lookup's chain goes in whole, past the
        budget)."""
        return max(
            [self.nodes]
            + [max(s.gamma, s.grow_to or 0) for s in self.ngram if isinstance(s, PromptLookup)]
        )

    @property
    def chosen(self) -> dict[str, int]:
        """arm → steps it ran, over every request and step kind (the bench's per-source table shows
        the same per language from the steps' proposers)."""
        out: dict[str, int] = {}
        for kind_arm, n in self.by_kind.items():
            arm = kind_arm.split(":", 1)[1]
            out[arm] = out.get(arm, 0) + n
        return out

    @property
    def aux_layers(self) -> list[int] | None:
        """The drafter's (EAGLE-3: the target layers its features come from)."""
        return self.drafter.aux_layers if self.drafter is not None else None

    def begin(self, ctx: DecodeState) -> None:
        """A new request. What an arm yields depends on the request, its language above all (the
        drafter language is only ADASPEC's nearest drafter: a zh request may run the ja drafter,
        whose acceptance on ja requests says little about zh), so the arms are measured per request
        language; where ``lang_of`` knows none, every arm's running means carry over only as a prior
        worth ``prior_steps`` steps, which the request's own steps soon outweigh."""
        self._warm_lang = None
        self.request_lang = (
            self.lang_of(ctx.tokens[: ctx.prompt_len]) if self.lang_of is not None else None
        )
        # language unknown: earlier requests' measurements are only a prior
        if self.request_lang is None:
            for arms in self.arms.values():
                for a in arms.values():
                    a.n = min(a.n, self.prior_steps)
        for s in self.sources:
            s.begin(ctx)

    @property
    def sources(self) -> list[DraftSource]:
        return ([self.drafter] if self.drafter else []) + self.ngram

    def _tau(self) -> float:
        """Rough tokens per step from the sources' recent acceptance."""
        return 1.0 + sum(self.acc_rate.values()) / max(len(self.acc_rate), 1)

    def _key(self, kind: str) -> tuple[str | None, str | None, str]:
        return self.request_lang, getattr(self.drafter, "lang", None), kind

    def arm_names(self, kind: str) -> tuple[str, ...]:
        """The arms of a step kind (``match`` / ``weak`` / ``no-match`` / ``blank``) this hybrid has
        (no drafter: no drafter arms; no SPECTRA: a weak match is a match and a no-match step
        ``NO_SPECTRA_ARMS``; a node budget not measured here: the plain forward beside SPECTRA's
        arms too)."""
        if kind == "match":
            names = MATCH_ARMS
        elif kind == "weak":
            names = WEAK_ARMS if len(self.ngram) > 1 else MATCH_ARMS
        elif kind == "blank":
            names = BLANK_ARMS
        elif len(self.ngram) > 1:
            names = tuple(dict.fromkeys(("plain",) * self.plain_arm + NO_MATCH_ARMS))
        else:
            names = NO_SPECTRA_ARMS
        return tuple(a for a in names if self.drafter is not None or "drafter" not in a)

    def arm(self, name: str, kind: str = "no-match") -> _Arm:
        """The measured steps of arm ``name`` of step kind ``kind`` for the current request and
        drafter language."""
        return self.arms.setdefault(self._key(kind), {a: _Arm() for a in self.arm_names(kind)})[
            name
        ]

    def choose(self, kind: str) -> str:
        """This step's arm: each arm in turn until every one has ``warmup`` measured steps, then the
        one with the most tokens per second, except every ``probe_every``-th step, which re-measures
        the arm measured longest ago (an estimate that is never refreshed could keep a once-unlucky
        arm out for good)."""
        names = self.arm_names(kind)
        key = self._key(kind)
        arms = {a: self.arm(a, kind) for a in names}
        tried = self.last_tried.setdefault(key, {a: -1 for a in names})
        n = self.decisions[key] = self.decisions.get(key, 0) + 1
        if len(names) == 1:
            pick = names[0]
        elif min(a.seen for a in arms.values()) < self.warmup:
            # the least measured, then the longest ago
            pick = min(names, key=lambda a: (arms[a].seen, tried[a]))
        else:
            best = max(names, key=lambda a: arms[a].rate)
            others = [a for a in names if a != best]
            pick = min(others, key=lambda a: tried[a]) if n % self.probe_every == 0 else best
        tried[pick] = n
        return pick

    def propose(self, ctx: DecodeState) -> Proposal:
        self._t0 = time.perf_counter()
        # set below for the greedy tree only: update() measures those
        self.used_drafter = self.no_match = False
        self.choice, self._measured = None, None
        if ctx.temperature > 0 or not ctx.tree_ok:
            best = max(self.sources, key=lambda s: self.acc_rate[s.name])
            p = best.propose(ctx) if best is not self.drafter else self._drafter_chain(ctx)
            # sampling: core gives n-gram drafts point-mass q
            return p if p.is_chain else p.first_chain()
        if ctx.max_depth < 1:
            return Proposal()
        # prompt lookup (the factory's order): its match decides the step kind
        lookup = self.ngram[0].propose(ctx)
        kind, guesses = "match", None
        if lookup.tokens and self.split_weak and self.ngram[0].match_len < 2:
            kind = "weak"
        elif not lookup.tokens:
            kind = "no-match"
            if len(self.ngram) > 1:  # SPECTRA's guesses (free); none: a blank step
                guesses = [s.propose(ctx) for s in self.ngram[1:]]
                if self.split_blank and not any(g.tokens for g in guesses):
                    kind = "blank"
        self.no_match = kind in ("no-match", "blank")
        arm = self.choice = self.choose(kind)
        self.by_kind[f"{kind}:{arm}"] = self.by_kind.get(f"{kind}:{arm}", 0) + 1
        self._measured = self.arm(arm, kind)
        self.used_drafter = "drafter" in arm
        cands = [lookup]
        if self.used_drafter:
            # its first step of a request or language syncs a whole prompt: a one-off, not its step
            # cost
            if self.drafter.lang != self._warm_lang:
                self._measured, self._warm_lang = None, self.drafter.lang
            cands.append(self._drafter_chain(ctx))
        if "spectra" in arm:  # a weak match's guesses are looked up only when its arm takes them
            cands += guesses if guesses is not None else [s.propose(ctx) for s in self.ngram[1:]]
        # prompt lookup's chain (first) goes in whole, as deep as it matched; the others fill the
        # device's flat budget only (past it every extra node costs verification time: on the 2-core
        # CPU in bf16 verify(k) rises from ~1.1 forwards at 6 tokens to ~2 at 15), so they pay where
        # PLD has little or nothing
        return merge(cands, max(self.nodes, len(lookup.tokens)), ctx.max_depth)

    def _drafter_chain(self, ctx: DecodeState) -> Proposal:
        """Draft while P(all drafts so far survive) · (time an accepted token saves) > cost of one
        more draft."""
        d = self.drafter
        tau = self._tau()
        saved = (ctx.step_s or 0.03) / tau
        threshold = min(0.9, self.draft_tok_s / max(saved, 1e-6))
        t0 = time.perf_counter()
        tokens, qs, _ = d.draft_chain(ctx, min(self.gamma_max, ctx.max_depth), threshold)
        if tokens:
            self.draft_tok_s = 0.8 * self.draft_tok_s + 0.2 * (time.perf_counter() - t0) / (
                len(tokens) + 1
            )
        return Proposal.chain(tokens, d.name, qs if ctx.temperature > 0 else None, d.lang, d.size)

    def update(self, ctx: DecodeState, v: Verified) -> None:
        # acceptance per source: did the kept path run through its nodes?
        for name in [s.name for s in self.sources]:
            if v.proposed_by(name):
                self.acc_rate[name] = (
                    0.9 * self.acc_rate[name] + 0.1 * min(v.kept_from(name), 4) / 4
                )
        if self.used_drafter and self.drafter is not None:
            self.drafter.learn_lengths(v)
        for s in self.sources:
            s.update(ctx, v)
        # the whole step: lookup, drafting, verification, the updates above
        if self._measured is not None:
            if ctx.feats.is_cuda:
                torch.cuda.synchronize(ctx.feats.device)
            self._measured.add(v.kept or 1 + v.accepted, time.perf_counter() - self._t0)


def merge(cands: list[Proposal], budget: int, max_depth: int) -> Proposal:
    """Union of proposals as one trie (shared prefixes share nodes), in the order given, at most
    ``budget`` nodes and ``max_depth`` deep; a node's origin names every source that proposed it
    ("a+b")."""
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
