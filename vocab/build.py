"""The vocab stage end to end: count → rank → save per language, then coverage, overlap and masks.

Writes under ``<run>/vocab/``: ``<lang>.safetensors`` + ``<lang>.json``, ``coverage.json/png``,
``overlap.json/png``, ``language_masks.safetensors`` (ADASPEC Alg. 2 lines 6–16, sizes S that every
ranked list can fill) and ``summary.json``.
"""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np

from polyspec.errors import PolyspecError
from polyspec.io import atomic_write_json, read_jsonl
from polyspec.languages import Language, get_language
from polyspec.targets import load_target
from vocab.analysis import (
    coverage_curve,
    k_for_coverage,
    overlap_matrix,
    prompt_coverage_curve,
    write_coverage,
    write_overlap,
)
from vocab.config import VocabConfig
from vocab.count import (
    count_documents,
    count_weighted,
    encode_batch,
    rank,
    structural_ids,
    token_counts,
)
from vocab.files import RankedVocab, save_ranked
from vocab.masks import build_masks, save_masks
from vocab.sources import documents, wordfreq_items

TEXT_SOURCES = {"fineweb2", "wikipedia", "files", "synth"}


def heldout_answers_path(run: str | Path, code: str) -> Path:
    return Path(run) / "synth" / f"{code}-heldout" / "data.jsonl"


def heldout_kind(cfg: VocabConfig, lang: Language) -> str:
    names = {s.name for s in cfg.sources}
    kind = cfg.heldout
    answers = heldout_answers_path(cfg.run, lang.code)
    if kind == "answers" and not answers.is_file():
        raise PolyspecError(
            f"heldout=answers: {answers} is missing (python -m synth distill --prompts heldout "
            f"--out-name heldout --temperatures 0 --lang {lang.code})"
        )
    if kind == "auto":
        if answers.is_file():
            kind = "answers"
        elif names & TEXT_SOURCES:
            kind = "split"
        elif glob.glob(str(Path(cfg.run) / "synth" / f"{lang.code}*" / "data.jsonl")):
            kind = "synth"
        else:
            kind = "seeds"
    if kind == "split" and not names & TEXT_SOURCES:
        raise PolyspecError(
            "heldout=split needs a running-text source (fineweb2, wikipedia, files or synth)"
        )
    if kind == "synth" and "synth" in names:
        raise PolyspecError(
            "heldout=synth would measure coverage on the text that was counted; use heldout=split"
        )
    return kind


def heldout_counts(
    kind: str, cfg: VocabConfig, lang: Language, tokenizer, vocab_size: int
) -> tuple[np.ndarray, dict]:
    """Held-out token counts for the kinds that are not a split of the counted text."""
    if kind == "answers":  # what the decoder will have to draft: the target's own greedy text
        texts = [
            t["value"]
            for rec in read_jsonl(heldout_answers_path(cfg.run, lang.code))
            for t in rec.get("conversations", [])[-1:]
            if isinstance(t.get("value"), str)
        ]
    elif kind == "synth":
        from vocab.config import SourceConfig

        texts = list(documents(SourceConfig(name="synth"), lang, cfg.run))
    else:  # seeds: the human-written system prompt and few-shot pairs of the registry entry
        texts = [lang.system_prompt] + [t for s in lang.seeds for t in (s.instruction, s.response)]
    counts = token_counts(tokenizer, texts, vocab_size)
    return counts, {"kind": kind, "documents": len(texts), "tokens": int(counts.sum())}


def heldout_answer_docs(
    cfg: VocabConfig, lang: Language, target
) -> list[tuple[list[int], list[int]]]:
    """(answer ids, prompt ids) of each held-out answer; the prompt is the earlier turns in the
    target's prompt format, as the decoder is given it."""
    from polyspec.prompts import render

    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    answers, prompts = [], []
    for rec in read_jsonl(heldout_answers_path(cfg.run, lang.code)):
        turns = [t for t in rec.get("conversations", []) if isinstance(t.get("value"), str)]
        if not turns:
            continue
        msgs = [
            {"role": roles.get(t.get("from"), "user"), "content": t["value"]} for t in turns[:-1]
        ]
        answers.append(turns[-1]["value"])
        prompts.append(render(target.spec.prompt_format, target.tokenizer, msgs) if msgs else "")
    return list(
        zip(encode_batch(target.tokenizer, answers), encode_batch(target.tokenizer, prompts))
    )


