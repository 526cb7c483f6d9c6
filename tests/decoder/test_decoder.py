"""decoder/: lossless speculative decoding on tiny random targets.

Greedy: every method's tokens equal the target's own greedy decoding (our AR loop and transformers'
``generate``) on hundreds of random prompts, several chain lengths and tree shapes, both model
families. Sampling: a χ² test cannot tell speculative sampling from the target's exact distribution,
and catches a deliberately broken acceptance rule.
"""

from __future__ import annotations

import pytest
import torch

from conftest import (
    SHAPES,
    chi2_pvalue,
    draw_pairs,
    exact_pair_distribution,
    make_tiny_bundle,
    random_prompts,
    run_cli,
)
from polyspec.errors import PolyspecError
from polyspec.targets import greedy_generate, load_target


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    return load_target(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def gemma(tiny_gemma_dir):
    return load_target(str(tiny_gemma_dir))


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, llama, gemma):
    """Oracle-like drafters (the target with noisy weights: partial acceptance) and random
    EAGLE/small-LM ones."""
    root = tmp_path_factory.mktemp("bundles")
    return {
        ("llama", "oracle"): make_tiny_bundle(
            root / "llama-oracle", llama, drafter="oracle", noise=0.05, sizes=(64, 768)
        ),
        ("gemma3", "oracle"): make_tiny_bundle(
            root / "gemma-oracle", gemma, drafter="oracle", noise=0.05, sizes=(64, 768)
        ),
        ("llama", "noisy"): make_tiny_bundle(
            root / "llama-noisy", llama, drafter="oracle", noise=0.2, sizes=(64, 256)
        ),
        ("gemma3", "eagle"): make_tiny_bundle(root / "gemma-eagle", gemma, drafter="eagle"),
        ("llama", "small-lm"): make_tiny_bundle(root / "llama-small", llama, drafter="small-lm"),
        ("gemma3", "eagle3"): make_tiny_bundle(root / "gemma-eagle3", gemma, drafter="eagle3"),
        # eagle.num_layers=2: a second, ordinary decoder layer with its own KV cache
        ("gemma3", "eagle3-2layers"): make_tiny_bundle(
            root / "gemma-eagle3-2", gemma, drafter="eagle3", num_layers=2
        ),
    }


def check_lossless(dec, prompts, refs, max_new_tokens):
    """Greedy identity AND evidence that drafts were proposed and kept: a source that never drafts
    (or whose drafts are always rejected) would pass an identity check alone, since it degenerates
    into plain decoding."""
    drafted = accepted = 0
    for k, (prompt, ref) in enumerate(zip(prompts, refs)):
        out = dec.generate(prompt, max_new_tokens, stop=[])
        assert out.tokens == ref, (dec.method, k)
        assert sum(s.new_tokens for s in out.steps) + 1 == len(out.tokens)
        drafted += sum(s.drafted for s in out.steps)
        accepted += sum(s.accepted for s in out.steps)
    assert drafted > 0, f"{dec.method}: never drafted anything"
    assert accepted > 0, f"{dec.method}: drafted {drafted} tokens, none accepted"
    return accepted / drafted


# llama is slow-marked: make test-unit keeps gemma3 (its sliding window is crossed); every SHAPE on
# the llama oracle stays in it through test_stop_strings_and_eos_end_every_method_at_the_same_token
# and test_identity_accepting.py
@pytest.mark.parametrize("family", [pytest.param("llama", marks=pytest.mark.slow), "gemma3"])
def test_greedy_methods_are_token_identical_to_the_target(family, llama, gemma, bundles):
    from decoder.core import Decoder

    target = {"llama": llama, "gemma3": gemma}[family]
    bundle = bundles[(family, "oracle")]
    ar = Decoder(target, method="ar")
    decoders = [(m, o, Decoder(target, bundle, method=m, **o)) for m, o in SHAPES]
    taus = {i: [] for i in range(len(decoders))}
    # 15 prompts per family, lengths up to 90 tokens with 48 new ones: gemma's 64-token sliding
    # window is crossed, so the cache rollback past the window and the tree→chain fallback are both
    # exercised (30 prompts until 2026-11-28: the same paths at twice the cost, 76 s for gemma3 on
    # the Xeon)
    prompts = random_prompts(target, 15, seed=7, max_len=90)
    assert sum(len(p) + 48 > 64 for p in prompts) >= 10, (
        "most answers must cross the sliding window"
    )
    for k, prompt in enumerate(prompts):
        ref = greedy_generate(target, prompt, 48)
        mine = ar.generate(prompt, 48, stop=[])
        assert mine.tokens == ref[: len(mine.tokens)] and mine.target_forwards == len(
            mine.tokens
        ), k
        for i, (m, o, dec) in enumerate(decoders):
            out = dec.generate(prompt, 48, stop=[])
            assert out.tokens == mine.tokens, (m, o, k)
            assert sum(s.new_tokens for s in out.steps) + 1 == len(out.tokens)
            taus[i].append(out.tau)
    # the oracle drafters are usually right over the full vocabulary: multi-token acceptance is
    # exercised
    for i, (m, o, _) in enumerate(decoders):
        mean_tau = sum(taus[i]) / len(taus[i])
        # drafts were kept
        assert mean_tau > (1.5 if o.get("size") == "full" else 1.05), (m, o, mean_tau)


