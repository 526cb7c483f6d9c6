"""decoder/methods.py: the one registry of decoding methods — every entry builds and runs losslessly
on a tiny target, and the CLIs offer exactly the registry's names."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from conftest import DEFAULT_BENCH_METHODS, REPO, make_tiny_bundle
from polyspec.errors import PolyspecError
from polyspec.targets import load_target


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    return load_target(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, llama):
    """A small-LM bundle (hf-assisted runs with it) and an EAGLE-3 one (what ``eagle3`` runs)."""
    from export.bundle import load_bundle

    root = tmp_path_factory.mktemp("methods")
    return {
        kind: load_bundle(make_tiny_bundle(root / kind, llama, drafter=kind))
        for kind in ("small-lm", "eagle3")
    }


def build_source(method: str, target, bundle=None, **options):
    """method → its draft source (None for ``ar``), from the registry; ``options``: fields of
    ``decoder.options.DecodeOptions``, taken as given: no calibration is read, and the node budget
    defaults to the CPU's uncalibrated one on every device (``Decoder`` resolves γ, the node budget
    and SPECTRA's tables itself)."""
    from decoder.core import UNCALIBRATED_TREE_NODES
    from decoder.methods import get_method
    from decoder.options import DecodeOptions

    o = DecodeOptions(**{"tree_nodes": UNCALIBRATED_TREE_NODES["cpu"], **options})
    return get_method(method, kind="decoder").build_source(target, bundle, o)


def test_every_decoder_method_builds_its_source_and_declares_what_the_loop_needs(llama, bundles):
    from decoder.core import Decoder
    from decoder.drafts.types import DraftSource
    from decoder.methods import DECODER_METHODS, METHODS

    for name in DECODER_METHODS:
        m = METHODS[name]
        bundle = bundles["eagle3"] if m.needs_bundle else None
        src = build_source(name, llama, bundle)
        assert (src is None) == (name == "ar"), name
        if src is None:
            continue
        assert isinstance(src, DraftSource), name
        assert src.needs_feats == m.needs_bundle or name == "hybrid", name
        if m.needs_bundle:  # the bundle's EAGLE-3 drafters read three target layers
            assert src.aux_layers and len(src.aux_layers) == 3, name
            assert Decoder(llama, bundle, method=name).runner.aux_layers == src.aux_layers, name
        else:
            assert src.aux_layers is None and Decoder(llama, method=name).source is not None, name
    assert build_source("tree", llama, bundles["eagle3"]).tree_capable
    assert not build_source("chain", llama, bundles["eagle3"]).tree_capable
    assert build_source("adaspec", llama, bundles["eagle3"], shape="tree").tree_capable
    for name in ("chain", "tree", "adaspec", "spide"):
        with pytest.raises(PolyspecError, match="needs a bundle"):
            Decoder(llama, method=name)
    with pytest.raises(PolyspecError, match="unknown method 'eagle-full'; choose one of ar, chain"):
        Decoder(llama, method="eagle-full")  # a bench preset, not a decoder method


def test_every_registry_entry_runs_in_the_bench_and_is_lossless(tmp_path, llama, bundles):
    """Every name of the registry, decoder methods, presets and transformers' loops alike, builds on
    the tiny target (a small-LM bundle; the EAGLE-3 one as the engine bundle) and answers a prompt
    with ar's tokens."""
    from decoder.bench.run import build_methods
    from decoder.methods import METHODS
    from polyspec.prompts import encode, render

    small = bundles["small-lm"]
    failed, skipped, notes = [], {}, []
    runs = build_methods(
        list(METHODS),
        llama,
        small,
        None,
        notes.append,
        engine_bundle=bundles["eagle3"],
        failed=failed,
        skipped=skipped,
    )
    assert not failed and not skipped, (failed, skipped)
    assert list(runs) == list(METHODS)
    fmt = llama.spec.prompt_format
    ids = encode(
        fmt,
        llama.tokenizer,
        render(fmt, llama.tokenizer, [{"role": "user", "content": "Xin chào, bạn"}]),
    )
    ref = runs["ar"](ids, 12).tokens
    for name, run in runs.items():
        assert run(ids, 12).tokens == ref, name
    # hf-assisted wrote nothing beside the bundle
    assert not (small.root.parent / "hf-assistant").exists()


