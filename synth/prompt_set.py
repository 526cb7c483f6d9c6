"""The on-policy prompt set at scale: ``python -m synth prompts --lang en --run R --corpus 1500``.

ADASPEC Alg. 1 run at scale (``python -m synth --n 5000 few_shot_variants=64
filters.near_duplicate=0.7``: the target writes the instructions) gives most of the prompts; the
pool (synth/pool.py: the seeds and the task file's kinds) and ``corpus`` prompts about corpus
paragraphs (summaries: keep them a minority) join them. Then, over all of them:

- the pool's guard: no turn equal to a held-out turn (both held-out sets) or a benchmark turn, no
  exact repeat;
- near-duplicate removal of first turns (:class:`synth.filters.NearDuplicates`, MinHash LSH over
  word bigrams): near-copies of a held-out or benchmark turn go, and of each other the first stays;
- a seeded shuffle, so that every prefix of the file (a learning-curve point answers the first
  prompts) has the same mix.

Output ``<run>/synth/<lang>-prompts/``: ``prompts.jsonl`` (``{id, lang, kind, category, turns}``;
``kind`` the pool's source kind, ``category`` one of the benchmark's seven task kinds, by
:func:`category_of` for generated instructions) and ``report.json`` (counts by source and
category, what each filter removed, distinct word n-grams of the first turns). ``python -m synth
distill --prompts <that prompts.jsonl>`` answers them turn by turn.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

from polyspec.heldout import HELDOUT_CATEGORIES
from polyspec.io import atomic_write_json, atomic_write_text, read_json_or_none, read_jsonl
from synth.filters import NearDuplicates, normalize
from synth.pool import forbidden_turns, pool_items

# the benchmark's task kinds a generated instruction is sorted into by its wording (first match)
_CATEGORY_RULES = (
    ("translation", re.compile(r"\btranslat", re.I)),
    ("summarization", re.compile(r"\bsummar|\btl;?dr\b|\bmain (idea|points?)\b", re.I)),
    (
        "code",
        re.compile(
            r"\b(code|function|python|java(script)?|c\+\+|program(ming)?|script|sql|html|css|"
            r"algorithm|regex|api|compile[rd]?|debug)\b",
            re.I,
        ),
    ),
    (
        "math",
        re.compile(
            r"\d+\s*[-+*/×÷^=]\s*\d+|\b(calculate|solve|equation|percent(age)?|average|"
            r"probability|multiply|divide|sum of|how many|how much)\b",
            re.I,
        ),
    ),
    ("rag", re.compile(r"\b(passage|the (text|article|paragraph) (below|above))\b", re.I)),
)
_KIND_CATEGORY = {
    "qa": "qa",
    "rag": "rag",
    "summarization": "summarization",
    "passage": "summarization",
    "translation": "translation",
    "math": "math",
    "code": "code",
    "multiturn": "multiturn",
}


def category_of(kind: str, turns: tuple[str, ...] | list[str]) -> str:
    """The benchmark task kind (``polyspec.heldout.HELDOUT_CATEGORIES``) of a pool prompt: its own
    for the task file's kinds, else by the wording of its first turn (``qa`` when nothing
    matches)."""
    if len(turns) > 1:
        return "multiturn"
    if kind in _KIND_CATEGORY:
        return _KIND_CATEGORY[kind]
    return next((c for c, rule in _CATEGORY_RULES if rule.search(turns[0])), "qa")


def distinct_ngrams(texts: list[str], n: int) -> dict:
    """Distinct word n-grams of ``texts`` (normalized): how many, and their share of all n-grams
    ("distinct-n", the usual diversity measure of generated text)."""
    grams: Counter = Counter()
    for t in texts:
        w = normalize(t).split()
        grams.update(tuple(w[i : i + n]) for i in range(len(w) - n + 1))
    total = sum(grams.values())
    return {"distinct": len(grams), "total": total, "ratio": round(len(grams) / max(1, total), 4)}


def build_prompt_set(
    lang: str,
    run: str,
    corpus: int = 0,
    near_duplicate: float = 0.7,
    seed: int = 0,
    out_name: str = "prompts",
    exclude: list[str] | tuple[str, ...] = (),
) -> dict:
    """Write ``<run>/synth/<lang>-<out_name>/prompts.jsonl`` and ``report.json``; return the
    report. ``exclude``: earlier sets' prompts.jsonl — their prompts and near-copies stay out, so
    a later data round asks only new questions."""
    items = pool_items(lang, run, corpus=corpus)  # guarded: held-out/benchmark turns, repeats
    held = NearDuplicates(near_duplicate)
    for t in sorted(forbidden_turns()):
        held.add(t)
    near, kept, dropped, near_held = NearDuplicates(near_duplicate), [], Counter(), Counter()
    earlier = {r["turns"][0] for f in exclude for r in read_jsonl(f)}
    for t in sorted(earlier):
        near.add(t)
    in_earlier = Counter()
    for p in items:
        if any(held.seen(t) for t in p.turns):
            near_held[p.kind] += 1
            continue
        if p.turns[0] in earlier:
            in_earlier[p.kind] += 1
            continue
        if near.seen(p.turns[0]):
            dropped[p.kind] += 1
            continue
        near.add(p.turns[0])
        kept.append(p)
    random.Random(seed).shuffle(kept)
    records = [
        {
            "id": f"{lang}-{'prompt' if out_name == 'prompts' else out_name}-{i:06d}",
            "lang": lang,
            "kind": p.kind,
            "category": category_of(p.kind, p.turns),
            "turns": list(p.turns),
        }
        for i, p in enumerate(kept)
    ]
    out = Path(run) / "synth" / f"{lang}-{out_name}"
    atomic_write_text(
        out / "prompts.jsonl",
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
    )
    alg1 = read_json_or_none(Path(run) / "synth" / lang / "stats.json") or {}
    firsts = [r["turns"][0] for r in records]
    report = {
        "lang": lang,
        "prompts": len(records),
        "near_duplicate_jaccard": near_duplicate,
        "seed": seed,
        "by_kind": dict(Counter(r["kind"] for r in records).most_common()),
        "by_category": {c: sum(r["category"] == c for r in records) for c in HELDOUT_CATEGORIES},
        "near_duplicates_removed_by_kind": dict(dropped),
        "near_heldout_removed_by_kind": dict(near_held),
        "candidates": len(items),
        "earlier_sets": list(map(str, exclude)),
        "in_earlier_sets_by_kind": dict(in_earlier),
        "alg1": {
            k: alg1.get(k) for k in ("attempted", "accepted", "rejected_by_reason") if k in alg1
        },
        "distinct_ngrams": {f"{n}": distinct_ngrams(firsts, n) for n in (1, 2, 3)},
    }
    atomic_write_json(out / "report.json", report)
    return report