def test_a_source_that_never_drafts_is_caught(llama, bundles, monkeypatch):
    """The lossless check must fail for a draft source that proposes nothing (it would still be
    'identical')."""
    from decoder.core import Decoder
    from decoder.drafts.trained import DrafterSource
    from decoder.drafts.types import Proposal

    prompts = random_prompts(llama, 4, seed=21)
    refs = [greedy_generate(llama, p, 24) for p in prompts]
    dec = Decoder(llama, bundles[("llama", "oracle")], method="chain", gamma=3, size="full")
    assert check_lossless(dec, prompts, refs, 24) > 0.3  # the real drafter passes
    monkeypatch.setattr(DrafterSource, "propose", lambda self, ctx: Proposal())
    with pytest.raises(AssertionError, match="never drafted"):
        check_lossless(
            Decoder(llama, bundles[("llama", "oracle")], method="chain", gamma=3, size="full"),
            prompts,
            refs,
            24,
        )


def test_hybrid_and_spectra_keep_learning_across_requests(llama, bundles):
    """SPECTRA's tables persist: the same prompt decoded twice is accepted more the second time (its
    own answer entered the n-gram dictionaries), and the hybrid reports where its kept tokens came
    from."""
    from decoder.core import Decoder

    prompt = random_prompts(llama, 1, seed=9, max_len=30)[0]
    dec = Decoder(llama, method="spectra", tree_nodes=10)
    first, second = dec.generate(prompt, 40, stop=[]), dec.generate(prompt, 40, stop=[])
    assert first.tokens == second.tokens and second.tau > first.tau
    hyb = Decoder(llama, bundles[("llama", "oracle")], method="hybrid", tree_nodes=10)
    outs = [hyb.generate(prompt, 40, stop=[]) for _ in range(3)]
    assert all(out.tokens == first.tokens and out.tau > 1.2 for out in outs)
    # its arms are tried in turn, then chosen by measured speed: SPECTRA's trees (alone or merged
    # with the drafter's chain) ran and were verified as trees, losslessly
    assert {"spectra", "drafter+spectra"} <= set(hyb.source.chosen) and any(
        s.shape == "tree" for out in outs for s in out.steps
    )


