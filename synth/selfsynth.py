"""ADASPEC Algorithm 1: the target writes its own instruction data in language ℓ.

    p ← F_template(P_sys^ℓ, E^ℓ)                       (line 10; Alg. lines 2–10 for non-built-in ℓ)
    while |D| < N and attempts < budget:                (line 12)
        I ~ M(p, T=1)                                   (line 13)
        R ~ M(I, T=1)                                   (line 14)
        keep (I, R) if LID(I ⊕ R) = ℓ with prob ≥ θ     (lines 15–19)

Attempts run in fixed batches; attempt ``a`` samples with seeds derived from (run seed, a), so the
data depends only on the arguments, and a resumed run equals an uninterrupted one.
"""

from __future__ import annotations

import glob
import hashlib
import json
import random
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from polyspec.io import read_jsonl
from polyspec.languages import Language, builtin_codes, get_language, is_valid_code
from polyspec.prompts import render, render_open_turn
from synth.config import SynthConfig
from synth.engines import Engine, Request, engine_record, open_engine
from synth.filters import (
    NearDuplicates,
    check_instruction,
    check_language,
    check_response,
    dedup_keys,
    strip_leakage,
)
from synth.store import SynthStore
from synth.translate import translate_language


def derive_seed(run_seed: int, attempt: int, stream: str) -> int:
    """Per-sample seed from (run seed, attempt index, stream), stable across processes and
    resumes."""
    digest = hashlib.sha256(f"{run_seed}:{attempt}:{stream}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def instruction_prompt(target: Any, lang: Language, few_shot: int, variant: int = 0) -> str:
    """Alg. 1 line 10: system prompt and few-shot (I, R) turns, then an opened user turn. Variant 0
    shows the first ``few_shot`` seeds; variant v a sample of them drawn and ordered by seed v."""
    msgs = [{"role": "system", "content": lang.system_prompt}]
    seeds = lang.seeds[:few_shot]
    if variant:
        seeds = random.Random(variant).sample(lang.seeds, min(few_shot, len(lang.seeds)))
    for seed in seeds:
        msgs += [
            {"role": "user", "content": seed.instruction},
            {"role": "assistant", "content": seed.response},
        ]
    return render_open_turn(target.spec.prompt_format, target.tokenizer, msgs, role="user")


def response_prompt(target: Any, lang: Language, instruction: str, with_system: bool) -> str:
    """Alg. 1 line 14: the instruction alone (optionally under the language's system prompt)."""
    msgs = [{"role": "system", "content": lang.system_prompt}] if with_system else []
    msgs.append({"role": "user", "content": instruction})
    return render(target.spec.prompt_format, target.tokenizer, msgs)


def resolve_language(
    code: str, target: Any, engine: Engine, max_new_tokens: int = 256, log=print
) -> Language:
    """Built-in entry, or (Alg. 1 lines 2–10) a translation by the target, cached."""
    code = code.strip().lower()
    if code in builtin_codes() or not is_valid_code(code):
        return get_language(code)  # one-line error for invalid codes
    return translate_language(code, target, engine, max_new_tokens=max_new_tokens, log=log)


def run_selfsynth(
    cfg: SynthConfig, target: Any = None, engine: Engine | None = None, log=print
) -> dict:
    """Run (or resume) Alg. 1 until ``cfg.n`` pairs are kept or the attempt budget is spent.

    Returns the stats dict (also written to ``stats.json``); ``stats["complete"]`` tells which.
    """
    code = cfg.lang.strip().lower()
    if code not in builtin_codes() and not is_valid_code(code):
        get_language(code)  # one-line error listing the supported codes, before any model is loaded
    target, engine = open_engine(cfg.engine, cfg.target, target, engine)
    lang = resolve_language(code, target, engine, cfg.translation_max_new_tokens, log=log)
    fmt = target.spec.prompt_format
    prompts = [
        instruction_prompt(target, lang, cfg.few_shot, v) for v in range(cfg.few_shot_variants)
    ]
    threshold = (
        cfg.filters.lid_threshold if cfg.filters.lid_threshold is not None else lang.lid_threshold
    )
    out_dir = Path(cfg.run) / "synth" / lang.code
    store = SynthStore(out_dir, _args_hash(cfg, target, prompts))
    seen = _seen_keys(Path(cfg.run) / "synth", store)
    near = _near_duplicates(cfg, store)
    budget, batch = cfg.attempt_budget, cfg.engine.batch_size
    t_start, tokens_before = time.time(), store.tokens
    bar = tqdm(
        total=cfg.n,
        initial=len(store.accepted),
        desc=f"synth {lang.code}",
        unit="pair",
        dynamic_ncols=True,
    )
    while len(store.accepted) < cfg.n and store.next_attempt < budget:
        t_batch = time.perf_counter()
        attempts = list(range(store.next_attempt, min(store.next_attempt + batch, budget)))
        # line 13: I ~ M(p, T=1), one request per attempt, each with its own seed
        instr = engine.generate(
            [
                Request(
                    prompts[(a // batch) % len(prompts)],  # one variant per batch: one prefill
                    derive_seed(cfg.seed, a, "instruction"),
                    cfg.instruction.temperature,
                    cfg.instruction.top_p,
                    cfg.instruction.max_new_tokens,
                    fmt.stop,
                )
                for a in attempts
            ]
        )
        instructions = [strip_leakage(r.text, fmt.stop) for r in instr]
        # line 14: R ~ M(I, T=1) — only for instructions worth answering
        early = {
            a: check_instruction(i, r.finished, cfg.filters)
            for a, i, r in zip(attempts, instructions, instr)
        }
        to_answer = [(a, i) for a, i in zip(attempts, instructions) if early[a] is None]
        answers = engine.generate(
            [
                Request(
                    response_prompt(target, lang, i, cfg.response_with_system_prompt),
                    derive_seed(cfg.seed, a, "response"),
                    cfg.response.temperature,
                    cfg.response.top_p,
                    cfg.response.max_new_tokens,
                    fmt.stop,
                )
                for a, i in to_answer
            ]
        )
        answer_of = {a: r for (a, _), r in zip(to_answer, answers)}
        accepted, rejected, next_attempt = [], [], attempts[-1] + 1
        for a, i, ri in zip(attempts, instructions, instr):
            rr = answer_of.get(a)
            resp = strip_leakage(rr.text, fmt.stop) if rr else ""
            rec = _record(cfg, lang, target, a, i, resp, ri, rr)
            reason = early[a] or check_response(resp, rr.finished, cfg.filters)
            keys = dedup_keys(i, resp)
            if reason is None and (keys[0] in seen or keys[1] in seen):
                reason = "duplicate"
            if reason is None and near is not None and near.seen(i):
                reason = "near_duplicate"
            if reason is None:  # lines 15–19: the language-ID gate
                reason, rec["lid"] = check_language(i, resp, lang.lid_code, threshold)
                reason = reason if cfg.filters.require_language else None
            if reason is None:
                accepted.append(rec)
                seen.update(keys)
                if near is not None:
                    near.add(i)
                if len(store.accepted) + len(accepted) == cfg.n:  # line 12: stop at N kept
                    next_attempt = a + 1
                    break
            else:
                rejected.append({**rec, "reason": reason})
        store.commit(accepted, rejected, next_attempt, seconds=time.perf_counter() - t_batch)
        bar.update(len(accepted))
        bar.set_postfix(
            attempted=store.next_attempt,
            rate=f"{len(store.accepted) / max(1, store.next_attempt):.0%}",
            tok_s=f"{(store.tokens - tokens_before) / max(1e-9, time.time() - t_start):.0f}",
        )
    bar.close()
    return store.write_stats(
        {
            "lang": lang.code,
            "target": target.spec.name,
            "n": cfg.n,
            "attempt_budget": budget,
            "complete": len(store.accepted) >= cfg.n,
            "lid_threshold": threshold,
            **engine_record(cfg.engine, engine),
        }
    )


def _record(cfg, lang, target, attempt, instruction, response, ri, rr) -> dict[str, Any]:
    return {
        "id": f"{lang.code}-synth-s{cfg.seed}-{attempt:06d}",
        "lang": lang.code,
        "source": "self-synth",
        "temperature": cfg.response.temperature,
        "conversations": [
            {"from": "human", "value": instruction},
            {"from": "gpt", "value": response},
        ],
        "lid": None,
        "target": target.spec.name,
        "attempt": attempt,
        "tokens": {"instruction": ri.num_tokens, "response": rr.num_tokens if rr else 0},
        "finished": bool(rr and rr.finished),
    }


def _seen_keys(synth_root: Path, store: SynthStore) -> set[str]:
    """Dedup keys of every kept pair in this run folder (all languages, earlier runs) and this
    store."""
    seen: set[str] = set()
    recs = list(store.accepted)
    for path in glob.glob(str(synth_root / "*" / "data.jsonl")):
        if Path(path) == store.data_path:
            continue
        recs += read_jsonl(path)
    for r in recs:
        conv = r.get("conversations") or []
        if len(conv) >= 2:
            seen.update(dedup_keys(conv[0]["value"], conv[1]["value"]))
    return seen


def _near_duplicates(cfg: SynthConfig, store: SynthStore) -> NearDuplicates | None:
    """The near-duplicate index over the instructions this store kept (None when off)."""
    if cfg.filters.near_duplicate is None:
        return None
    near = NearDuplicates(cfg.filters.near_duplicate)
    for r in store.accepted:
        near.add(r["conversations"][0]["value"])
    return near


def _args_hash(cfg: SynthConfig, target: Any, prompts: list[str]) -> str:
    """What determines the data: a resume with other values would mix two runs."""
    relevant = cfg.model_dump(
        include={
            "seed",
            "few_shot",
            "response_with_system_prompt",
            "instruction",
            "response",
            "filters",
        }
    )
    if relevant["filters"]["near_duplicate"] is None:  # off: the hash of earlier runs
        del relevant["filters"]["near_duplicate"]
    if cfg.few_shot_variants > 1:
        relevant["few_shot_variants"] = cfg.few_shot_variants
    relevant.update(
        batch_size=cfg.engine.batch_size,
        engine=cfg.engine.name,
        # one prompt: the hash of runs made before the variants existed
        prompt=prompts[0] if len(prompts) == 1 else prompts,
        tokenizer=target.tokenizer_sha256,
        target=target.spec.name,
    )
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]
