"""The real default target (Gemma-3-270m from its PyPI GGUF), offline. Marked `integration`: slower (the GGUF
conversion takes about a minute on 2 cores); part of `make test-all` and CI (`make test` runs test_smoke.py)."""

import dataclasses
import json
import time

import pytest

from conftest import run_cli
from polyspec.languages import get_language
from polyspec.prompts import encode, render
from polyspec.targets import greedy_generate, load_from_gguf, load_target, locate_gguf, resolve_target

pytestmark = pytest.mark.integration


def test_facts(gemma):
    assert gemma.vocab_size == 262144
    assert gemma.hidden_size == 640
    assert gemma.num_layers == 18
    assert gemma.spec.prompt_format.kind == "completion"
    assert (gemma.path / "model.safetensors").is_file()


def test_cached_safetensors_generate_the_same_tokens_as_the_gguf(gemma):
    gguf_model, gguf_tok = load_from_gguf(locate_gguf(resolve_target("gemma3-270m")))
    gguf_model.eval()
    # the dataclass fields only: a cached property in __dict__ (vocab_sha256, once a test pinned the target) is no field
    gguf = dataclasses.replace(gemma, model=gguf_model, tokenizer=gguf_tok)
    fmt = gemma.spec.prompt_format
    for code in ("vi", "de", "ja", "zh", "en"):
        lang = get_language(code)
        msgs = [{"role": "system", "content": lang.system_prompt}, {"role": "user", "content": lang.seeds[1].instruction}]
        text = render(fmt, gemma.tokenizer, msgs)
        ids = encode(fmt, gemma.tokenizer, text)
        assert ids == encode(fmt, gguf_tok, text), f"{code}: tokenizers disagree"
        cached = greedy_generate(gemma, ids, 24)
        direct = greedy_generate(gguf, ids, 24)
        assert cached == direct, f"{code}: cached model diverges from the GGUF"
        assert len(set(cached)) > 3


def test_cli_info_from_cache(gemma):
    t0 = time.time()
    proc = run_cli("-m", "polyspec.targets", "info", "gemma3-270m", "--json")
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)
    assert (facts["vocab_size"], facts["hidden_size"], facts["layers"]) == (262144, 640, 18)
    assert facts["tokenizer_sha256"] == gemma.tokenizer_sha256
    print(f"info from cache: load {facts['load_seconds']} s, whole command {time.time() - t0:.1f} s")


def test_speculative_decoding_is_token_identical_on_the_real_target(gemma, tmp_path):
    """Greedy chain, tree and adaspec on Gemma-3-270m (EAGLE-1 and EAGLE-3 drafters, random weights: the
    test is about losslessness, not speed) equal our AR loop and transformers' generate, token for token;
    random drafters are rejected at almost every step, so cache rollback and tree gathering run ~24 times
    per answer (40 until 2026-11-28; test_smoke.py runs every method with a drafter the target accepts)."""
    from conftest import make_tiny_bundle
    from decoder.core import Decoder

    fmt = gemma.spec.prompt_format
    prompts = []
    for code in ("vi", "de", "ja"):
        lang = get_language(code)
        msgs = [{"role": "system", "content": lang.system_prompt}, {"role": "user", "content": lang.seeds[2].instruction}]
        prompts.append(encode(fmt, gemma.tokenizer, render(fmt, gemma.tokenizer, msgs)))
    refs = [greedy_generate(gemma, ids, 24) for ids in prompts]
    ar = Decoder(gemma, method="ar")
    assert [ar.generate(ids, 24, stop=[]).tokens for ids in prompts] == refs
    runs = {"eagle": [("chain", {}), ("tree", {}), ("adaspec", {"shape": "tree"})], "eagle3": [("adaspec", {})]}
    for kind, methods in runs.items():
        bundle = make_tiny_bundle(tmp_path / kind, gemma, langs=("vi", "de", "ja"), drafter=kind, sizes=(1024, 8192))
        for method, opts in methods:
            dec = Decoder(gemma, bundle, method=method, **opts)
            for ids, ref in zip(prompts, refs):
                assert dec.generate(ids, 24, stop=[]).tokens == ref, (kind, method, opts)