def test_a_drafter_reading_lookup_hints_gets_each_drafts_hint(llama, tmp_path, monkeypatch):
    """``eagle.lookup_hint``: every drafter entry reads the prompt-lookup hint of its own token
    prefix — the verified tokens (``sync``) and then the chain's earlier drafts or the tree node's
    ancestors (``extend``). A drafter made to copy its hint (its output is the head row of the hint
    it was handed) must therefore draft exactly ``lookup_hint`` of each draft's prefix wherever one
    exists, and be accepted like prompt lookup, losslessly."""
    from decoder.core import Decoder
    from decoder.drafts.trained import DrafterSource
    from polyspec.drafter_models import EagleDrafter
    from polyspec.lookup import has_hint, lookup_hint

    bundle = make_tiny_bundle(tmp_path / "hint", llama, drafter="eagle-hint", sizes=(64, 768))
    E = llama.model.get_input_embeddings().weight.float()
    W = llama.model.get_output_embeddings().weight.float()

    def copy_hint(
        self,
        input_embeds,
        features,
        position_ids=None,
        attention_mask=None,
        past_key_values=None,
        use_cache=False,
        hints=None,
    ):
        e, n = hints
        ids = torch.cdist(e[0].float(), E).argmin(-1)  # the embedded hint back to its id
        out = torch.where(
            has_hint(n[0]).unsqueeze(-1), W[ids] / W[ids].norm(dim=-1, keepdim=True) * 4, 0.0
        )
        return out.unsqueeze(0).to(input_embeds.dtype), past_key_values

    monkeypatch.setattr(EagleDrafter, "forward", copy_hint)
    seen = []
    propose = DrafterSource.propose

    def spy(self, ctx):
        prop = propose(self, ctx)
        seen.append((ctx.tokens[: ctx.pend + 1], prop))
        return prop

    monkeypatch.setattr(DrafterSource, "propose", spy)
    prompts = random_prompts(llama, 12, seed=5)
    refs = [greedy_generate(llama, p, 32) for p in prompts]
    for method, opts in (
        ("chain", dict(gamma=3)),
        ("tree", dict(tree_depth=3, tree_topk=2, tree_nodes=6)),
        # runs: test_adaspec_copies_running_loops…
        ("adaspec", dict(gamma=4, lookup_runs=False)),
    ):
        seen.clear()
        # drafts kept
        check_lossless(
            Decoder(llama, bundle, method=method, size="full", **opts), prompts, refs, 32
        )
        hinted = 0
        for prefix, prop in seen:
            for i, (tok, par) in enumerate(zip(prop.tokens, prop.parents)):
                path = []  # the node's ancestors, root first
                while par >= 0:
                    path.insert(0, prop.tokens[par])
                    par = prop.parents[par]
                hint, n = lookup_hint(prefix + path)
                # a first child
                if has_hint(torch.tensor(n)) and (
                    method != "tree" or i == 0 or prop.parents[i] != prop.parents[i - 1]
                ):
                    assert tok == hint, (method, prefix, prop.tokens)
                    hinted += 1
        assert hinted > 50, (method, hinted)


def test_the_reduced_head_keeps_the_prompts_ids(llama, bundles):
    """A request's reduced head: the language's top ranked ids with the prompt's own ids among them
    (at most the size's rows; ``vocab.files.with_prompt_ids``), and its logits are the full head's
    at those ids."""
    from decoder.core import Decoder
    from vocab.files import load_ranked, with_prompt_ids

    bundle = bundles[("llama", "oracle")]
    dec = Decoder(llama, bundle, method="chain", gamma=3, size=64, lang="de")
    prompt = random_prompts(llama, 1, seed=3, max_len=30)[0]
    ref = greedy_generate(llama, prompt, 16)
    assert dec.generate(prompt, 16, stop=[]).tokens == ref
    src = dec.source
    head = src.head()
    ranked = load_ranked(bundle / "vocab" / "de.safetensors").ranked_ids
    want, added = with_prompt_ids(ranked, 64, prompt)
    assert added > 0 and head.ids.tolist() == want.tolist() and head.size == len(want) <= 64
    assert set(prompt) <= set(head.ids.tolist())
    h = torch.randn(llama.model.config.hidden_size, dtype=head.weight.dtype)
    full = src.banks["de"].head("de", None).logits(h)
    assert torch.allclose(head.logits(h), full[head.ids], atol=1e-3)
    # without a prompt: the block
    assert src.banks["de"].head("de", 64).ids.tolist() == ranked[:64].tolist()


