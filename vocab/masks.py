"""Language masks of ADASPEC Alg. 2 (lines 6–18) — the one implementation; export and decoder use
it.

``mask`` is bool [|L|·|S|, |V|]; row ``s·|L| + l`` marks the top-``S[s]`` ids of language ``L[l]``.
Stored bit-packed (``np.packbits`` along |V|) in safetensors with the language and size order in the
metadata; :func:`load_masks` returns the bool tensor.

Offsets (line 18) favour smaller sizes by ``z`` per step: size index s gets ``z·(|S|−1−s)``. (The
paper writes the vector with |S|+1 entries, ``[z·|S|, …, z·1, 0]``; with |S| sizes we use its last
|S| entries, so the largest size gets 0, as the text describes.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from polyspec.errors import PolyspecError, first_line
from polyspec.io import atomic_write_bytes, canonical_safetensors


def build_masks(ranked: list[np.ndarray], sizes: list[int], vocab_size: int) -> torch.Tensor:
    """Alg. 2 lines 7–16: ``M[s·|L| + l, V_l[t]] = 1`` for t < S[s]."""
    L = len(ranked)
    mask = torch.zeros((L * len(sizes), vocab_size), dtype=torch.bool)
    for l, ids in enumerate(ranked):
        for s, size in enumerate(sizes):
            if size > len(ids):
                raise PolyspecError(
                    f"vocab size {size} exceeds the ranked list of language #{l} ({len(ids)} ids)"
                )
            if size > vocab_size:
                raise PolyspecError(
                    f"vocab size {size} exceeds the target vocabulary ({vocab_size})"
                )
            mask[s * L + l, torch.as_tensor(np.asarray(ids[:size], dtype=np.int64))] = True
    return mask


def size_offsets(num_languages: int, num_sizes: int, z: float) -> torch.Tensor:
    """Alg. 2 line 18, one entry per mask row: row s·|L|+l gets z·(|S|−1−s)."""
    per_size = torch.tensor(
        [z * (num_sizes - 1 - s) for s in range(num_sizes)], dtype=torch.float32
    )
    return per_size.repeat_interleave(num_languages)


def save_masks(
    path: str | Path, mask: torch.Tensor, languages: list[str], sizes: list[int]
) -> Path:
    rows, vocab = mask.shape
    if rows != len(languages) * len(sizes):
        raise ValueError("mask rows must be |L|·|S|")
    packed = np.packbits(mask.numpy(), axis=1)
    meta = {
        "languages": ",".join(languages),
        "sizes": ",".join(map(str, sizes)),
        "vocab_size": str(vocab),
        "layout": "row = s*|L| + l, bit-packed along the vocabulary (numpy packbits, big bit "
        "order)",
    }
    from safetensors.numpy import save

    return atomic_write_bytes(
        path, canonical_safetensors(save({"mask_packed": packed}, metadata=meta))
    )


def load_masks(path: str | Path) -> tuple[torch.Tensor, list[str], list[int]]:
    """-> (bool mask [|L|·|S|, |V|], languages, sizes)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            packed = f.get_tensor("mask_packed")
    except Exception as e:  # noqa: BLE001 - missing / corrupted file
        raise PolyspecError(f"cannot read language masks {path}: {first_line(e)}") from None
    try:
        languages, sizes, vocab = (
            meta["languages"].split(","),
            [int(x) for x in meta["sizes"].split(",")],
            int(meta["vocab_size"]),
        )
    except (KeyError, ValueError):
        raise PolyspecError(
            f"language masks {path} lack their languages/sizes/vocab_size metadata"
        ) from None
    mask = torch.from_numpy(np.unpackbits(packed, axis=1, count=vocab).astype(bool))
    if mask.shape[0] != len(languages) * len(sizes):
        raise PolyspecError(
            f"language masks {path}: {mask.shape[0]} rows for {len(languages)} languages x "
            f"{len(sizes)} sizes"
        )
    return mask, languages, sizes
