"""Draft sources: everything that proposes tokens for the target to verify, behind one small interface.

    src = build_source("pld", target, bundle=None, gamma=10)
    src.begin(ctx)                 # a new request (prompt in ctx.tokens); tables that learn online persist
    prop = src.propose(ctx)        # → Proposal: a tree (a chain is a tree whose parents are -1, 0, 1, …)
    …one target forward verifies it (decoder.core)…
    src.update(ctx, verified)      # what the target kept, and its own predictions from that same forward

This module gathers the pieces; each lives in a module named for what it does:
- ``decoder.draft_types``: ``Proposal``, ``DecodeState``, ``Verified`` and the ``DraftSource`` interface;
- ``decoder.ngram_sources``: ``PromptLookup`` (``pld``, prompt lookup decoding), ``TokenRecycling``
  (``ngram-tree``, Token Recycling / UNISPEC), ``SpectraSource`` (``spectra``, SPECTRA);
- ``decoder.drafter_source``: ``DrafterSource`` (``chain``, ``tree``, ``adaspec``: the bundle's drafters, EAGLE-2
  trees, ADASPEC Alg. 2) and ``SpideSource`` (``spide``, SPIDE);
- ``decoder.spide_parallel``: ``SpideParallelSource`` (``spide-parallel``, SPIDE's parallel draft verification);
- ``decoder.hybrid``: ``HybridSource`` (``hybrid``) and ``merge``;
- ``decoder.methods``: the registry of method names, whose entries build these (``build_source`` below).
"""

from __future__ import annotations

from decoder.core import UNCALIBRATED_TREE_NODES
from decoder.draft_types import DecodeState, DraftSource, Proposal, Verified
from decoder.drafter_source import DrafterSource, SpideSource
from decoder.hybrid import HybridSource, _Arm, merge
from decoder.methods import DecodeOptions, get_method
from decoder.ngram_sources import PromptLookup, SpectraSource, TokenRecycling
from decoder.spide_parallel import SpideParallelSource

__all__ = ["DecodeState", "DraftSource", "DrafterSource", "HybridSource", "PromptLookup", "Proposal", "SpectraSource",
           "SpideParallelSource", "SpideSource", "TokenRecycling", "Verified", "_Arm", "build_source", "merge"]


def build_source(method: str, target, bundle=None, **options) -> DraftSource | None:
    """method → its draft source (None for ``ar``), from the registry (``decoder.methods``). ``options``: the
    fields of ``decoder.methods.DecodeOptions`` (γ, tree shape, ``spectra`` tables to share, ``lookup_runs``, …),
    taken as given: no calibration is read, and the node budget defaults to the CPU's uncalibrated one on every
    device (``Decoder`` resolves γ, the node budget and SPECTRA's tables itself)."""
    o = DecodeOptions(**{"tree_nodes": UNCALIBRATED_TREE_NODES["cpu"], **options})
    return get_method(method, kind="decoder").build_source(target, bundle, o)