def test_adaspec_copies_running_loops_with_prompt_lookup(llama, bundles, monkeypatch):
    """``lookup_runs``: a step whose last three verified tokens occurred earlier proposes prompt
    lookup's loop-aware chain (origin ``pld``, 10 deep, 20 after a run kept whole) and the drafter
    does not run; every other step is the drafter's. Lossless, the runs are kept (the tiny target's
    greedy text loops), and without the option no step is a run."""
    from decoder.core import Decoder
    from decoder.drafts.tables import prompt_lookup
    from decoder.drafts.trained import DrafterSource
    from polyspec.lookup import earlier_occurrence

    seen, drafted_at = [], []
    propose, draft_chain = DrafterSource.propose, DrafterSource.draft_chain

    def spy_propose(self, ctx):
        prop = propose(self, ctx)
        seen.append((ctx.tokens[: ctx.pend + 1], ctx.max_depth, prop))
        return prop

    def spy_draft(self, ctx, gamma, threshold=None):
        drafted_at.append(ctx.pend)
        return draft_chain(self, ctx, gamma, threshold)

    monkeypatch.setattr(DrafterSource, "propose", spy_propose)
    monkeypatch.setattr(DrafterSource, "draft_chain", spy_draft)
    prompts = random_prompts(llama, 12, seed=11)
    refs = [greedy_generate(llama, p, 48) for p in prompts]
    bundle = bundles[("llama", "noisy")]
    for runs_on in (True, False):
        seen.clear(), drafted_at.clear()
        dec = Decoder(llama, bundle, method="adaspec", gamma=3, size="full", lookup_runs=runs_on)
        run_kept = drafter_kept = 0
        for prompt, ref in zip(prompts, refs):
            out = dec.generate(prompt, 48, stop=[])
            assert out.tokens == ref
            run_kept += sum(s.accepted for s in out.steps if s.source == "pld")
            drafter_kept += sum(s.accepted for s in out.steps if s.source == "adaspec")
        runs = [(prefix, depth, prop) for prefix, depth, prop in seen if prop.origin[:1] == ["pld"]]
        assert drafter_kept > 0
        if not runs_on:
            assert not runs and run_kept == 0 and len(drafted_at) == len(seen)
            continue
        assert run_kept > 20 and len(runs) > 10, (run_kept, len(runs))
        for prefix, depth, prop in seen:
            looped = depth >= 1 and earlier_occurrence(prefix, 3, 3) is not None
            assert (prop in [r[2] for r in runs]) == looped
        for prefix, depth, prop in runs:
            assert prop.is_chain and prop.tokens == prompt_lookup(
                prefix, len(prop.tokens), extend=True
            )
            assert len(prop.tokens) in (min(10, depth), min(20, depth))
        assert max(len(r[2].tokens) for r in runs) == 20  # a run kept whole doubled the next one
        assert len(drafted_at) == len(seen) - len(runs)  # the drafter ran on every other step only


@pytest.mark.slow
@pytest.mark.parametrize(
    "key",
    [
        ("gemma3", "eagle"),
        ("llama", "small-lm"),
        ("llama", "noisy"),
        ("gemma3", "eagle3"),
        ("gemma3", "eagle3-2layers"),
    ],
)
def test_weak_drafters_are_lossless_too(key, llama, gemma, bundles):
    """Random EAGLE-1 / EAGLE-3 (one layer and two) / small-LM drafters (mostly rejected) and a
    noisy one over a reduced vocabulary."""
    from decoder.core import Decoder
    from decoder.methods import METHODS

    target = llama if key[0] == "llama" else gemma
    # the drafter-free sources decode the same way whatever the bundle: run once per family, with
    # its first key
    first = key in (("gemma3", "eagle"), ("llama", "small-lm"))
    decoders = [
        Decoder(target, bundles[key], method=m, **o)
        for m, o in SHAPES
        if first or METHODS[m].needs_bundle or m == "hybrid"
    ]
    # 25 until 2026-11-28: every step rejects, 12 × 32 steps suffice
    prompts = random_prompts(target, 12, seed=11)
    refs = [greedy_generate(target, p, 32) for p in prompts]
    for dec in decoders:
        for prompt, ref in zip(prompts, refs):
            assert dec.generate(prompt, 32, stop=[]).tokens == ref, dec.method
    # the training-free sources draft and are accepted whatever the drafter (their lossless check
    # means something)
    for dec in decoders:
        if dec.method in ("pld", "ngram-tree", "spectra", "hybrid"):
            check_lossless(dec, prompts[:8], refs[:8], 32)