def test_training_free_and_hybrid_sources_are_lossless_in_fp32_and_draft(gemma, tmp_path):
    """pld, ngram-tree, spectra and hybrid (random EAGLE-1 drafter + PLD + SPECTRA) on Gemma-3-270m in fp32 (the
    unit tests' POLYSPEC_DTYPE pins it): token-identical to transformers' greedy decoding, and drafts were kept
    (the base model's greedy answers repeat themselves, which every n-gram source can predict)."""
    import torch

    from conftest import make_tiny_bundle
    from decoder.core import Decoder

    assert gemma.dtype == torch.float32
    fmt = gemma.spec.prompt_format
    prompts = [encode(fmt, gemma.tokenizer, render(fmt, gemma.tokenizer, [{"role": "user", "content":
               get_language(c).seeds[4].instruction}])) for c in ("vi", "de", "ja")]
    refs = [greedy_generate(gemma, ids, 48) for ids in prompts]
    bundle = make_tiny_bundle(tmp_path / "eagle", gemma, langs=("vi", "de", "ja"), drafter="eagle", sizes=(1024, 8192))
    for method in ("pld", "ngram-tree", "spectra", "hybrid"):
        dec = Decoder(gemma, bundle if method == "hybrid" else None, method=method)
        accepted = 0
        for ids, ref in zip(prompts, refs):
            out = dec.generate(ids, 48, stop=[])
            assert out.tokens == ref, method
            accepted += sum(s.accepted for s in out.steps)
        assert accepted > 0, f"{method}: no draft was ever kept"


def test_auto_dtype_is_bf16_on_this_cpu_and_its_answers_are_measured_not_assumed(gemma):
    """dtype auto on a CPU with native bf16 resolves to bf16; AR in bf16 is the target's own greedy decoding in
    bf16, and a speculative method's agreement with it is measured and bounded (not asserted to be exact)."""
    import torch

    from decoder.core import Decoder
    from polyspec.device import cpu_native_bf16, resolve_dtype

    if not cpu_native_bf16():
        pytest.skip("this CPU has no native bf16: auto resolves to fp32 here")
    import os

    saved = os.environ.pop("POLYSPEC_DTYPE", None)
    try:
        assert resolve_dtype("auto", torch.device("cpu")) == torch.bfloat16
        bf = load_target("gemma3-270m", dtype="auto")
    finally:
        if saved is not None:
            os.environ["POLYSPEC_DTYPE"] = saved
    assert bf.dtype == torch.bfloat16
    fmt = bf.spec.prompt_format
    ids = encode(fmt, bf.tokenizer, render(fmt, bf.tokenizer, [{"role": "user", "content": get_language("de").seeds[4].instruction}]))
    ref = greedy_generate(bf, ids, 32)
    assert Decoder(bf, method="ar").generate(ids, 32, stop=[]).tokens == ref  # one token per forward: exact
    out = Decoder(bf, method="pld").generate(ids, 32, stop=[])
    same = next((i for i, (a, b) in enumerate(zip(out.tokens, ref)) if a != b), len(ref))
    kept = sum(s.accepted for s in out.steps)
    print(f"bf16 pld vs bf16 AR: first divergence at token {same} of {len(ref)}, {kept} drafts kept, τ {out.tau:.2f}")
    # bf16 verifies several tokens per forward, so a near-tie may round otherwise than in one-token AR: not exact by
    # design. But the base model repeats itself, so prompt lookup's drafts are kept, and the answers agree at least
    # for their first half (measured on the bf16 host: all 32 tokens identical, 27 drafts kept; over ten seed
    # prompts in five languages the earliest divergence was at token 14)
    assert kept > 0 and out.tau > 1.0, f"bf16 pld kept {kept} drafts (τ {out.tau:.2f})"
    assert same >= len(ref) // 2, f"bf16 pld diverges from bf16 AR at token {same} of {len(ref)}"
