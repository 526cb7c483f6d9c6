"""The CUDA path on tiny targets (skipped without a GPU; ``pytest -m cuda`` selects exactly these,
and scripts/gpu/gpu-check.sh runs them on the device machine): every decoding method's fp32 identity
with the target's own greedy decoding, speculative sampling's distribution (Leviathan et al.
rejection sampling, χ²), feature capture while generating, one bf16 training step of each drafter
form, and export + reload of a drafter trained there."""

from __future__ import annotations

import shutil

import pytest
import torch

from conftest import (
    SEED_TEXT,
    SHAPES,
    chi2_pvalue,
    draw_pairs,
    exact_pair_distribution,
    make_tiny_bundle,
    prepare_run,
    random_prompts,
    tcfg,
)
from polyspec.targets import eagle3_layers, greedy_generate, load_target

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def cpu_llama(tiny_llama_dir):
    return load_target(str(tiny_llama_dir), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def gpu(tiny_llama_dir, tiny_gemma_dir):
    """The tiny targets on the GPU in fp32 (the exact mode identity checks need)."""
    return {
        name: load_target(str(d), device="cuda", dtype="float32")
        for name, d in (("llama", tiny_llama_dir), ("gemma3", tiny_gemma_dir))
    }


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, cpu_llama, tiny_gemma_dir):
    """Written from the CPU targets (the same files the CPU tests use), loaded on the GPU by each
    decoder."""
    root = tmp_path_factory.mktemp("cuda-bundles")
    gemma = load_target(str(tiny_gemma_dir), device="cpu", dtype="float32")
    return {
        "llama": make_tiny_bundle(
            root / "llama", cpu_llama, drafter="oracle", noise=0.05, sizes=(64, 768)
        ),
        "gemma3": make_tiny_bundle(
            root / "gemma", gemma, drafter="oracle", noise=0.05, sizes=(64, 768)
        ),
        "noisy": make_tiny_bundle(
            root / "noisy", cpu_llama, drafter="oracle", noise=0.2, sizes=(64, 256)
        ),
    }


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_every_method_is_token_identical_to_the_targets_greedy_on_cuda(family, gpu, bundles):
    from decoder.core import Decoder

    target = gpu[family]
    ar = Decoder(target, method="ar")
    decoders = [(m, o, Decoder(target, bundles[family], method=m, **o)) for m, o in SHAPES]
    accepted = {i: 0 for i in range(len(decoders))}
    # gemma's 64-token window is crossed
    for k, prompt in enumerate(random_prompts(target, 6, seed=11, max_len=90)):
        ref = greedy_generate(target, prompt, 32)
        mine = ar.generate(prompt, 32, stop=[])
        assert mine.tokens == ref[: len(mine.tokens)], k
        for i, (m, o, dec) in enumerate(decoders):
            out = dec.generate(prompt, 32, stop=[])
            assert out.tokens == mine.tokens, (m, o, k)
            assert out.steps and all(s.verify_s >= 0 for s in out.steps)
            accepted[i] += sum(s.accepted for s in out.steps)
    # drafts were kept on the GPU too
    assert all(accepted.values()), {SHAPES[i][0]: n for i, n in accepted.items()}


def test_speculative_sampling_keeps_the_targets_distribution_on_cuda(gpu, cpu_llama, bundles):
    """Samples drawn on the GPU against P(x2, x3) computed exactly from the same weights on the
    CPU."""
    from decoder.core import Decoder

    prompt = random_prompts(cpu_llama, 1, seed=21, max_len=8)[0]
    exact = exact_pair_distribution(cpu_llama, prompt, 1.0)
    dec = Decoder(gpu["llama"], bundles["noisy"], method="chain", gamma=2, size=256)
    pairs, rejected = draw_pairs(dec, prompt, 1.0, 2000)
    assert rejected > 0.1  # the residual distribution is really sampled from
    assert chi2_pvalue(pairs, exact) > 1e-3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_captured_features_equal_a_separate_forward_on_cuda(dtype, tiny_llama_dir):
    from polyspec.prompts import encode, render
    from synth.engines import Request, TransformersEngine
    from train.objectives import target_features

    t = load_target(str(tiny_llama_dir), device="cuda", dtype=dtype)
    fmt, tok, aux = t.spec.prompt_format, t.tokenizer, eagle3_layers(t.num_layers)
    prompts = [
        "Xin chào",
        "Warum fallen im Herbst die Blätter?",
        "日本の首都はどこですか？",
        "What is two plus two?",
    ]
    reqs = [
        Request(
            render(fmt, tok, [{"role": "user", "content": p}]),
            seed=i,
            temperature=(0.0, 1.0)[i % 2],
            max_new_tokens=(5, 12, 9, 12)[i],
        )
        for i, p in enumerate(prompts)
    ]
    got = TransformersEngine(t, batch_size=4).generate(reqs, capture=aux)
    worst = 0.0
    for r, q in zip(reqs, got):
        prompt = encode(fmt, tok, r.prompt)
        assert (
            q.ids[: q.prompt_tokens] == prompt
            and len(q.ids) == q.features["f"].shape[0] == q.features["aux"].shape[0]
        )
        if r.temperature == 0.0 and dtype == "float32":
            assert (
                q.ids[len(prompt) :]
                == greedy_generate(t, prompt, r.max_new_tokens)[: q.num_tokens - 1]
            )
        x = torch.tensor([q.ids], device="cuda")
        with torch.inference_mode():
            f, a = (y[0] for y in target_features(t.model, x, torch.ones_like(x), aux))
        if dtype == "float32":
            torch.testing.assert_close(q.features["f"].to(f), f, atol=1e-4, rtol=0)
            torch.testing.assert_close(q.features["aux"].to(a), a, atol=1e-4, rtol=0)
        # bf16: the batched (padded) and the single forward round differently; same values to bf16's
        # precision
        else:
            for mine, ref in ((q.features["f"], f), (q.features["aux"], a)):
                worst = max(
                    worst,
                    (
                        (mine.to(ref).float() - ref.float()).abs().mean() / ref.float().abs().mean()
                    ).item(),
                )
    assert worst < 0.02