def test_stop_strings_and_eos_end_every_method_at_the_same_token(llama, bundles):
    from decoder.core import Decoder

    decs = [Decoder(llama, method="ar")] + [
        Decoder(llama, bundles[("llama", "oracle")], method=m, **o) for m, o in SHAPES
    ]
    checked = 0
    for prompt in random_prompts(llama, 10, seed=3):
        full = decs[0].generate(prompt, 40, stop=[])
        text = llama.tokenizer.decode(full.tokens, skip_special_tokens=True)
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        if len(stop.strip()) < 2:
            continue
        checked += 1
        outs = [d.generate(prompt, 40, stop=[stop]) for d in decs]
        assert all(o.tokens == outs[0].tokens and o.text == outs[0].text for o in outs)
        assert (
            outs[0].finish_reason == "stop"
            and stop not in outs[0].text
            and len(outs[0].tokens) < 40
        )
    assert checked >= 6, f"only {checked} of 10 prompts had a usable stop string"
    # EOS: a target whose greedy output hits EOS stops there, for every method alike
    eos = llama.tokenizer.eos_token_id
    decs_eos = [Decoder(llama, method="ar")] + [
        Decoder(llama, bundles[("llama", "oracle")], method="chain")
    ]
    prompt = random_prompts(llama, 1, seed=5)[0]
    first = decs_eos[0].generate(prompt, 12, stop=[]).tokens
    with torch.no_grad():
        head = llama.model.get_output_embeddings().weight
        saved = head[eos].clone()
        hidden = llama.model.get_decoder()(torch.tensor([prompt + first[:5]])).last_hidden_state[
            0, -1
        ]
        head[eos] = hidden / hidden.norm() * 100  # make EOS the argmax after those 6 tokens
        try:
            outs = [d.generate(prompt, 12, stop=[]) for d in decs_eos]
        finally:
            head[eos] = saved
    assert (
        outs[0].tokens == outs[1].tokens and outs[0].finish_reason == outs[1].finish_reason == "eos"
    )
    assert outs[0].tokens[-1] == eos


# ----------------------------------------------------------------------------------------- sampling


@pytest.fixture(scope="module")
def sampling_setup(llama, bundles):
    from decoder.core import Decoder

    prompt = random_prompts(llama, 1, seed=21, max_len=8)[0]
    temperature = 1.0
    exact = exact_pair_distribution(llama, prompt, temperature)
    assert abs(sum(exact.values()) - 1) < 1e-3
    # a drafter close to the target but often wrong (most first drafts rejected), drafting from 256
    # of 768 ids (q = 0 elsewhere), γ = 2: acceptance, rejection and the residual all matter
    dec = Decoder(llama, bundles[("llama", "noisy")], method="chain", gamma=2, size=256)
    return prompt, temperature, exact, dec


def test_speculative_sampling_matches_the_target_distribution(sampling_setup):
    prompt, temperature, exact, dec = sampling_setup
    pairs, rejected = draw_pairs(dec, prompt, temperature, 2000)
    assert rejected > 0.1  # the rejection branch (residual distribution) is really exercised
    assert chi2_pvalue(pairs, exact) > 1e-3


def test_a_broken_acceptance_rule_is_caught(sampling_setup, monkeypatch):
    """The classic bug — resampling from p instead of norm(max(0, p − q)) after a rejection — is
    visible."""
    import decoder.core
    from decoder.loop.verify import sample

    def broken(drafts, q, p, gen):
        for i, d in enumerate(drafts):
            if torch.rand((), generator=gen).item() * float(q[i][d]) < float(p[i, d]):
                continue
            return i, sample(p[i], gen)
        return len(drafts), sample(p[len(drafts)], gen)

    monkeypatch.setattr(decoder.core, "accept_sampled", broken)
    prompt, temperature, exact, dec = sampling_setup
    pairs, _ = draw_pairs(dec, prompt, temperature, 2000)
    assert chi2_pvalue(pairs, exact) < 1e-6


def test_top_p_warp_keeps_the_nucleus():
    from decoder.loop.verify import warp

    p = warp(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), 1.0, top_p=0.7)
    assert torch.allclose(p, torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]))


# ----------------------------------------------------------------------------------- ADASPEC Alg. 2


