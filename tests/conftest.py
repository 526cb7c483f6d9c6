"""Shared fixtures: tiny random-weight targets (Gemma3 and Llama families, in-process tokenizer) and
an isolated polyspec cache. Nothing here downloads anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from polyspec.testing import build_tiny_target

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the hub
os.environ.setdefault("WANDB_MODE", "offline")
# dtype "auto" means bf16 on CPUs with native bf16; the tests' identity checks need the exact mode
# (fp32). Tests of auto itself and of bf16 set the dtype explicitly.
os.environ.setdefault("POLYSPEC_DTYPE", "float32")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return build_tiny_target(tmp_path_factory.mktemp("targets") / "tiny-llama", family="llama")


@pytest.fixture(scope="session")
def tiny_gemma_dir(tmp_path_factory) -> Path:
    return build_tiny_target(tmp_path_factory.mktemp("targets") / "tiny-gemma3", family="gemma3")


@pytest.fixture(params=["llama", "gemma3"])
def tiny_target_dir(request, tiny_llama_dir, tiny_gemma_dir) -> Path:
    return {"llama": tiny_llama_dir, "gemma3": tiny_gemma_dir}[request.param]


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch) -> Path:
    """A private POLYSPEC_CACHE for tests that create or break caches."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("POLYSPEC_CACHE", str(cache))
    return cache


WORDFREQ = [{"name": "synth"}, {"name": "wordfreq", "weight": 0.5}]
# the gpu-smoke profile's local vocabulary source: the device machine has no wordfreq
# (scripts/gpu/gpu-wheels.sh)
SEED_TEXT = [
    {"name": "synth"},
    {"name": "files", "weight": 0.5, "path": str(REPO / "configs/vocab/seed-text/{lang}.jsonl")},
]


# the stage packages, polyspec first (tests/test_cli.py, test_imports.py and test_packaging.py)
PACKAGES = (
    "polyspec",
    "corpus",
    "synth",
    "vocab",
    "train",
    "export",
    "decoder",
    "pipelines",
    "engines",
)


# synth for a tiny random target: short answers, filters off (prepare_run, tests/pipelines' profile)
TINY_SYNTH = (
    "instruction.max_new_tokens=12",
    "response.max_new_tokens=24",
    "filters.keep_unfinished_instructions=true",
    "filters.min_response_chars=1",
    "filters.min_instruction_chars=1",
    "filters.require_language=false",
)


def prepare_run(
    run_dir: Path, target_dir: Path, lang: str = "vi", sources: list[dict] | None = None
) -> Path:
    """synth (finetune data), distill --continuation (pretrain text) and vocab (``sources``, default
    synth + wordfreq) for a tiny target."""
    from polyspec.config import apply_overrides, validate
    from synth.config import DistillConfig, SynthConfig
    from synth.distill import run_distill
    from synth.selfsynth import run_selfsynth
    from vocab.build import run_vocab
    from vocab.config import VocabConfig

    if (run_dir / "vocab" / f"{lang}.safetensors").is_file():
        return run_dir
    run_selfsynth(
        validate(
            SynthConfig,
            apply_overrides(
                {},
                [
                    f"lang={lang}",
                    "n=24",
                    f"run={run_dir}",
                    f"target={target_dir}",
                    "engine.batch_size=8",
                    *TINY_SYNTH,
                ],
            ),
        ),
        log=lambda *_: None,
    )
    run_distill(
        validate(
            DistillConfig,
            {
                "lang": lang,
                "run": str(run_dir),
                "target": str(target_dir),
                "continuation": True,
                "out_name": "pretrain",
                "temperatures": [0.7, 1.0],
                "sampling": {"max_new_tokens": 24},
                "engine": {"batch_size": 16},
            },
        )
    )
    run_vocab(
        validate(
            VocabConfig,
            {
                "langs": [lang],
                "target": str(target_dir),
                "run": str(run_dir),
                "mask_sizes": [128],
                "sources": sources or WORDFREQ,
                "heldout": "seeds",
            },
        ),
        log=lambda *_: None,
    )
    return run_dir


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    """Run ``python <args>`` (or ``make`` when args[0] == 'make') and capture its output."""
    full_env = {**os.environ, **(env or {})}
    cmd = list(args) if args[0] == "make" else [sys.executable, *args]
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=600)


