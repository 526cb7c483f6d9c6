"""decoder/sources.py without a target: prompt lookup's loop-aware variant and the hybrid's choice of when the
trained drafter runs (crafted contexts whose next tokens are known; a fake drafter that counts its calls)."""

from __future__ import annotations

import torch

from decoder.ngram import prompt_lookup
from decoder.sources import (
    DecodeState,
    DraftSource,
    HybridSource,
    PromptLookup,
    SpectraSource,
    Verified,
    _Arm,
)
from decoder.spectra import Spectra


def state(tokens: list[int], max_depth: int = 32) -> DecodeState:
    return DecodeState(list(tokens), torch.empty(0), prompt_len=1, pend=len(tokens) - 1, max_depth=max_depth,
                       step_s=0.05)


def verified(prop, kept: int) -> Verified:
    """The target kept the first ``kept`` nodes of a chain proposal."""
    n = len(prop.tokens)
    logits = torch.zeros(n + 1, 64)  # what SPECTRA's update reads (a flat distribution)
    return Verified([0, *prop.tokens], list(range(-1, n)), logits, list(range(kept + 1)), prop.origin)


class FakeDrafter(DraftSource):
    name = "drafter"
    needs_feats = True

    def __init__(self, tokens: list[int]):
        self.tokens, self.calls, self.spide, self.lang, self.size = tokens, 0, None, "en", None

    def draft_chain(self, ctx, gamma, threshold=None):
        self.calls += 1
        return self.tokens[:gamma], [], []

    def learn_lengths(self, v) -> None:
        pass


def test_prompt_lookup_extends_a_loop_past_the_context():
    loop = [7, 1, 2, 3, 1, 2]  # period 3: "1 2 3" repeats
    assert prompt_lookup(loop, 8) == [3, 1, 2]  # transformers' PLD stops at the end of the context
    assert prompt_lookup(loop, 8, extend=True) == [3, 1, 2, 3, 1, 2, 3, 1]
    assert prompt_lookup([5, 9, 9], 4, extend=True) == [9, 9, 9, 9]
    assert prompt_lookup([1, 2, 3, 4], 5, extend=True) == []  # no match: nothing to extend
    assert prompt_lookup(loop, 2, extend=True) == prompt_lookup(loop, 2) == [3, 1]  # γ ≤ period: plain PLD


def test_lookup_depth_doubles_after_a_whole_chain_and_resets_on_a_rejection():
    pld = PromptLookup(4, grow_to=10)
    ctx = state([7, 1, 2, 3, 1, 2, 3, 1])
    pld.begin(ctx)
    p = pld.propose(ctx)
    assert p.tokens == [2, 3, 1, 2]
    pld.update(ctx, verified(p, kept=4))  # all kept → twice as deep
    assert len(pld.propose(ctx).tokens) == 8
    pld.update(ctx, verified(pld.propose(ctx), kept=8))
    assert len(pld.propose(ctx).tokens) == 10  # capped at grow_to
    pld.update(ctx, verified(pld.propose(ctx), kept=3))  # a rejection → back to γ
    assert len(pld.propose(ctx).tokens) == 4
    pld.update(ctx, verified(pld.propose(ctx), kept=4))
    pld.begin(ctx)  # a new request starts at γ again
    assert len(pld.propose(ctx).tokens) == 4
    plain = PromptLookup(4)  # the baseline `pld` never grows and never runs past the context
    plain.update(ctx, verified(plain.propose(ctx), kept=4))
    assert plain.propose(ctx).tokens == [2, 3, 1]


def test_hybrid_runs_the_drafter_only_where_prompt_lookup_has_no_match():
    drafter = FakeDrafter([40, 41, 42])
    hyb = HybridSource(drafter, [PromptLookup(10, grow_to=20)], nodes=10)
    fresh = state([10, 11, 12, 13])  # no earlier n-gram: prompt lookup has nothing
    hyb.begin(fresh)
    p = hyb.propose(fresh)
    assert drafter.calls == 1 and p.tokens[:3] == [40, 41, 42] and set(p.origin) == {"drafter"}
    looping = state([10, 11, 12, 10, 11])  # "10 11" occurred before: prompt lookup proposes what followed
    p = hyb.propose(looping)
    assert drafter.calls == 1 and p.tokens[0] == 12 and "drafter" not in p.origin


