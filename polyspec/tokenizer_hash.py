"""What identifies a target's tokenizer: the sha256 every stage pins (vocabularies, feature shards, drafters,
bundles) and the one normalisation applied before hashing, so every load path pins the same hash."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def ensure_pad(tok: Any) -> Any:
    """Llama-3 style tokenizers have no pad token; batched generation needs one (EOS stands in).
    Applied wherever a tokenizer is loaded, before it is hashed, so every load pins the same hash."""
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def tokenizer_sha256(tokenizer: Any) -> str:
    """sha256 of the tokenizer's canonical serialization (the content of ``tokenizer.json``) plus its
    special-token ids, so the same tokenizer hashes the same whatever folder or format it came from."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode("utf-8"))
    else:  # slow tokenizer without a tokenizers backend: fall back to the vocabulary itself
        h.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode("utf-8"))
    special = {k: getattr(tokenizer, f"{k}_token_id", None) for k in ("bos", "eos", "pad", "unk")}
    h.update(json.dumps(special, sort_keys=True).encode("utf-8"))
    return h.hexdigest()
