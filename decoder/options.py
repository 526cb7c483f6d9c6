"""The decoder's options: one dataclass that ``decoder.core.Decoder`` fills in and hands to a
method's draft-source factory (``decoder.methods``) and that the draft sources read. Its own module
(stdlib only) so that the sources can name it without importing the registry."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class DecodeOptions:
    """The decoder's options, each declared once: ``Decoder(target, bundle, method,
    options=DecodeOptions(…))`` or the same fields as keywords
    (``Decoder(target, bundle, method, gamma=3)``). ``Decoder`` fills in ``gamma``, ``tree_nodes``,
    ``tree_measured`` and ``spectra`` (calibration, device, SPECTRA's tables) and hands the whole
    object to the method's draft-source factory (``Method.build_source``)."""

    # chain draft length; None: the bundle's calibrated g* (methods that read it), else 4
    gamma: int | None = None
    tree_depth: int = 4  # EAGLE-2 tree: levels
    # EAGLE-2 tree: nodes expanded per level (Token Recycling: children of a deeper node)
    tree_topk: int = 4
    # node budget; None: calibrated budget − 1, else core.UNCALIBRATED_TREE_NODES
    tree_nodes: int | None = None
    # set by the decoder: tree_nodes is this device's calibrated flat-verify budget
    tree_measured: bool = False
    shape: str = "chain"  # adaspec: chain or tree
    # drafter language: auto (from the prompt, ADASPEC Alg. 2) or a bundle language (fixed)
    lang: str = "auto"
    size: str | int = "auto"  # vocabulary size: auto, one of the bundle's sizes (fixed) or full
    # head language other than the drafter's (FR-Spec: one vocabulary for all)
    vocab_lang: str | None = None
    window: int | None = None  # ADASPEC Alg. 2 w; None: the bundle's
    step: int | None = None  # ADASPEC Alg. 2 u; None: the bundle's
    offset: float | None = None  # ADASPEC Alg. 2 z (favours smaller heads); None: the bundle's
    gamma_max: int = 8  # the longest chain SPIDE and the hybrid's drafter draft
    spide_threshold: float = 0.35  # SPIDE: stop drafting below this predicted acceptance
    ngram_k: int = 8  # Token Recycling: next-token candidates kept per token
    ngram_first_width: int = 8  # Token Recycling: the tree's first-level width
    ngram_threshold: float = 0.02  # Token Recycling: least cumulative confidence of a kept node
    # a decoder.drafts.spectra.Spectra to share; None: the decoder builds one (spectra, hybrid)
    spectra: Any = None
    # SPECTRA-RETRIEVAL corpus (synth JSONL or text); None: the run's
    spectra_corpus: str | Path | None = None
    # adaspec: prompt lookup's chain where a loop or a copy is running (greedy)
    lookup_runs: bool = True
