"""Ranked-vocabulary files — the vocab stage's public format, read by train, export and decoder.

``<lang>.safetensors``: ``ranked_ids`` int32 [n] (descending frequency, structural tokens first) and
``counts`` int64 [n] (``counts[i]`` is the count of ``ranked_ids[i]``). Sidecar ``<lang>.json``:
language, target, ``tokenizer_sha256``, vocab size, sources, documents, tokens, held-out text used
for coverage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load, save

from polyspec.errors import PolyspecError, first_line
from polyspec.io import atomic_write_bytes, atomic_write_json, canonical_safetensors


@dataclass
class RankedVocab:
    lang: str
    ranked_ids: np.ndarray  # int32 [n]
    counts: np.ndarray  # int64 [n]
    meta: dict[str, Any]

    def top(self, size: int) -> np.ndarray:
        if size > len(self.ranked_ids):
            raise PolyspecError(
                f"vocab size {size} is larger than the ranked list of {self.lang!r} "
                f"({len(self.ranked_ids)} ids)"
            )
        return self.ranked_ids[:size]


def with_prompt_ids(ranked_ids, size: int, prompt_ids) -> tuple[np.ndarray, int]:
    """The at most ``size`` ids a reduced head keeps for one request, and how many of them were
    added for the prompt: the top k ranked ids, then the prompt's ids not among them, k as large as
    fits (the target copies names and terms from its prompt: on the cpu-full held-out answers 42 of
    en's 55 and 61 of es's 89 tokens outside the top 16K occur in the prompt). At most ``size // 2``
    prompt ids are considered. The ranked block stays a prefix, so a decoder keeps its rows as a
    view and gathers only the added ones."""
    ranked = np.asarray(ranked_ids[:size], dtype=np.int64)
    prompt = np.unique(np.asarray(list(prompt_ids), dtype=np.int64))[: size // 2]
    if not len(prompt) or np.isin(prompt, ranked).all():
        return ranked, 0
    # k + |prompt \ ranked[:k]| ≤ size  ⇔  #(ranked[:k] not in the prompt) ≤ size − |prompt|
    outside = np.cumsum(~np.isin(ranked, prompt))
    k = int(np.searchsorted(outside, size - len(prompt), side="right"))
    missing = prompt[~np.isin(prompt, ranked[:k])]
    return np.concatenate([ranked[:k], missing]), int(len(missing))


def interleave_ranked(lists, size: int) -> np.ndarray:
    """One draft vocabulary for several languages: their ranked lists read rank by rank (each
    language's rank-r id, in the given order, then rank r + 1), an id kept where it first appears,
    cut at ``size``. Every language keeps its most frequent ids: with L languages, each one's top
    ⌊size / L⌋ ids are in."""
    lists = [np.asarray(x, dtype=np.int64) for x in lists]
    n = max((len(x) for x in lists), default=0)
    if not lists or size > len(np.unique(np.concatenate(lists))):
        raise PolyspecError(
            f"a draft vocabulary of {size} ids is larger than the union of the ranked lists"
        )
    width = min(n, size)  # no list needs to be read past rank `size`
    grid = np.full((width, len(lists)), -1, dtype=np.int64)
    for j, x in enumerate(lists):
        grid[: min(width, len(x)), j] = x[:width]
    flat = grid.reshape(-1)
    flat = flat[flat >= 0]
    _, first = np.unique(flat, return_index=True)
    return flat[np.sort(first)][:size]


def save_ranked(out_dir: str | Path, vocab: RankedVocab) -> Path:
    out_dir = Path(out_dir)
    path = out_dir / f"{vocab.lang}.safetensors"
    data = {
        "ranked_ids": vocab.ranked_ids.astype(np.int32),
        "counts": vocab.counts.astype(np.int64),
    }
    atomic_write_bytes(
        path,
        canonical_safetensors(
            save(
                data,
                metadata={"lang": vocab.lang, "tokenizer_sha256": vocab.meta["tokenizer_sha256"]},
            )
        ),
    )
    atomic_write_json(out_dir / f"{vocab.lang}.json", {"lang": vocab.lang, **vocab.meta})
    return path


def load_ranked(path: str | Path, tokenizer_sha256: str | None = None) -> RankedVocab:
    """Read a ranked vocabulary; refuse it when it was built with another tokenizer."""
    path = Path(path)
    try:
        tensors = load(path.read_bytes())
        meta = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise PolyspecError(f"vocab file missing: {e.filename}") from None
    except Exception as e:  # noqa: BLE001 - corrupted safetensors / json
        raise PolyspecError(f"cannot read vocab file {path}: {first_line(e)}") from None
    if tokenizer_sha256 is not None and meta.get("tokenizer_sha256") != tokenizer_sha256:
        raise PolyspecError(
            f"{path} was built for another tokenizer (tokenizer_sha256 "
            f"{str(meta.get('tokenizer_sha256'))[:12]}… "
            f"≠ target's {tokenizer_sha256[:12]}…); rebuild it with `make vocab` for this target"
        )
    ids, counts = tensors.get("ranked_ids"), tensors.get("counts")
    if ids is None or counts is None or ids.shape != counts.shape or ids.ndim != 1:
        raise PolyspecError(f"{path}: expected 1-D ranked_ids and counts of equal length")
    return RankedVocab(lang=meta.get("lang", path.stem), ranked_ids=ids, counts=counts, meta=meta)