def test_selector_follows_the_language_of_the_recent_tokens(llama, bundles):
    """Alg. 2 on real text: Vietnamese tokens pick vi, German tokens pick de; z favours the small
    size."""
    from decoder.drafts.adaptive import LanguageSelector
    from export.bundle import load_bundle
    from polyspec.languages import get_language
    from vocab.masks import load_masks

    b = load_bundle(bundles[("llama", "noisy")])  # sizes 64 and 256 of 768
    mask, langs, sizes = load_masks(b.masks_file())
    sel = LanguageSelector(mask, langs, sizes, window=10, step=5, offset=2.0)
    for lang in ("vi", "de"):
        ids = llama.tokenizer(get_language(lang).seeds[1].response, add_special_tokens=False)[
            "input_ids"
        ]
        assert sel.choose(ids[:10])[0] == lang
    # a huge offset always picks the smallest size; fixed language restricts the choice
    assert LanguageSelector(mask, langs, sizes, offset=1e6).choose(ids[:10])[1] == min(sizes)
    assert LanguageSelector(mask, langs, sizes, fixed_lang="vi").choose(ids[:10])[0] == "vi"
    assert [sel.due(k) for k in (2, 2, 1, 4, 3)] == [False, False, True, False, True]


def test_adaspec_trace_switches_language_when_the_output_does(llama, bundles, monkeypatch):
    """A target that writes Vietnamese and then German (forced through its head) makes adaspec
    switch drafter and vocabulary, and the output stays identical to AR."""
    from decoder.core import Decoder
    from polyspec.languages import get_language

    tok = llama.tokenizer
    script = (
        tok(get_language("vi").seeds[1].response, add_special_tokens=False)["input_ids"][:20]
        + tok(get_language("de").seeds[1].response, add_special_tokens=False)["input_ids"][:25]
    )
    prompt = tok(get_language("vi").seeds[0].instruction, add_special_tokens=False)["input_ids"]
    runner_forward = None

    def scripted(self, ids, *a, **k):  # the target's greedy choice at position i is script[i]
        h, logits = runner_forward(self, ids, *a, **k)
        # generated index each logits row predicts
        start = self.length - logits.shape[0] + 1 - len(prompt)
        for row in range(logits.shape[0]):
            i = start + row
            if 0 <= i < len(script):
                logits[row] = -1e4
                logits[row, script[i]] = 1e4
        return h, logits

    import decoder.loop.runner

    runner_forward = decoder.loop.runner.TargetRunner.forward
    monkeypatch.setattr(decoder.loop.runner.TargetRunner, "forward", scripted)
    ar = Decoder(llama, method="ar").generate(prompt, len(script), stop=[])
    ada = Decoder(llama, bundles[("llama", "noisy")], method="adaspec").generate(
        prompt, len(script), stop=[]
    )
    assert ar.tokens == script and ada.tokens == script
    langs = [s.lang for s in ada.steps]
    assert langs[0] == "vi" and langs[-1] == "de", langs


# ------------------------------------------------------------------------------------------- errors


def test_bad_options_fail_in_one_line(llama, bundles):
    from decoder.core import Decoder

    b = bundles[("llama", "oracle")]
    for kwargs, msg in [
        (dict(method="beam"), "unknown method"),
        (dict(lang="xx"), "not in the bundle"),
        (dict(size=123), "not one of the bundle's sizes"),
        (dict(gamma=0), "≥ 1"),
    ]:
        with pytest.raises(PolyspecError, match=msg):
            Decoder(llama, b, **kwargs)
    with pytest.raises(PolyspecError, match="needs a bundle"):
        Decoder(llama, None, method="chain")
    with pytest.raises(PolyspecError, match="empty prompt"):
        Decoder(llama, method="ar").generate([], 4)


def decode_cli(target_dir, bundle, prompt: str, *extra: str):
    """``python -m decoder run --target … --bundle … --prompt …``, then ``extra``."""
    args = ["--target", str(target_dir), "--bundle", str(bundle), "--prompt", prompt, *extra]
    return run_cli("-m", "decoder", "run", *args)


def test_cli_prints_text_and_tau(tiny_llama_dir, bundles):
    oracle = bundles[("llama", "oracle")]
    r = decode_cli(
        tiny_llama_dir, oracle, "Xin chào", "--max-new-tokens", "16", "--trace", "--device", "cpu"
    )
    assert r.returncode == 0, r.stderr
    assert "τ = " in r.stderr and "step   0" in r.stderr and "lang vi" in r.stderr
    bad = decode_cli(tiny_llama_dir, "/nonexistent", "x")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1