def make_tiny_bundle(
    out: Path,
    target,
    langs=("vi", "de"),
    drafter: str = "eagle",
    sizes=(64, 256),
    noise: float = 0.0,
    seed: int = 0,
    first_ids=(),
    fit=None,
    num_layers: int = 1,
) -> Path:
    """A bundle for a tiny target in seconds, without synth or training.

    Vocabularies rank the target's ids by their counts in the language's built-in seeds (so language
    masks tell languages apart). ``drafter``: ``eagle`` (random one-layer EAGLE drafter;
    ``eagle-hint``: one that reads prompt-lookup hints), ``small-lm`` (random tiny Llama) or
    ``oracle`` (a copy of a Llama-family target with Gaussian ``noise`` on its weights: a drafter
    that is often but not always right, to exercise partial acceptance). ``first_ids`` rank first in
    every language (a text the drafter must reach); ``fit(model, order)`` trains the drafter in
    place before it is saved (``order``: the language's ranked ids). ``num_layers``: the ``eagle3``
    drafter's decoder layers (``eagle.num_layers``).
    """
    import copy
    from collections import Counter

    import numpy as np
    import torch

    from export.bundle import write_bundle
    from polyspec.drafter_models import (
        Eagle3Drafter,
        EagleDrafter,
        build_small_lm,
        eagle_layer_config,
        save_drafter,
    )
    from polyspec.languages import get_language
    from vocab.files import RankedVocab, save_ranked

    run = out.parent / f"{out.name}-run"
    V = target.vocab_size
    for i, lang in enumerate(langs):
        info = get_language(lang)
        counts = Counter()
        for text in [
            info.system_prompt,
            *(x for s in info.seeds for x in (s.instruction, s.response)),
        ]:
            counts.update(target.tokenizer(text, add_special_tokens=False)["input_ids"])
        first = {t: r for r, t in enumerate(dict.fromkeys(first_ids))}
        order = sorted(range(V), key=lambda t: (first.get(t, len(first)), -counts.get(t, 0), t))
        save_ranked(
            run / "vocab",
            RankedVocab(
                lang,
                np.array(order),
                np.array([counts.get(t, 0) for t in order]),
                {"tokenizer_sha256": target.tokenizer_sha256},
            ),
        )
        torch.manual_seed(seed + i)
        # eagle-hint: reads prompt-lookup hints (eagle.lookup_hint)
        if drafter in ("eagle", "eagle-hint"):
            model = EagleDrafter(
                eagle_layer_config(target.model.config), lookup_hint=drafter == "eagle-hint"
            )
        elif drafter == "eagle3":
            model = Eagle3Drafter.for_target(
                target, torch.as_tensor(order[: max(sizes)]), num_layers=num_layers
            )
        elif drafter == "small-lm":
            model = build_small_lm(
                target, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64
            )
        elif drafter == "oracle":
            model = copy.deepcopy(target.model).float()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * noise * p.std())
        else:
            raise ValueError(drafter)
        if fit is not None:
            fit(model, order)
        save_drafter(run / "train" / lang / "final", model, {"target": target.pin(), "lang": lang})
    return write_bundle(out, run, list(langs), target.pin(), list(sizes)).root


# -- helpers more than one folder's tests use (tests/decoder's and tests/test_cuda.py: the decoder's
# shapes, random prompts and the χ² check of speculative sampling; tests/train's and
# tests/test_cuda.py: a tiny training config). They live here, not in a test module, because a test
# module in one folder cannot import one in another.

SHAPES = [
    ("chain", dict(gamma=1)),
    ("chain", dict(gamma=3)),
    ("chain", dict(gamma=7, size="full")),
    ("tree", dict(tree_depth=3, tree_topk=2, tree_nodes=6)),
    ("tree", dict(tree_depth=5, tree_topk=4, tree_nodes=16, size="full")),
    ("adaspec", dict(gamma=4)),
    ("adaspec", dict(gamma=2, lookup_runs=False)),
    ("adaspec", dict(shape="tree", tree_depth=4, tree_topk=3, tree_nodes=10)),
    ("spide", dict(gamma_max=6)),
    ("spide-parallel", dict(gamma_max=6)),
    ("pld", dict(gamma=5)),
    ("ngram-tree", dict(tree_nodes=10, tree_depth=4, tree_topk=2)),
    ("spectra", dict(tree_nodes=10)),
    ("hybrid", dict(tree_nodes=10)),
]


# what a bench runs by default: decoder.methods.DEFAULT_BENCH as tests/decoder/test_methods.py pins
# it (tests/decoder/test_bench.py runs them all)
DEFAULT_BENCH_METHODS = (
    "ar",
    "hf-generate",
    "adaspec",
    "eagle-full",
    "fr-spec",
    "spide",
    "pld",
    "ngram-tree",
    "spectra",
    "hybrid",
    "hf-pld",
    "hf-assisted",
)


def random_prompts(target, n: int, seed: int, max_len: int = 40) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, max_len, (n,), generator=g).tolist()
    return [torch.randint(4, target.vocab_size, (k,), generator=g).tolist() for k in lengths]


