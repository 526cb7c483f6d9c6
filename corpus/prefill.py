"""The target reads the corpus: one batched prefill per batch of token chunks captures, at every
position, what distillation captures while generating (the last layer after the final norm, which
the LM head reads, and the three layers an EAGLE-3 drafter fuses), so the pretrain learns from
general text at prefill speed, not generation speed (Yi et al. 2024's P step; EAGLE's training
features are the target's hidden states on fixed text).

    python -m corpus prefill --lang vi --target gemma3-270m --run runs/x [--max-tokens 2000000]
        [--seq-len 256]

Reads ``<run>/corpus/<lang>/data.jsonl``; writes ``<run>/corpus/<lang>-prefill/``, the layout of a
distillation with captured features (``polyspec.features``), so ``train`` reads it with
``features=captured``:
- ``features/a<first chunk:07d>.safetensors``: per chunk ``r.ids`` (BOS + up to ``seq_len`` − 1
  document tokens), ``r.start`` = 0, ``r.f`` [n, H], ``r.aux`` [n, 3H] (bf16);
- ``parts/a<first chunk:07d>.jsonl``: the chunks' records ``{"id", "lang", "source", "text",
  "features_file", "tokens"}``, written after their shard: a shard with its part is done, and a
  rerun goes on after it;
- ``data.jsonl`` (every part, in order) and ``stats.json`` (chunks, tokens, seconds, tokens/s),
  written last.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from corpus.build import document_ids
from polyspec.errors import PolyspecError
from polyspec.features import prefill_features, write_shard
from polyspec.io import atomic_write_json, atomic_write_text, read_jsonl
from polyspec.targets import eagle3_layers


def chunks(
    docs: list[dict], tokenizer, seq_len: int, max_tokens: int | None, min_tokens: int = 16
) -> list[dict]:
    """Documents → chunks of BOS + up to ``seq_len`` − 1 of their tokens (a document's tail shorter
    than ``min_tokens`` is dropped), in document order, until ``max_tokens`` chunk tokens."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    out, total = [], 0
    step = seq_len - len(bos)
    for d, ids in document_ids(tokenizer, docs, batch=500):
        for k in range(0, len(ids), step):
            piece = bos + ids[k : k + step]
            if len(piece) < min_tokens:
                continue
            if max_tokens is not None and total + len(piece) > max_tokens:
                return out
            out.append(
                {"doc": d["id"], "source": d.get("source", ""), "k": k // step, "ids": piece}
            )
            total += len(piece)
    return out


def run_prefill(
    target: Any,
    lang: str,
    run: str | Path,
    seq_len: int = 256,
    max_tokens: int | None = None,
    shard_chunks: int = 64,
    batch_tokens: int = 4096,
    feature_layers: str = "eagle3",
    log: Callable[[str], None] = print,
) -> dict:
    """The whole ``prefill`` step for one language (resumable shard by shard); returns its stats."""
    src = Path(run) / "corpus" / lang / "data.jsonl"
    if not src.is_file():
        raise PolyspecError(
            f"{src} not found: build the corpus first (python -m corpus --langs {lang} --run {run})"
        )
    out = Path(run) / "corpus" / f"{lang}-prefill"
    aux = eagle3_layers(target.num_layers) if feature_layers == "eagle3" else []
    todo = chunks(list(read_jsonl(src)), target.tokenizer, seq_len, max_tokens)
    if not todo:
        raise PolyspecError(f"{src}: no chunk of at least 16 tokens")
    args = hashlib.sha256(
        json.dumps(
            {
                "data": hashlib.sha256(src.read_bytes()).hexdigest(),
                "seq_len": seq_len,
                "max_tokens": max_tokens,
                "shard": shard_chunks,
                "aux": aux,
                "tokenizer": target.tokenizer_sha256,
            }
        ).encode()
    ).hexdigest()[:16]
    state = out / "args.json"
    if state.is_file() and json.loads(state.read_text()).get("args") != args:
        raise PolyspecError(
            f"{out} was captured with other settings or another corpus; delete it to capture anew"
        )
    atomic_write_json(state, {"args": args})
    meta = {
        "target": target.spec.name,
        "tokenizer": target.tokenizer_sha256,
        "aux_layers": json.dumps(aux or None),
    }
    tokens = seconds = 0.0
    bar = tqdm(
        total=sum(len(c["ids"]) for c in todo),
        desc=f"prefill {lang}",
        unit="tok",
        unit_scale=True,
        dynamic_ncols=True,
        mininterval=2.0,
    )
    for first in range(0, len(todo), shard_chunks):
        part = out / "parts" / f"a{first:07d}.jsonl"
        batch = todo[first : first + shard_chunks]
        n = sum(len(c["ids"]) for c in batch)
        bar.update(n)
        if part.is_file():
            continue
        t0 = time.perf_counter()
        feats = prefill_features(target, [c["ids"] for c in batch], aux, batch_tokens)
        seconds += time.perf_counter() - t0
        tokens += n
        shard = f"features/a{first:07d}.safetensors"
        rows, recs = {}, []
        for j, (c, f) in enumerate(zip(batch, feats)):
            rid = f"{lang}-corpus-{first + j:07d}"
            rows[rid] = {"ids": c["ids"], "start": 0, **f}
            recs.append(
                {
                    "id": rid,
                    "lang": lang,
                    "source": f"corpus:{c['source']}",
                    "text": target.tokenizer.decode(c["ids"], skip_special_tokens=True),
                    "features_file": shard,
                    "tokens": len(c["ids"]),
                    "doc": c["doc"],
                    "chunk": c["k"],
                }
            )
        write_shard(out / shard, rows, meta)
        atomic_write_text(part, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
        bar.set_postfix_str(f"{tokens / max(seconds, 1e-9):,.0f} tok/s")
    bar.close()
    lines = [p.read_text(encoding="utf-8") for p in sorted((out / "parts").glob("a*.jsonl"))]
    atomic_write_text(out / "data.jsonl", "".join(lines))
    stats = {
        "lang": lang,
        "target": target.spec.name,
        "dtype": str(target.dtype).removeprefix("torch."),
        "chunks": len(todo),
        "tokens": sum(len(c["ids"]) for c in todo),
        "seq_len": seq_len,
        "aux_layers": aux,
        "captured_tokens": int(tokens),
        "seconds": round(seconds, 2),
        "tokens_per_second": round(tokens / seconds, 1) if seconds else None,
    }
    atomic_write_json(out / "stats.json", stats)
    log(
        f"prefill {lang}: {stats['chunks']:,} chunks, {stats['tokens']:,} tokens"
        + (f", {stats['tokens_per_second']:,} tok/s" if seconds else " (all shards were done)")
        + f" → {out}"
    )
    return stats
