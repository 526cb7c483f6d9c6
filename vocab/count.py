"""Token counting under the target tokenizer and frequency ranking.

Counting encodes batches of documents with the fast (Rust) tokenizer — parallel across the batch —
and accumulates ``np.bincount`` per token id. Ranking is by count (descending, ties by id) with the
special and structural tokens (BOS, EOS, pad, turn markers, newline, space) forced to the top.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm


@dataclass
class Counts:
    counts: np.ndarray  # int64 [|V|]
    documents: int = 0
    tokens: int = 0
    seconds: float = 0.0
    heldout: np.ndarray | None = None  # int64 [|V|]: counts of the held-out documents (split)
    heldout_documents: int = 0


def batched(it: Iterable[str], n: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for x in it:
        batch.append(x)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def encode_batch(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids without special tokens, through the Rust backend (no offsets: fastest path)."""
    backend = tokenizer.backend_tokenizer
    enc = getattr(backend, "encode_batch_fast", backend.encode_batch)
    return [e.ids for e in enc(texts, add_special_tokens=False)]


def token_counts(tokenizer, texts: list[str], vocab_size: int) -> np.ndarray:
    """Token-id counts [|V|] of ``texts`` (no special tokens)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids in encode_batch(tokenizer, texts):
        if ids:
            counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=vocab_size)[
                :vocab_size
            ]
    return counts


def count_documents(
    texts: Iterable[str],
    tokenizer,
    vocab_size: int,
    batch_size: int = 1000,
    max_documents: int | None = None,
    max_tokens: int | None = None,
    heldout_every: int | None = None,
    desc: str = "count",
) -> Counts:
    """Count tokens of ``texts``; with ``heldout_every=k`` every k-th document goes to ``heldout``
    instead."""
    out = Counts(np.zeros(vocab_size, dtype=np.int64))
    held = np.zeros(vocab_size, dtype=np.int64) if heldout_every else None
    bar = tqdm(desc=desc, unit="tok", unit_scale=True, dynamic_ncols=True, leave=False)
    t0, index = time.perf_counter(), 0
    for batch in batched(texts, batch_size):
        if max_documents is not None:
            batch = batch[: max(0, max_documents - out.documents - out.heldout_documents)]
        if not batch:
            break
        ids = encode_batch(tokenizer, batch)
        for doc in ids:
            is_held = heldout_every and index % heldout_every == heldout_every - 1
            index += 1
            if not doc:
                continue
            arr = np.asarray(doc, dtype=np.int64)
            if is_held:
                held += np.bincount(arr, minlength=vocab_size)[:vocab_size]
                out.heldout_documents += 1
            else:
                out.counts += np.bincount(arr, minlength=vocab_size)[:vocab_size]
                out.documents += 1
                out.tokens += len(doc)
                bar.update(len(doc))
        if max_tokens is not None and out.tokens >= max_tokens:
            break
    bar.close()
    out.seconds = time.perf_counter() - t0
    out.heldout = held
    return out


def count_weighted(
    items: list[tuple[str, float]], tokenizer, vocab_size: int, scale: float = 1e9
) -> Counts:
    """wordfreq: each item's tokens count ``weight × scale`` times (an expected count per ``scale``
    words)."""
    out = Counts(np.zeros(vocab_size, dtype=np.int64))
    acc = np.zeros(vocab_size, dtype=np.float64)
    t0 = time.perf_counter()
    for batch in batched(items, 20000):
        ids = encode_batch(tokenizer, [t for t, _ in batch])
        lengths = np.fromiter((len(d) for d in ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter((i for d in ids for i in d), dtype=np.int64, count=int(lengths.sum()))
        weights = np.repeat(np.asarray([w for _, w in batch]) * scale, lengths)
        acc += np.bincount(flat, weights=weights, minlength=vocab_size)[:vocab_size]
        out.tokens += int(lengths.sum())
    out.counts = np.rint(acc).astype(np.int64)
    out.documents = len(items)
    out.seconds = time.perf_counter() - t0
    return out


# Punctuation, digits and symbols of running text in every script: word lists (wordfreq) never
# contain them, and they are among the most frequent tokens of any language, so they rank with the
# specials.
_PUNCT = (
    list(".,;:!?'\"()[]{}-–—/\\*&%$#@+=<>|_~`^…")
    + list("0123456789")
    + list("。、，！？：；「」『』（）《》【】・～")
)


def structural_ids(tokenizer, stop_strings: list[str]) -> list[int]:
    """Special tokens, newline/space/turn-marker tokens, then single-token punctuation and digits
    (with and without a leading space), in a stable order: ranked first in every language."""
    ids: list[int] = []
    for i in [
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        *tokenizer.all_special_ids,
    ]:
        if i is not None and i not in ids:
            ids.append(int(i))
    for text in ["\n", "\n\n", " ", *stop_strings]:
        for i in tokenizer(text, add_special_tokens=False)["input_ids"]:
            if i not in ids:
                ids.append(int(i))
    for text in [form for ch in _PUNCT for form in (ch, " " + ch)]:
        enc = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(enc) == 1 and enc[0] not in ids:
            ids.append(int(enc[0]))
    return ids


def rank(counts: np.ndarray, first: list[int], tail_counts: np.ndarray | None = None) -> np.ndarray:
    """Ids by descending count (ties by id) with ``first`` on top.

    Ids never seen follow, ordered by ``tail_counts`` (e.g. the other languages' pooled counts),
    then by id, so the list covers the whole vocabulary and any size S ≤ |V| can be cut from it.
    Without ``tail_counts`` unseen ids are left out.
    """
    order = np.lexsort((np.arange(len(counts)), -counts))  # primary: -count, secondary: id
    seen = order[counts[order] > 0]
    head = np.asarray(first, dtype=np.int64)
    parts = [head, seen[~np.isin(seen, head)]]
    if tail_counts is not None:
        unseen = np.nonzero(counts == 0)[0]
        unseen = unseen[~np.isin(unseen, head)]
        parts.append(unseen[np.lexsort((unseen, -tail_counts[unseen]))])
    return np.concatenate(parts).astype(np.int32)
