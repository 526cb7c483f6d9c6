"""Offline target features (``features: offline``): the frozen target's last hidden states for every
training example, computed once and stored as sharded safetensors under ``<stage dir>/features/``
(``ex<i>`` → [T_i, H]), then reused across epochs, steps and resumes. Shards are written atomically,
so an interrupted precompute continues where it stopped."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save
from tqdm.auto import tqdm

from polyspec.errors import PolyspecError, first_line
from polyspec.io import atomic_write_bytes
from train.objectives import target_features


class FeatureStore:
    def __init__(self, root: Path, examples, target, shard_size: int = 256, is_main: bool = True):
        self.root, self.shard_size, self.n = Path(root), shard_size, len(examples)
        self.root.mkdir(parents=True, exist_ok=True)
        self._cache: dict[int, dict[str, torch.Tensor]] = {}
        if is_main:
            self._precompute(examples, target)

    def _path(self, shard: int) -> Path:
        return self.root / f"shard-{shard:05d}.safetensors"

    @torch.no_grad()
    def _precompute(self, examples, target) -> None:
        shards = range((self.n + self.shard_size - 1) // self.shard_size)
        for shard in tqdm(shards, desc="features", leave=False):
            if self._path(shard).is_file():
                continue
            out = {}
            for i in range(shard * self.shard_size, min(self.n, (shard + 1) * self.shard_size)):
                ids = torch.tensor([examples[i].input_ids], device=target.device)
                out[f"ex{i}"] = (
                    target_features(target.model, ids, torch.ones_like(ids))[0]
                    .float()
                    .cpu()
                    .contiguous()
                )
            atomic_write_bytes(self._path(shard), save(out))

    def get(self, indices: list[int], T: int, device) -> torch.Tensor:
        """Features of ``indices``, right-padded with zeros to T: [B, T, H]."""
        rows = []
        for i in indices:
            shard = i // self.shard_size
            if shard not in self._cache:
                self._cache = {shard: self._load(shard)}  # keep one shard in memory
            f = self._cache[shard].get(f"ex{i}")
            if f is None:
                raise PolyspecError(
                    f"feature shard {self._path(shard)} holds no ex{i}; delete it and rerun train"
                )
            rows.append(torch.nn.functional.pad(f, (0, 0, 0, T - f.shape[0])))
        return torch.stack(rows).to(device)

    def _load(self, shard: int) -> dict[str, torch.Tensor]:
        path = self._path(shard)
        try:
            return load_file(str(path))
        # safetensors raises its own error type on a damaged file
        except Exception as e:  # noqa: BLE001
            raise PolyspecError(
                f"corrupt feature shard {path}: {first_line(e)}; delete it and rerun train"
            ) from None
