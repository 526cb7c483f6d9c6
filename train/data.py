"""Training examples: token ids plus a loss mask, laid out with the target's prompt format.

- finetune records (synth ``data.jsonl``: ShareGPT ``conversations``): the human turns are the
  prompt, the loss covers the response tokens only — the same layout synth used to ask the target;
- pretrain records (``text``, e.g. ``synth distill --continuation``; or conversations): loss on
  every token.

Malformed lines are skipped and counted; a file with no usable line is an error before training
starts.
"""

from __future__ import annotations

import glob
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from polyspec.errors import PolyspecError
from polyspec.features import FeatureReader
from polyspec.io import read_jsonl
from polyspec.prompts import render


@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token is a training target
    # captured features: (shard path, record id) (polyspec/features.py)
    feat: tuple[str, str] | None = None


@dataclass
class Dataset:
    examples: list[Example]
    skipped: int
    files: list[str]


def expand_paths(patterns: list[str], run: str, lang: str) -> list[str]:
    paths = []
    for p in patterns:
        p = p.format(run=run, lang=lang)
        found = sorted(glob.glob(p))
        if not found:
            raise PolyspecError(f"training data not found: {p}")
        paths += found
    return paths


def read_records(paths: list[str], with_source: bool = False) -> tuple[list[dict], int]:
    records, skipped = [], 0
    for path in paths:
        lines = read_jsonl(path)  # torn or malformed lines are skipped and counted
        for rec in lines:
            if isinstance(rec.get("text"), str) or _turns(rec):
                records.append({**rec, "_file": path} if with_source else rec)
            else:
                skipped += 1
        skipped += lines.skipped
    return records, skipped


def _turns(rec: dict) -> list[tuple[str, str]] | None:
    conv = rec.get("conversations")
    if not isinstance(conv, list) or len(conv) < 2:
        return None
    turns = []
    for t in conv:
        if not isinstance(t, dict) or not isinstance(t.get("value"), str):
            return None
        role = {
            "human": "user",
            "user": "user",
            "gpt": "assistant",
            "assistant": "assistant",
            "system": "system",
        }.get(t.get("from"))
        if role is None:
            return None
        turns.append((role, t["value"]))
    return turns if any(r == "assistant" for r, _ in turns) else None