def exact_pair_distribution(target, prompt, temperature) -> dict[tuple[int, int], float]:
    """P(x2, x3) of the target's own sampling (x1 summed out), from its exact conditionals; a
    position after EOS is -1."""
    import torch

    from decoder.loop.verify import warp

    eos = target.tokenizer.eos_token_id

    def probs(ids):
        with torch.no_grad():
            return warp(target.model(torch.tensor([ids])).logits[0, -1].float(), temperature)

    def support(p):
        return torch.nonzero(p > 1e-6).flatten().tolist()

    out: dict[tuple[int, int], float] = {}

    def add(key, w):
        out[key] = out.get(key, 0.0) + w

    p1 = probs(prompt)
    for x1 in support(p1):
        if x1 == eos:
            add((-1, -1), float(p1[x1]))
            continue
        p2 = probs(prompt + [x1])
        for x2 in support(p2):
            w = float(p1[x1] * p2[x2])
            if x2 == eos:
                add((x2, -1), w)
                continue
            p3 = probs(prompt + [x1, x2])
            for x3 in support(p3):
                add((x2, x3), w * float(p3[x3]))
    return out


def chi2_pvalue(samples: list[tuple[int, int]], exact: dict[tuple[int, int], float]) -> float:
    from scipy.stats import chi2

    n = len(samples)
    counts: dict = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    cells = [c for c, p in exact.items() if p * n >= 5]
    other_p = 1.0 - sum(exact[c] for c in cells)
    obs = [counts.get(c, 0) for c in cells] + [n - sum(counts.get(c, 0) for c in cells)]
    exp = [exact[c] * n for c in cells] + [other_p * n]
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 0)
    return float(chi2.sf(stat, len(cells)))


def draw_pairs(dec, prompt, temperature, n) -> tuple[list[tuple[int, int]], float]:
    pairs, rejected = [], 0
    for seed in range(n):
        out = dec.generate(prompt, 3, temperature=temperature, stop=[], seed=seed)
        pairs.append(tuple((out.tokens[1:3] + [-1, -1])[:2]) if len(out.tokens) > 1 else (-1, -1))
        rejected += bool(out.steps) and out.steps[0].accepted < out.steps[0].drafted
    return pairs, rejected / n


def tiny_train_overrides(run_dir, target_dir) -> list[str]:
    """The overrides of every tiny training config: vi, a few finetune steps of a small drafter."""
    return [
        f"run={run_dir}",
        f"target={target_dir}",
        "lang=vi",
        "eagle.vocab_size=128",
        "report_to=none",
        "finetune.steps=6",
        "eval_every=3",
        "checkpoint_every=2",
        "log_every=1",
        "optim.batch_size=2",
        "data.max_length=64",
        "data.eval_max_examples=3",
        "eval_depth=3",
    ]


def tcfg(run_dir, target_dir, *extra):
    """A tiny training config (train.config.TrainConfig): a few steps of a small drafter; ``extra``:
    overrides."""
    from polyspec.config import apply_overrides, validate
    from train.config import TrainConfig

    base = [
        *tiny_train_overrides(run_dir, target_dir),
        "pretrain.steps=6",
        "small_lm.hidden_size=32",
        "small_lm.intermediate_size=64",
        "small_lm.num_heads=2",
    ]
    return validate(TrainConfig, apply_overrides({}, [*base, *extra]))


def drafter_argv(run_dir, target_dir, *extra: str) -> list[str]:
    """``train/drafter.py`` and the overrides of tests/train's 8-step kill-and-resume finetune."""
    return [
        str(REPO / "train" / "drafter.py"),
        f"run={run_dir}",
        f"target={target_dir}",
        "lang=vi",
        "stage=finetune",
        "eagle.vocab_size=128",
        "report_to=none",
        "finetune.steps=8",
        "eval_every=4",
        "checkpoint_every=2",
        "log_every=1",
        "optim.batch_size=2",
        "data.max_length=64",
        "data.eval_max_examples=2",
        "eval_depth=2",
        *extra,
    ]


# -- tests/export's runs: drafters trained for a few steps, vocabularies of two languages


def export_train(run_dir, target_dir, *overrides: str) -> list[dict]:
    """Train a drafter with tests/export's tiny settings (128 ids, 48 tokens, every 2 steps)."""
    from polyspec.config import apply_overrides, validate
    from train.config import TrainConfig
    from train.drafter import run

    base = [
        f"run={run_dir}",
        f"target={target_dir}",
        "eagle.vocab_size=128",
        "report_to=none",
        "eval_every=2",
        "checkpoint_every=2",
        "optim.batch_size=2",
        "data.max_length=48",
        "data.eval_max_examples=1",
        "eval_depth=2",
    ]
    return run(validate(TrainConfig, apply_overrides({}, [*base, *overrides])))


def export_vocab(run_dir, target_dir) -> None:
    """vi and de vocabularies from synth in one call (the masks need every ranked list)."""
    from polyspec.config import validate
    from vocab.build import run_vocab
    from vocab.config import VocabConfig

    run_vocab(
        validate(
            VocabConfig,
            {
                "langs": ["vi", "de"],
                "target": str(target_dir),
                "run": str(run_dir),
                "mask_sizes": [64, 128],
                "sources": [{"name": "synth"}],
                "heldout": "seeds",
            },
        ),
        log=lambda *_: None,
    )