def count_language(
    cfg: VocabConfig, lang: Language, target, first: list[int]
) -> tuple[np.ndarray, np.ndarray, dict, list]:
    """Mixed counts [|V|] of one language, its held-out counts [|V|], the metadata of the counting
    (it goes into the ranked list's sidecar) and per-source timings (summary.json only: sidecars
    must be reproducible)."""
    tok, V = target.tokenizer, target.vocab_size
    kind = heldout_kind(cfg, lang)
    mixed = np.zeros(V, dtype=np.float64)
    held = np.zeros(V, dtype=np.int64)
    held_docs, total_tokens, source_meta, timings = 0, 0, [], []
    for src in cfg.sources:
        if src.name == "wordfreq":
            c = count_weighted(
                wordfreq_items(lang, cfg.wordfreq_space_share, cfg.wordfreq_capital_share), tok, V
            )
        else:
            c = count_documents(
                documents(src, lang, cfg.run),
                tok,
                V,
                batch_size=cfg.batch_size,
                max_documents=src.max_documents,
                max_tokens=src.max_tokens,
                heldout_every=cfg.heldout_every if kind == "split" else None,
                desc=f"{lang.code}/{src.name}",
            )
            if c.heldout is not None:
                held += c.heldout
                held_docs += c.heldout_documents
        if c.counts.sum() == 0:
            raise PolyspecError(
                f"source {src.name!r} gave no tokens for {lang.code!r} (empty corpus?)"
            )
        # each source as a distribution, mixed by weight
        mixed += src.weight * c.counts / c.counts.sum()
        total_tokens += c.tokens
        # timings go to summary.json only: the sidecar travels into bundles, whose checksums must be
        # reproducible
        source_meta.append(
            {
                "name": src.name,
                "weight": src.weight,
                "path": src.path,
                "documents": c.documents,
                "tokens": c.tokens,
            }
        )
        timings.append(
            {
                "source": src.name,
                "seconds": round(c.seconds, 2),
                "tokens_per_second": round(c.tokens / c.seconds) if c.seconds else None,
            }
        )
    counts = np.rint(mixed / mixed.sum() * total_tokens).astype(np.int64)
    if kind == "split":
        held_info = {
            "kind": "split",
            "every": cfg.heldout_every,
            "documents": held_docs,
            "tokens": int(held.sum()),
        }
    else:
        held, held_info = heldout_counts(kind, cfg, lang, tok, V)
    if held.sum() == 0:
        raise PolyspecError(
            f"no held-out text for {lang.code!r} (kind {kind}); add documents or use heldout=seeds"
        )
    meta = {
        "target": target.spec.name,
        "tokenizer_sha256": target.tokenizer_sha256,
        "vocab_size": V,
        "sources": source_meta,
        "documents": sum(s["documents"] for s in source_meta),
        "tokens": total_tokens,
        "structural_ids": first,
        "seen_ids": int((counts > 0).sum()),
        "heldout": held_info,
    }
    return counts, held, meta, timings


def run_vocab(cfg: VocabConfig, target=None, log=print) -> dict:
    langs = [get_language(code, target=cfg.target) for code in cfg.langs]
    if not cfg.sources:
        raise PolyspecError("no sources given")
    # tokenizer + config suffice
    target = target or load_target(cfg.target, device="cpu", with_model=False)
    out = Path(cfg.run) / "vocab"
    first = structural_ids(target.tokenizer, target.spec.prompt_format.stop)
    counted = {lang.code: count_language(cfg, lang, target, first) for lang in langs}
    shares = {code: c / max(c.sum(), 1) for code, (c, *_) in counted.items()}
    ranked, curves, ks_needed, held_infos, timings, with_prompt = {}, {}, {}, {}, {}, {}
    for lang in langs:
        counts, held, meta, timings[lang.code] = counted[lang.code]
        # ids unseen in this language follow its seen ids, ordered by the other languages' pooled
        # shares
        others = sum((v for k, v in shares.items() if k != lang.code), np.zeros(target.vocab_size))
        ids = rank(counts, first, tail_counts=others)
        meta["tail"] = (
            "unseen ids ordered by the pooled counts of "
            + (", ".join(k for k in shares if k != lang.code) or "no other language")
            + ", then by id"
        )
        vocab = RankedVocab(lang.code, ids, counts[ids.astype(np.int64)], meta)
        held_info = meta["heldout"]
        save_ranked(out, vocab)
        ranked[lang.code] = vocab.ranked_ids
        curves[lang.code] = coverage_curve(vocab.ranked_ids, held, cfg.coverage_ks)
        ks_needed[lang.code] = k_for_coverage(vocab.ranked_ids, held)
        held_infos[lang.code] = held_info
        c = curves[lang.code]
        extra = ""
        # the decoder's head for a request also keeps the prompt's ids
        if held_info["kind"] == "answers":
            w = with_prompt[lang.code] = prompt_coverage_curve(
                vocab.ranked_ids, heldout_answer_docs(cfg, lang, target), cfg.coverage_ks
            )
            extra = f"; with the prompt's ids 16K {w.get('16384', float('nan')):.3f}"
        log(
            f"[vocab] {lang.code}: {meta['seen_ids']} ids seen in {vocab.meta['tokens']:,} "
            "tokens; held-out "
            f"({held_info['kind']}) coverage 8K {c.get('8192', float('nan')):.3f} 16K "
            f"{c.get('16384', float('nan')):.3f} "
            f"32K {c.get('32768', float('nan')):.3f}{extra}"
        )
    write_coverage(out, curves, ks_needed, held_infos, with_prompt)
    write_overlap(out, overlap_matrix(ranked, cfg.overlap_k), cfg.overlap_k)
    sizes = [s for s in cfg.mask_sizes if all(s <= len(r) for r in ranked.values())]
    if sizes != cfg.mask_sizes:
        log(
            f"[vocab] mask sizes {sorted(set(cfg.mask_sizes) - set(sizes))} skipped: larger than "
            "a ranked list"
        )
    if sizes:
        save_masks(
            out / "language_masks.safetensors",
            build_masks(list(ranked.values()), sizes, target.vocab_size),
            list(ranked),
            sizes,
        )
    summary = {
        "languages": list(ranked),
        "target": target.spec.name,
        "tokenizer_sha256": target.tokenizer_sha256,
        "mask_sizes": sizes,
        "coverage": curves,
        "coverage_with_prompt_ids": with_prompt,
        "k_for_coverage": ks_needed,
        "heldout": held_infos,
        "timings": timings,
    }
    atomic_write_json(out / "summary.json", summary)
    return summary