def test_hybrid_skips_a_drafter_that_does_not_pay_and_probes_it_again():
    drafter = FakeDrafter([40, 41])
    hyb = HybridSource(drafter, [PromptLookup(10, grow_to=20)], nodes=10, probe_every=4, warmup=3)
    ctx = state([10, 11, 12, 13])
    hyb.begin(ctx)
    hyb.arms["en"] = {True: _Arm(5, 1.6, 0.070), False: _Arm(5, 1.5, 0.050)}  # 23 tok/s with it, 30 without
    calls = []
    for _ in range(8):
        hyb.propose(ctx)
        calls.append(drafter.calls)
    assert calls == [0, 0, 0, 1, 1, 1, 1, 2]  # skipped, except every probe_every-th no-match step
    hyb.arms["en"][True] = _Arm(5, 3.0, 0.070)  # 43 tok/s with it: pays
    hyb.propose(ctx)
    assert drafter.calls == 3
    drafter.lang = "de"  # another language (ADASPEC switched the drafter): measured on its own, from scratch
    assert hyb.arm(True).n == 0


def test_hybrid_measures_steps_with_and_without_the_drafter():
    drafter = FakeDrafter([40, 41, 42])
    hyb = HybridSource(drafter, [PromptLookup(10, grow_to=20)], nodes=10, warmup=2)
    ctx = state([10, 11, 12, 13])
    hyb.begin(ctx)
    p = hyb.propose(ctx)
    hyb.update(ctx, verified(p, kept=3))
    assert hyb.used_drafter and hyb.arm(True).n == 0  # a request's first drafter step syncs its whole prompt: a
    ran = []  # one-off, left out of the measure
    for kept in (3, 0, 2, 0):  # warm-up: the two kinds of no-match step alternate
        p = hyb.propose(ctx)
        ran.append(hyb.used_drafter)
        hyb.update(ctx, verified(p, kept=kept if hyb.used_drafter else 0))
    assert ran == [True, False, True, False] and drafter.calls == 3
    on, off = hyb.arm(True), hyb.arm(False)
    assert (on.n, off.n) == (2, 2) and on.tokens == 3.5 and off.tokens == 1.0  # (1+3, 1+2) and (1, 1) tokens
    assert on.secs > 0 and off.secs > 0
    on.secs = off.secs  # the drafter's steps as fast, with 3.5× the tokens: it runs from now on
    hyb.propose(ctx)
    assert hyb.used_drafter
    on.secs = 10 * off.secs  # now 0.35× the throughput: the next no-match step runs without it
    p = hyb.propose(ctx)
    assert not hyb.used_drafter and p.tokens == []
    hyb.update(ctx, verified(p, kept=0))
    assert off.n == 3


def test_hybrid_proposals_stay_within_its_span_and_fallback_steps_leave_its_measures_alone():
    drafter = FakeDrafter([40, 41, 42])
    hyb = HybridSource(drafter, [PromptLookup(10, grow_to=20), SpectraSource(Spectra(64), 10)], nodes=10)
    ctx = state([7] + [1, 2, 3] * 12)  # a loop: prompt lookup's chain grows to 20
    hyb.begin(ctx)
    for _ in range(4):
        p = hyb.propose(ctx)
        assert len(p.tokens) <= hyb.max_nodes == 20
        hyb.update(ctx, verified(p.first_chain(), kept=len(p.first_chain().tokens)))
    assert len(hyb.propose(ctx).tokens) == 20
    fresh = state([10, 11, 12, 13])
    hyb.begin(fresh)
    hyb.propose(fresh)
    assert hyb.no_match
    measures = (hyb.arm(True).n, hyb.arm(False).n)
    fresh.tree_ok = False  # past the sliding window (or sampling): one source's chain, not the measured tree
    p = hyb.propose(fresh)
    hyb.update(fresh, verified(p, kept=len(p.tokens)))
    assert not hyb.no_match and not hyb.used_drafter and (hyb.arm(True).n, hyb.arm(False).n) == measures