def test_cli_choices_are_the_registry_names():
    from decoder.__main__ import build_parser
    from decoder.methods import DECODER_METHODS, METHODS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    method = next(a for a in sub.choices["run"]._actions if a.dest == "method")
    assert tuple(method.choices) == DECODER_METHODS
    assert set(DECODER_METHODS) == {m.name for m in METHODS.values() if m.kind == "decoder"}
    assert set(DECODER_METHODS) >= {
        "ar",
        "chain",
        "tree",
        "adaspec",
        "spide",
        "pld",
        "ngram-tree",
        "spectra",
        "hybrid",
    }
    for m in METHODS.values():  # presets run a decoder method; transformers' loops run none
        assert (m.runs in DECODER_METHODS) if m.kind == "preset" else m.runs is None, m.name


def test_method_lists_are_checked_against_the_registry():
    from decoder.methods import DEFAULT_BENCH, get_method, parse_methods

    assert parse_methods("ar, pld,ar") == ["ar", "pld"]
    with pytest.raises(PolyspecError, match="unknown method\\(s\\) 'adaspek', 'nope'"):
        parse_methods("ar,adaspek,pld,nope")
    assert get_method("pld").title == "PLD"
    assert set(DEFAULT_BENCH) == set(DEFAULT_BENCH_METHODS)


def test_the_registry_and_the_bench_cli_load_no_torch():
    """The bench checks its questions file and method names before any model: importing it must not
    load torch."""
    code = (
        "import sys, decoder.bench.__main__, decoder.methods; "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


def test_the_hybrid_keeps_the_plain_forward_as_an_arm_unless_the_node_budget_was_measured(
    llama, tmp_path
):
    """decoder.drafts.hybrid: the calibrated tree budget is what makes SPECTRA's tree about as cheap
    as a forward; without an entry for this device and dtype (or with nodes chosen by hand) the
    plain forward stays a no-match arm."""
    from decoder.calibrate.file import device_key, save
    from decoder.core import Decoder
    from export.bundle import load_bundle

    root = make_tiny_bundle(tmp_path / "b", llama, drafter="small-lm")
    dtype = llama.model.get_output_embeddings().weight.dtype
    uncalibrated = Decoder(llama, load_bundle(root), method="hybrid")
    assert uncalibrated.source.arm_names("no-match") == ("plain", "spectra", "drafter+spectra")
    save(root, device_key(llama.device, dtype), {"g_star": 2, "tree_budget": 9})
    calibrated = Decoder(llama, load_bundle(root), method="hybrid")
    # budget − 1
    assert (
        calibrated.source.arm_names("no-match") == ("spectra", "drafter+spectra")
        and calibrated.nodes == 8
    )
    by_hand = Decoder(llama, load_bundle(root), method="hybrid", tree_nodes=6)
    assert by_hand.source.arm_names("no-match")[0] == "plain"


def test_eagle3_reads_the_drafters_whole_head_as_engines_do(llama, bundles):
    """``eagle3`` fixes the vocabulary size at the engines bundle's largest (the drafter's whole
    head: vLLM, SGLang and llama.cpp read every row); ``eagle3-adaptive`` leaves ADASPEC's size
    choice (Alg. 2) to the decoder."""
    from decoder.core import Decoder
    from decoder.methods import METHODS, BenchInputs

    eng = bundles["eagle3"]
    b = BenchInputs(llama, bundles["small-lm"], eng)
    whole, adaptive = (
        METHODS["eagle3"].bench_options(b),
        METHODS["eagle3-adaptive"].bench_options(b),
    )
    assert (
        len(eng.vocab_sizes) > 1
        and whole["size"] == max(eng.vocab_sizes)
        and "size" not in adaptive
    )
    assert {k: v for k, v in whole.items() if k != "size"} == adaptive
    sources = {k: Decoder(llama, **o).source for k, o in (("whole", whole), ("adaptive", adaptive))}
    assert (
        sources["whole"].size_opt == max(eng.vocab_sizes) and sources["adaptive"].size_opt == "auto"
    )