def encode_record(rec: dict, target, max_length: int, response_only: bool) -> Example | None:
    """One record → ids + loss mask (response tokens only for conversations when
    ``response_only``)."""
    tok, fmt = target.tokenizer, target.spec.prompt_format
    turns = _turns(rec)
    if turns is None:  # plain text: every token is a target
        ids = tok(rec["text"], add_special_tokens=True)["input_ids"][:max_length]
        return Example(ids, [0] + [1] * (len(ids) - 1)) if len(ids) > 2 else None
    msgs = [{"role": r, "content": v} for r, v in turns]
    last = max(i for i, (r, _) in enumerate(turns) if r == "assistant")
    full = render(fmt, tok, msgs[: last + 1], add_generation_prompt=False)
    prefix = render(fmt, tok, msgs[:last], add_generation_prompt=True)
    if not full.startswith(prefix):
        raise PolyspecError(
            "the prompt format does not render the prompt as a prefix of the conversation"
        )
    enc = tok(full, add_special_tokens=fmt.kind == "completion", return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    start = len(prefix)
    mask = [int((not response_only) or (s >= start and e > s)) for s, e in offsets]
    mask[0] = 0
    ids, mask = ids[:max_length], mask[:max_length]
    return Example(ids, mask) if sum(mask) > 0 else None


def text_chunks(
    ids: list[int], bos: int | None, max_length: int, min_tokens: int = 16
) -> list[Example]:
    """A plain-text record's token ids → sequences of at most ``max_length`` tokens covering all of
    it, each after the tokenizer's BOS (when it adds one); a tail shorter than ``min_tokens`` is
    dropped (as ``corpus prefill``)."""
    head = ids[:1] if ids and bos is not None and ids[0] == bos else []
    body, step = ids[len(head) :], max_length - len(head)
    out = []
    for k in range(0, len(body), step):
        piece = head + body[k : k + step]
        if len(piece) >= min(min_tokens, len(ids)) and len(piece) > 2:
            out.append(Example(piece, [0] + [1] * (len(piece) - 1)))
    return out


def build_dataset(
    patterns: list[str],
    target,
    run: str,
    lang: str,
    max_length: int,
    response_only: bool,
    captured: bool = False,
    split_text: bool = False,
) -> Dataset:
    """``captured``: examples are the distilled records' own token ids (exactly what the target
    generated and whose hidden states were kept); records without captured features are skipped and
    counted."""
    paths = expand_paths(patterns, run, lang)
    records, skipped = read_records(paths, with_source=captured)
    reader = FeatureReader(target.spec.name, target.tokenizer_sha256) if captured else None
    examples = []
    if split_text and not captured:  # every plain-text record read whole, tokenized in batches
        texts = [r for r in records if _turns(r) is None]
        records = [r for r in records if _turns(r) is not None]
        tok = target.tokenizer
        for i in range(0, len(texts), 1000):
            for ids in tok([r["text"] for r in texts[i : i + 1000]], add_special_tokens=True)[
                "input_ids"
            ]:
                pieces = text_chunks(ids, tok.bos_token_id, max_length)
                examples += pieces
                skipped += not pieces
    for rec in records:
        ex = (
            captured_example(rec, reader, max_length, response_only)
            if captured
            else encode_record(rec, target, max_length, response_only)
        )
        if ex is None:
            skipped += 1
        else:
            examples.append(ex)
    if not examples:
        raise PolyspecError(
            f"no usable training example in {', '.join(paths)} ({skipped} lines skipped)"
        )
    return Dataset(examples, skipped, paths)


def all_captured(patterns: list[str], run: str, lang: str) -> bool:
    """Every record of these files names captured features (a held-out set may be plain records)."""
    records, _ = read_records(expand_paths(patterns, run, lang))
    return bool(records) and all(isinstance(r.get("features_file"), str) for r in records)


def captured_example(
    rec: dict, reader: FeatureReader, max_length: int, response_only: bool
) -> Example | None:
    if not isinstance(rec.get("features_file"), str) or not isinstance(rec.get("id"), str):
        return None
    path = str(Path(rec["_file"]).parent / rec["features_file"])
    if not Path(path).resolve().is_relative_to(Path(rec["_file"]).parent.resolve()):
        raise PolyspecError(
            f"{rec['_file']}: features_file {rec['features_file']!r} leaves its folder"
        )
    ids, start = reader.ids(path, rec["id"])
    mask = [0] * start + [1] * (len(ids) - start) if response_only else [0] + [1] * (len(ids) - 1)
    ids, mask = ids[:max_length], mask[:max_length]
    return Example(ids, mask, (path, rec["id"])) if sum(mask) > 1 else None


def split(ds: Dataset, eval_fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """Deterministic train / held-out split (at least one example on each side when possible)."""
    idx = list(range(len(ds.examples)))
    random.Random(seed).shuffle(idx)
    n_eval = max(1, round(len(idx) * eval_fraction)) if len(idx) > 1 else 0
    held = set(idx[:n_eval])
    return [e for i, e in enumerate(ds.examples) if i not in held], [
        ds.examples[i] for i in sorted(held)
    ]


def collate(
    batch: list[Example], pad_id: int, indices: list[int] | None = None, multiple: int = 1
) -> dict[str, torch.Tensor]:
    """Right-padded ids, attention mask, loss mask (and the examples' indices, for offline
    features); the length rounded up to ``multiple``."""
    T = -(-max(len(e.input_ids) for e in batch) // multiple) * multiple
    ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
    attn = torch.zeros((len(batch), T), dtype=torch.long)
    mask = torch.zeros((len(batch), T), dtype=torch.float32)
    for b, e in enumerate(batch):
        n = len(e.input_ids)
        ids[b, :n] = torch.tensor(e.input_ids)
        attn[b, :n] = 1
        mask[b, :n] = torch.tensor(e.loss_mask, dtype=torch.float32)
    out = {"input_ids": ids, "attention_mask": attn, "loss_mask": mask}
    if indices is not None:
        out["index"] = torch.tensor(indices)
    return out


def epoch_order(
    n: int, seed: int, epoch: int, lengths: list[int] | None = None, batch: int = 1, group: int = 16
) -> list[int]:
    """The examples of one epoch in training order: a seeded shuffle; with ``lengths``, grouped by
    length (as transformers' ``group_by_length``): each run of ``group`` × ``batch`` shuffled
    examples is sorted by length and cut into batches, and the full batches are shuffled, so a batch
    pads to about its own examples' length (random batches of the captured distillation data are ~37
    % padding, grouped ~13 %) while which examples share a batch still changes every epoch. The
    stream of batches runs across epochs (:func:`step_indices`): where epoch ``e`` starts inside a
    batch, its first (−e·n mod ``batch``) examples finish that batch and the cut follows, so all the
    other batches are one group's."""
    rng = random.Random(seed * 100_003 + epoch)
    order = list(range(n))
    rng.shuffle(order)
    if lengths is None or batch <= 1:
        return order
    mega = group * batch
    ranked = [
        i for m in range(0, n, mega) for i in sorted(order[m : m + mega], key=lambda i: -lengths[i])
    ]
    head = (-epoch * n) % batch
    full = (n - head) // batch
    chunks = [ranked[head + b * batch : head + (b + 1) * batch] for b in range(full)]
    rng.shuffle(chunks)
    return ranked[:head] + [i for c in chunks for i in c] + ranked[head + full * batch :]


def step_indices(
    n: int,
    per_step: int,
    seed: int,
    start_step: int = 0,
    lengths: list[int] | None = None,
    batch: int = 1,
):
    """Endless stream of each optimizer step's ``per_step`` example indices, epoch after epoch
    (:func:`epoch_order`), from ``start_step`` on: a resumed run continues exactly where it
    stopped."""
    cursor, orders = start_step * per_step, {}
    while True:
        idx = []
        for c in range(cursor, cursor + per_step):
            epoch, offset = divmod(c, n)
            # the cursor only moves forward: the current epoch's order is all it needs
            if epoch not in orders:
                orders = {epoch: epoch_order(n, seed, epoch, lengths, batch)}
            idx.append(orders[epoch][offset])
        yield idx
        cursor += per_step
