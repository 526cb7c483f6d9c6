"""decoder/sources.py without a target: prompt lookup's loop-aware variant and the hybrid's choice of when the
trained drafter runs (crafted contexts whose next tokens are known; a fake drafter that counts its calls)."""

from __future__ import annotations

import torch

from decoder.ngram import prompt_lookup
from decoder.sources import DecodeState, DraftSource, HybridSource, PromptLookup, SpectraSource, Verified
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
    hyb = HybridSource(drafter, [PromptLookup(10, grow_to=20)], nodes=10, probe_every=4)
    ctx = state([10, 11, 12, 13])
    hyb.begin(ctx)
    hyb.gain, hyb.alone, hyb.cost = 0.05, 1.5, 0.02  # 0.05 tokens for 20 ms on a 50 ms step: a loss
    calls = []
    for _ in range(8):
        hyb.propose(ctx)
        calls.append(drafter.calls)
    assert calls == [0, 0, 0, 1, 1, 1, 1, 2]  # skipped, except every probe_every-th no-match step
    hyb.gain = 1.0  # a token per step for 20 ms: pays
    hyb.propose(ctx)
    assert drafter.calls == 3


def test_hybrid_learns_the_drafters_gain_from_what_the_target_kept():
    drafter = FakeDrafter([40, 41, 42])
    hyb = HybridSource(drafter, [PromptLookup(10, grow_to=20)], nodes=10)
    ctx = state([10, 11, 12, 13])
    hyb.begin(ctx)
    gain = hyb.gain
    p = hyb.propose(ctx)
    hyb.update(ctx, verified(p, kept=3))  # the drafter's three tokens were kept, no n-gram branch had them
    assert hyb.gain > gain
    alone = hyb.alone
    hyb.gain, hyb.cost = 0.0, 1.0  # now it never pays: the next no-match step runs without it
    p = hyb.propose(ctx)
    assert not hyb.used_drafter and p.tokens == []
    hyb.update(ctx, verified(p, kept=0))
    assert hyb.alone < alone  # one token in that step


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
    measures = (hyb.gain, hyb.alone)
    fresh.tree_ok = False  # past the sliding window (or sampling): one source's chain, not the measured tree
    p = hyb.propose(fresh)
    hyb.update(fresh, verified(p, kept=len(p.tokens)))
    assert not hyb.no_match and not hyb.used_drafter and (hyb.gain, hyb.alone) == measures
