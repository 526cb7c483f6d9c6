"""Packs: a run's synth folders as small files that outlive the run's disk, and their features
made again by the target's prefill.

A distillation's captured features are ~7 KB a token (SmolLM2: 4.6 GB a million answer tokens),
its text and token ids a few bytes; the ids and a prefill give the features back at prefill speed,
not generation speed (``corpus prefill``'s forward, ``polyspec.features.prefill_features``).

    python -m synth pack --run R R/synth/en R/synth/en-distill R/vocab … --out packs/
    python -m synth unpack packs/*.tar.xz --run <run> [--device auto] [--dtype …]

``pack`` writes one ``<out>/<folder, its "/" as "+">.tar.xz`` per folder of the run
(``synth+en-distill.tar.xz``): every file in it, each ``features/*.safetensors`` shard reduced to
``r.ids`` and ``r.start`` (the header kept: target, tokenizer, aux_layers), under the folder's path
in the run. ``progress.json`` is read first, so a pack taken while a distillation runs holds every
shard its committed records name (records past it are dropped on resume, ``synth.store``). Members
are sorted with zeroed owners and times: the same folder packs to the same bytes.

``unpack`` extracts a pack into ``<run>/<folder>/`` unless that folder is there already (a
kept disk wins), then gives every ids-only shard its ``r.f`` / ``r.aux`` again from one batched
prefill of its records' ids (shard by shard, atomically: an interrupted unpack continues). A
distillation restored from an unfinished pack resumes with ``synth distill`` as before.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import time
from pathlib import Path
from typing import Any

from safetensors import safe_open
from tqdm import tqdm

from polyspec.errors import PolyspecError
from polyspec.features import FeatureReader, prefill_features, write_shard
from polyspec.io import atomic_write_bytes, canonical_safetensors

SUFFIX = ".tar.xz"


def pack(folder: str | Path, run: str | Path, out_dir: str | Path) -> Path:
    """``<out_dir>/<folder's path in the run, "/" as "+">.tar.xz`` (the module's docstring); its
    path."""
    folder, run = Path(folder), Path(run)
    if not folder.is_dir():
        raise PolyspecError(f"{folder}: no such folder")
    try:
        rel = folder.resolve().relative_to(run.resolve())
    except ValueError:
        raise PolyspecError(f"{folder} is not inside the run {run}") from None
    # the commit point first: every shard a committed record names is on disk by then
    first = [folder / "progress.json"] if (folder / "progress.json").is_file() else []
    shards = set(folder.glob("features/*.safetensors"))
    rest = {p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")}
    members = [
        (p.relative_to(folder).as_posix(), _ids_only(p) if p in shards else p.read_bytes())
        for p in first + sorted(rest - set(first))
    ]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(members):
            info = tarfile.TarInfo(f"{rel.as_posix()}/{name}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return atomic_write_bytes(Path(out_dir) / f"{'+'.join(rel.parts)}{SUFFIX}", buf.getvalue())


def _ids_only(shard: Path) -> bytes:
    """A captured shard without its features: ``r.ids``, ``r.start`` and the header."""
    from safetensors.torch import save

    with safe_open(str(shard), framework="pt") as h:
        keep = {k: h.get_tensor(k) for k in h.keys() if k.endswith((".ids", ".start"))}
        meta = h.metadata() or {}
    return canonical_safetensors(save(keep, metadata=meta))  # the same bytes every time


def unpack(path: str | Path, run: str | Path) -> Path:
    """Extract a pack under ``<run>/`` unless its folder exists; the folder."""
    path = Path(path)
    if not path.name.endswith(SUFFIX):
        raise PolyspecError(f"{path}: not a synth pack (*{SUFFIX})")
    parts = path.name[: -len(SUFFIX)].split("+")
    if any(p in {"", ".", ".."} for p in parts):
        raise PolyspecError(f"{path}: a pack's name is its folder's path in the run")
    rel = "/".join(parts)
    dest = Path(run) / rel
    if dest.is_dir():
        return dest
    part = Path(run) / f".{'+'.join(parts)}.unpacking"
    with tarfile.open(path, mode="r:xz") as tar:
        for m in tar.getmembers():
            if not (m.isfile() and m.name.startswith(f"{rel}/")):
                raise PolyspecError(f"{path}: member {m.name!r} is not a file of {rel}/")
        tar.extractall(part, filter="data")  # the data filter refuses links and paths that leave
    dest.parent.mkdir(parents=True, exist_ok=True)
    (part / rel).rename(dest)
    shutil.rmtree(part)
    return dest


def ids_only_shards(folder: str | Path) -> list[Path]:
    """The folder's feature shards that hold ids but no features (a pack's)."""
    out = []
    for p in sorted(Path(folder).glob("features/*.safetensors")):
        with safe_open(str(p), framework="pt") as h:
            if not any(k.endswith(".f") for k in h.keys()):
                out.append(p)
    return out


def refill(folder: str | Path, target: Any, batch_tokens: int = 4096) -> dict:
    """Every ids-only shard of ``folder`` with its features from the target's prefill; figures."""
    shards = ids_only_shards(folder)
    reader = FeatureReader(target.spec.name, target.tokenizer_sha256)
    tokens, t0 = 0, time.perf_counter()
    for p in tqdm(shards, desc=f"features {Path(folder).name}", unit="shard", dynamic_ncols=True):
        path = str(p)
        aux = reader.aux_layers(path)  # the reader refuses another target's ids
        rids = reader.records(path)
        seqs = {r: reader.ids(path, r) for r in rids}
        feats = prefill_features(target, [seqs[r][0] for r in rids], aux, batch_tokens)
        rows = {r: {"ids": seqs[r][0], "start": seqs[r][1], **f} for r, f in zip(rids, feats)}
        # the header distillation writes
        meta = {
            "target": reader.target,
            "tokenizer": reader.tokenizer,
            "aux_layers": json.dumps(aux),
        }
        write_shard(p, rows, meta)
        tokens += sum(len(seqs[r][0]) for r in rids)
    seconds = time.perf_counter() - t0
    return {
        "folder": str(folder),
        "shards": len(shards),
        "tokens": tokens,
        "seconds": round(seconds, 1),
        "tokens_per_second": round(tokens / seconds, 1) if tokens else None,
    }


def target_of(folder: str | Path) -> str:
    """The target named in the header of the folder's first shard."""
    shard = next(iter(sorted(Path(folder).glob("features/*.safetensors"))), None)
    if shard is None:
        raise PolyspecError(f"{folder}: no feature shard")
    with safe_open(str(shard), framework="pt") as h:
        name = (h.metadata() or {}).get("target")
    if not name:
        raise PolyspecError(f"{shard}: no target in its header; pass --target")
    return name