@pytest.fixture(scope="module")
def cuda_run(tmp_path_factory, tiny_llama_dir):
    # no wordfreq there
    return prepare_run(tmp_path_factory.mktemp("run-cuda"), tiny_llama_dir, sources=SEED_TEXT)


@pytest.fixture
def fresh_accelerator():
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # a process-wide singleton: bf16 here
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.parametrize("form", ["eagle1", "eagle3", "small-lm"])
def test_one_bf16_training_step_of_each_drafter_form_on_cuda(
    form, cuda_run, tiny_llama_dir, fresh_accelerator
):
    from train.drafter import DrafterRecipe

    kind = (
        ["drafter_type=small-lm"]
        if form == "small-lm"
        else ["drafter_type=eagle", f"eagle.arch={form}"]
    )
    r = DrafterRecipe(
        tcfg(
            cuda_run,
            tiny_llama_dir,
            *kind,
            "mixed_precision=bf16",
            "eagle.ttt_steps=2",
            # no warmup: the first step's lr is not 0
            "optim.warmup_ratio=0",
        ),
        "finetune",
    )
    r.out = cuda_run / f"train-cuda-{form}"
    r.setup()
    assert r.acc.device.type == "cuda" and r.acc.mixed_precision == "bf16"
    before = {n: p.detach().clone() for n, p in r.model.named_parameters()}
    loss, metrics, tokens = r.train_step(r.batches())
    assert torch.isfinite(loss) and loss.item() > 0 and tokens > 0
    after = dict(r.model.named_parameters())
    assert all(p.is_cuda and torch.isfinite(p).all() for p in after.values())
    assert any(not torch.equal(before[n], p) for n, p in after.items()), (
        "the optimizer step moved the weights"
    )
    r.cleanup()


def test_an_eagle3_drafter_trained_on_cuda_exports_and_reloads(
    tmp_path, cuda_run, tiny_llama_dir, gpu, fresh_accelerator
):
    from decoder.core import Decoder
    from export.bundle import load_bundle, write_bundle
    from export.interop import check_speculators, write_speculators
    from train.drafter import run

    run_dir = tmp_path / "run"
    shutil.copytree(cuda_run, run_dir)
    run(
        tcfg(
            run_dir,
            tiny_llama_dir,
            "drafter_type=eagle",
            "eagle.arch=eagle3",
            "stage=finetune",
            "mixed_precision=bf16",
        )
    )
    target = gpu["llama"]
    write_bundle(tmp_path / "bundle", run_dir, ["vi"], target.pin(), [64, 128])
    bundle = load_bundle(tmp_path / "bundle", target_pin=target.pin())
    (folder,) = write_speculators(bundle, target, tmp_path / "spec", speculative_tokens=4)
    cfg = check_speculators(folder, target.vocab_size)
    assert cfg["draft_vocab_size"] == 128 and cfg[
        "eagle_aux_hidden_state_layer_ids"
    ] == eagle3_layers(target.num_layers)
    dec = Decoder(target, bundle, method="chain", gamma=3)
    for prompt in random_prompts(target, 4, seed=5, max_len=30):
        out = dec.generate(prompt, 24, stop=[])
        assert out.tokens == greedy_generate(target, prompt, 24)[: len(out.tokens)] and sum(
            s.drafted for s in out.steps
        )
