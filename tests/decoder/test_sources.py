"""The draft sources (decoder/drafts/) without a target: prompt lookup's loop-aware variant and the
hybrid's choice of when the trained drafter runs (crafted contexts whose next tokens are known; a
fake drafter that counts its calls)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from decoder.drafts.hybrid import HybridSource, _Arm
from decoder.drafts.ngram import PromptLookup, SpectraSource
from decoder.drafts.spectra import Spectra
from decoder.drafts.tables import prompt_lookup
from decoder.drafts.types import DecodeState, DraftSource, Verified


def state(tokens: list[int], max_depth: int = 32) -> DecodeState:
    return DecodeState(
        list(tokens),
        torch.empty(0),
        prompt_len=1,
        pend=len(tokens) - 1,
        max_depth=max_depth,
        step_s=0.05,
    )


def verified(prop, kept: int) -> Verified:
    """The target kept the first ``kept`` nodes of a chain proposal."""
    n = len(prop.tokens)
    logits = torch.zeros(n + 1, 64)  # what SPECTRA's update reads (a flat distribution)
    return Verified(
        [0, *prop.tokens], list(range(-1, n)), logits, list(range(kept + 1)), prop.origin
    )


def guessing_spectra() -> Spectra:
    """SPECTRA whose RETRIEVAL corpus has a guess after ``… 12 13`` (the no-match contexts below): a
    no-match step, not a blank one."""
    sp = Spectra(64)
    sp.add_corpus([[12, 13, 30, 31, 32]])
    return sp


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
    # γ ≤ period: plain PLD
    assert prompt_lookup(loop, 2, extend=True) == prompt_lookup(loop, 2) == [3, 1]


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


def test_hybrid_runs_the_drafter_only_on_no_match_steps_whose_arm_is_the_drafters():
    drafter = FakeDrafter([40, 41, 42])
    hyb = HybridSource(drafter, [PromptLookup(10, grow_to=20)], nodes=10)
    fresh = state([10, 11, 12, 13])  # no earlier n-gram: prompt lookup has nothing
    hyb.begin(fresh)
    # no SPECTRA
    assert hyb.arm_names("no-match") == ("plain", "drafter") and hyb.arm_names("match") == ("pld",)
    # 20 vs 50 tok/s
    hyb.arms[(None, "en", "no-match")] = {
        "plain": _Arm(5, 1.0, 0.05, 5),
        "drafter": _Arm(5, 3.0, 0.06, 5),
    }
    p = hyb.propose(fresh)
    assert hyb.choice == "drafter" and drafter.calls == 1
    assert p.tokens[:3] == [40, 41, 42] and set(p.origin) == {"drafter"}
    # "10 11" occurred before: prompt lookup proposes what followed
    looping = state([10, 11, 12, 10, 11])
    for _ in range(10):  # a match step never runs the drafter, probes included
        p = hyb.propose(looping)
        assert hyb.choice == "pld" and p.tokens[0] == 12 and "drafter" not in p.origin
    assert drafter.calls == 1


def test_hybrid_skips_a_drafter_that_does_not_pay_and_probes_it_again():
    drafter = FakeDrafter([40, 41])
    hyb = HybridSource(drafter, [PromptLookup(10, grow_to=20)], nodes=10, probe_every=4, warmup=3)
    ctx = state([10, 11, 12, 13])
    hyb.begin(ctx)
    # 30 vs 23 tok/s
    hyb.arms[(None, "en", "no-match")] = {
        "plain": _Arm(5, 1.5, 0.050, 5),
        "drafter": _Arm(5, 1.6, 0.070, 5),
    }
    calls = []
    for _ in range(8):
        p = hyb.propose(ctx)
        calls.append(drafter.calls)
        # prompt lookup's own step: nothing to verify
        assert (p.tokens == []) == (hyb.choice == "plain")
    assert calls == [0, 0, 0, 1, 1, 1, 1, 2]  # skipped, except every probe_every-th no-match step
    hyb.arms[(None, "en", "no-match")]["drafter"] = _Arm(5, 3.0, 0.070, 5)  # 43 tok/s with it: pays
    hyb.propose(ctx)
    assert drafter.calls == 3
    # another language (ADASPEC switched the drafter): measured on its own, from scratch
    drafter.lang = "de"
    assert hyb.arm("drafter").n == 0


def test_hybrid_tries_every_arm_then_runs_the_fastest_and_reprobes_the_stalest(monkeypatch):
    import decoder.drafts.hybrid as H

    # every step takes 10 ms, so the tokens a step keeps decide (wall time would make a loaded host
    # flip it)
    clock = [0.0]
    monkeypatch.setattr(H, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    drafter = FakeDrafter([40, 41, 42])
    hyb = HybridSource(
        drafter,
        [PromptLookup(10, grow_to=20), SpectraSource(guessing_spectra(), 10)],
        nodes=10,
        warmup=2,
        probe_every=5,
    )
    # beside SPECTRA neither a plain forward nor the drafter's chain alone is an arm
    # (decoder.drafts.hybrid: dominated)
    assert hyb.arm_names("no-match") == ("spectra", "drafter+spectra")
    # SPECTRA's fill beside a match was measured slower (decoder.drafts.hybrid)
    assert hyb.arm_names("match") == ("pld",)
    ctx = state([10, 11, 12, 13])
    hyb.begin(ctx)
    p = hyb.propose(ctx)
    clock[0] += 0.01
    hyb.update(ctx, verified(p.first_chain(), kept=len(p.first_chain().tokens)))
    ran = [hyb.choice]
    # warm-up: each arm in turn until every one has two measured steps, then the fastest
    for _ in range(5):
        p = hyb.propose(ctx)
        ran.append(hyb.choice)
        clock[0] += 0.01
        hyb.update(ctx, verified(p.first_chain(), kept=3 if hyb.used_drafter else 0))
    assert ran[:2] == ["spectra", "drafter+spectra"] and sorted(ran[2:4]) == [
        "drafter+spectra",
        "spectra",
    ]
    arms = hyb.arms[(None, "en", "no-match")]
    # SPECTRA's first step kept its three guesses (+ the target's token), its second nothing (the
    # target's token)
    assert all(a.n >= 2 for a in arms.values()) and arms["spectra"].tokens == 2.5
    # 3 drafts + 1
    assert arms["drafter+spectra"].tokens == 4.0 and arms["drafter+spectra"].secs == pytest.approx(
        0.01
    )
    # after the warm-up the fastest: 400 tok/s against 250
    assert ran[4:] == ["drafter+spectra", "drafter+spectra"]
    for a, rate in {"spectra": 30, "drafter+spectra": 80}.items():
        arms[a] = _Arm(5, rate * 0.05, 0.05, 5)
    picks = []
    for _ in range(15):
        hyb.propose(ctx)
        picks.append(hyb.choice)
    # every 5th step probes the other
    assert picks.count("drafter+spectra") == 12 and picks.count("spectra") == 3


def test_hybrid_falls_back_to_prompt_lookups_own_step_where_nothing_beats_it():
    """The measured rates decide: without SPECTRA, with the drafter slower than a plain forward on
    no-match steps and prompt lookup's chain the one match arm, the hybrid runs what `pld` runs on
    all but its probing steps; with SPECTRA, a drafter that does not pay costs only its probes
    (SPECTRA's trees run the other steps)."""
    for ngram, fallback in (([], "plain"), ([SpectraSource(guessing_spectra(), 10)], "spectra")):
        drafter = FakeDrafter([40, 41, 42])
        hyb = HybridSource(drafter, [PromptLookup(10, grow_to=20), *ngram], nodes=10, probe_every=8)
        hyb.begin(state([10, 11, 12, 13]))
        with_drafter = "drafter+spectra" if ngram else "drafter"
        hyb.arms[(None, "en", "no-match")] = {
            fallback: _Arm(9, 1.0, 0.04, 9),
            with_drafter: _Arm(9, 1.2, 0.06, 9),
        }
        hyb.arms[(None, "en", "match")] = {"pld": _Arm(9, 4.0, 0.05, 9)}
        no_match, match = state([10, 11, 12, 13]), state([10, 11, 12, 10, 11])
        picks = {"no-match": [], "match": []}
        for _ in range(40):
            for kind, ctx in (("no-match", no_match), ("match", match)):
                p = hyb.propose(ctx)
                picks[kind].append(hyb.choice)
                if hyb.choice in ("plain", "pld"):  # exactly prompt lookup's step
                    assert p.tokens == PromptLookup(10, grow_to=20).propose(ctx).tokens and set(
                        p.origin
                    ) <= {"pld"}
                if hyb.choice == "spectra":  # SPECTRA's tree alone, the drafter idle
                    assert set(p.origin) <= {"spectra"} and not hyb.used_drafter
        # 1 in 8 probes
        assert picks["no-match"].count(fallback) == 35 and picks["match"].count("pld") == 40
        assert hyb.chosen[fallback] == 35 and sum(hyb.chosen.values()) == 80 and drafter.calls == 5


def test_hybrid_proposals_stay_within_its_span_and_fallback_steps_leave_its_measures_alone():
    drafter = FakeDrafter([40, 41, 42])
    hyb = HybridSource(
        drafter, [PromptLookup(10, grow_to=20), SpectraSource(Spectra(64), 10)], nodes=10
    )
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
    measures = {k: {a: x.n for a, x in arms.items()} for k, arms in hyb.arms.items()}
    # past the sliding window (or sampling): one source's chain, not the measured tree
    fresh.tree_ok = False
    p = hyb.propose(fresh)
    hyb.update(fresh, verified(p, kept=len(p.tokens)))
    assert not hyb.no_match and not hyb.used_drafter and hyb.choice is None
    assert {k: {a: x.n for a, x in arms.items()} for k, arms in hyb.arms.items()} == measures


def test_a_new_request_keeps_the_arms_means_only_as_a_prior():
    """What pays depends on the request: a drafter that paid on earlier requests (say ja ones) but
    keeps nothing on this one (a zh request drafted by the nearest drafter, ja's) is dropped after a
    few of this request's steps, not after as many steps as the earlier requests had."""
    drafter = FakeDrafter([40, 41, 42])
    hyb = HybridSource(drafter, [PromptLookup(10, grow_to=20)], nodes=10, probe_every=1000)
    ctx = state([10, 11, 12, 13])
    hyb.begin(ctx)
    hyb.arms[(None, "en", "no-match")] = {
        "plain": _Arm(40, 1.0, 0.042, 40),
        "drafter": _Arm(40, 2.33, 0.061, 40),
    }
    hyb._warm_lang = "en"  # its cache is warm: every drafter step is measured
    hyb.begin(ctx)
    hyb._warm_lang = "en"
    # a one-step prior, the history kept
    assert hyb.arm("drafter").n == 1 and hyb.arm("drafter").seen == 40
    ran = []
    for _ in range(12):
        p = hyb.propose(ctx)
        ran.append(hyb.choice)
        hyb.update(ctx, verified(p, kept=0))  # this request keeps none of the drafter's tokens
        # the times as before (not measured)
        hyb.arm(hyb.choice).secs = 0.061 if hyb.choice == "drafter" else 0.042
    assert ran[0] == "drafter" and ran[-1] == "plain" and ran.count("drafter") <= 3


def test_the_hybrid_measures_its_arms_per_request_language():
    """``lang_of`` (the prompt's language): a request of a language already seen keeps that
    language's measures whole (no prior clamp); another language's requests are measured on their
    own, with the same drafter."""
    lang = {"now": "ja"}
    hyb = HybridSource(
        FakeDrafter([40, 41]),
        [PromptLookup(10, grow_to=20)],
        nodes=10,
        lang_of=lambda ids: lang["now"],
    )
    ctx = state([10, 11, 12, 13])
    hyb.begin(ctx)
    assert hyb.request_lang == "ja" and hyb._key("no-match") == ("ja", "en", "no-match")
    hyb.arms[("ja", "en", "no-match")] = {
        "plain": _Arm(40, 1.0, 0.042, 40),
        "drafter": _Arm(40, 2.33, 0.061, 40),
    }
    hyb.begin(ctx)  # another ja request
    assert hyb.arm("drafter").n == 40
    lang["now"] = "zh"
    hyb.begin(ctx)
    assert hyb.arm("drafter").seen == 0 and hyb.choose("no-match") in ("plain", "drafter")
    lang["now"] = "ja"
    hyb.begin(ctx)
    assert hyb.arm("drafter").n == 40 and hyb.arm("drafter").rate == pytest.approx(2.33 / 0.061)


def test_the_request_language_is_fasttexts_label_of_the_prompt():
    from decoder.methods import _request_language

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return {
                1: (
                    "### Instruction:\nTại sao bầu trời có màu xanh vào ban ngày?\n\n"
                    "### Response:\n"
                ),
                2: "### Instruction:\nWarum ist der Himmel am Tag blau?\n\n### Response:\n",
            }[ids[0]]

    lang_of = _request_language(Tok())
    assert lang_of([1]) == "vi" and lang_of([2]) == "de"


def test_the_hybrid_ab_harness_decodes_every_variant_losslessly(tiny_llama_dir, tmp_path):
    """scripts/experiments/hybrid_ab.py (the arm choices' harness): every variant on every prompt,
    the target's own tokens (fp32), per language and overall; the hybrid's and adaspec's variants
    drafted (τ > 1) and the module's arms are restored after."""
    import importlib.util

    import decoder.drafts.hybrid as H
    from conftest import REPO, make_tiny_bundle, random_prompts
    from polyspec.targets import greedy_generate, load_target

    spec = importlib.util.spec_from_file_location(
        "hybrid_ab", REPO / "scripts" / "experiments" / "hybrid_ab.py"
    )
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    llama = load_target(str(tiny_llama_dir))
    bundle = make_tiny_bundle(
        tmp_path / "oracle", llama, drafter="oracle", noise=0.05, sizes=(64, 768)
    )
    prompts = [
        (lang, p)
        for lang, p in zip(("en", "de", "en"), random_prompts(llama, 3, seed=5, max_len=30))
    ]
    variants = [
        "pld",
        "hybrid",
        "hybrid:plain4:nolid",
        "hybrid:only-drafter+spectra",
        "hybrid:plain:warmup=1",
        "hybrid:gmax=2",
        "adaspec:gamma=2",
    ]
    no_match: dict = {}
    agg, outputs = ab.compare(llama, bundle, prompts, variants, 24, no_match_out=no_match)
    refs = [greedy_generate(llama, p, 24) for _, p in prompts]
    assert all(outputs[v] == refs for v in variants)
    assert set(agg["hybrid"]) == {"en", "de", "all"} and agg["hybrid"]["all"][1] == sum(
        len(r) for r in refs
    )
    for v in variants[1:]:
        secs, tokens, steps = agg[v]["all"]
        assert secs > 0 and tokens / steps > 1.2, v
    assert H.NO_MATCH_ARMS == ("spectra", "drafter+spectra")
    # pld's steps that drafted nothing: a share of its step time
    blank, every = no_match["pld"]["all"]
    assert 0 < blank < every <= agg["pld"]["all"][0]
    with pytest.raises(SystemExit, match="unknown change"):
        ab.build("hybrid:what", llama, bundle)
    assert ab.build("hybrid:warmup=1", llama, bundle)[0].source.warmup == 1
    assert ab.build("hybrid:gmax=2", llama, bundle)[0].source.gamma_max == 2
    assert ab.build("adaspec:gamma=3", llama, bundle)[0].gamma == 3


def test_a_node_budget_not_measured_here_keeps_the_plain_forward_as_an_arm():
    """SPECTRA's tree is an arm beside nothing only where the calibration measured that a tree of
    that many nodes costs about a forward; otherwise (``plain_arm``) the plain forward stays an arm
    and wins where the tree does not pay."""
    drafter = FakeDrafter([40, 41, 42])
    hyb = HybridSource(
        drafter,
        [PromptLookup(10, grow_to=20), SpectraSource(Spectra(64), 10)],
        nodes=10,
        probe_every=8,
        plain_arm=True,
    )
    assert hyb.arm_names("no-match") == ("plain", "spectra", "drafter+spectra")
    hyb.begin(state([10, 11, 12, 13]))
    hyb.arms[(None, "en", "no-match")] = {
        "plain": _Arm(9, 1.0, 0.04, 9),
        "spectra": _Arm(9, 1.1, 0.06, 9),
        "drafter+spectra": _Arm(9, 1.3, 0.08, 9),
    }
    picks = [hyb.choose("no-match") for _ in range(16)]
    assert picks.count("plain") == 14 and set(picks) == {"plain", "spectra", "drafter+spectra"}


def test_hybrid_tells_blank_steps_and_weak_matches_from_the_others():
    """Both lookups are free, so what they found decides the step kind before any arm runs: no
    lookup match and no SPECTRA guess → ``blank`` (the plain forward or the drafter: nothing else
    can propose); a 1-gram lookup match → ``weak`` (prompt lookup's chain, with or without SPECTRA's
    guesses beside it); 2- and 3-gram matches → ``match``."""

    def hybrid():
        return HybridSource(
            FakeDrafter([40, 41, 42]),
            [PromptLookup(10, grow_to=20), SpectraSource(guessing_spectra(), 10)],
            nodes=12,
        )

    blank, no_match = state([10, 11, 12, 14]), state([10, 11, 12, 13])
    weak, strong = state([13, 20, 5, 12, 13]), state([10, 13, 20, 10, 13])
    for ctx, kind, arms in (
        (blank, "blank", ("plain", "drafter")),
        (no_match, "no-match", ("spectra", "drafter+spectra")),
        (weak, "weak", ("pld", "pld+spectra")),
        (strong, "match", ("pld",)),
    ):
        hyb = hybrid()
        hyb.begin(ctx)
        assert hyb.arm_names(kind) == arms
        ran = []
        for _ in arms:  # unmeasured (no update): each arm in turn
            p = hyb.propose(ctx)
            ran.append(hyb.choice)
            if hyb.choice == "plain":
                assert p.tokens == []  # a plain forward: nothing proposed
            # prompt lookup's chain first, SPECTRA's guesses beside it (12 nodes)
            if hyb.choice == "pld+spectra":
                assert p.tokens[:10] == PromptLookup(10, grow_to=20).propose(ctx).tokens
                assert (
                    p.tokens[10:] == [30, 31]
                    and p.parents[10:] == [-1, 10]
                    and p.origin[10:] == ["spectra"] * 2
                )
        assert ran == list(arms) and set(hyb.by_kind) == {f"{kind}:{a}" for a in arms}
    hyb = hybrid()
    # scripts/experiments/hybrid_ab.py's noblank / noweak: the kinds before
    hyb.split_blank = hyb.split_weak = False
    hyb.begin(blank)
    hyb.propose(blank)
    assert hyb.choice == "spectra"
    hyb.propose(weak)
    assert hyb.choice == "pld" and set(hyb.by_kind) == {"no-match:spectra", "match:pld"}
