"""What identifies a target's tokenizer, at two depths, and the one normalisation applied before
hashing, so every load path pins the same hashes.

- ``tokenizer_sha256``: the whole tokenizer (its rules as well as its ids). Every stage of one run
  pins it (vocabularies, feature shards, checkpoints, drafters, bundles).
- ``vocab_sha256``: the id → token table alone, which is what a drafter's ids mean. Two conversions
  of one tokenizer can differ in their rules and keep the table. For example, transformers 5.17 and
  5.24 both convert SmolLM2's GGUF tokenizer to the same 49,152 ids, but 5.17 makes ``<|im_start|>``
  the EOS and turns byte fallback on. A bundle serves a target whose tokenizer has its table
  (:func:`polyspec.targets.check_pin`), and says how their rules differ.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

SPECIAL_ROLES = ("bos", "eos", "pad", "unk")


def ensure_pad(tok: Any) -> Any:
    """Llama-3 style tokenizers have no pad token; batched generation needs one (EOS stands in).
    Applied wherever a tokenizer is loaded, before it is hashed, so every load pins the same
    hash."""
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def special_token_ids(tokenizer: Any) -> dict[str, int | None]:
    """The ids of the tokenizer's special roles (``bos``, ``eos``, ``pad``, ``unk``; None where it
    has no such token)."""
    return {k: getattr(tokenizer, f"{k}_token_id", None) for k in SPECIAL_ROLES}


def tokenizer_sha256(tokenizer: Any) -> str:
    """sha256 of the tokenizer's canonical serialization (the content of ``tokenizer.json``) plus
    its special-token ids, so the same tokenizer hashes the same whatever folder or format it came
    from."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode("utf-8"))
    else:  # slow tokenizer without a tokenizers backend: fall back to the vocabulary itself
        h.update(
            json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode("utf-8")
        )
    h.update(json.dumps(special_token_ids(tokenizer), sort_keys=True).encode("utf-8"))
    return h.hexdigest()


def vocab_sha256(tokenizer: Any) -> str:
    """sha256 of the id → token table (added tokens included), in id order: the same table hashes
    the same whichever library version, serialization or rules (special roles, normaliser, byte
    fallback) came with it."""
    table = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(table, ensure_ascii=False).encode("utf-8")).hexdigest()
