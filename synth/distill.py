"""Self-distillation (seed 004, Appendix F.2): the target answers given prompts at several temperatures
(default 0, 0.3, 0.7, 1.0) so a drafter learns the target's own output distribution.

Prompts come from a jsonl file (``{"instruction": …}`` or ShareGPT ``conversations``, e.g. a synth
``data.jsonl``), from an HF dataset when online, or from ``seeds``: the built-in language seeds. With
``continuation: true`` the target continues raw text (no prompt format): the offline pretraining corpus
for small-LM drafters. Output: ``<run>/synth/<lang>-<out_name>/`` with the synth schema and
``source: self-distill`` (plus ``text`` = prompt + continuation in continuation mode).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from polyspec.errors import PolyspecError, first_line
from polyspec.io import read_jsonl
from polyspec.languages import get_language
from polyspec.lid import identify
from polyspec.prompts import render
from synth.config import DistillConfig
from synth.engines import Engine, Request, open_engine
from synth.filters import strip_leakage
from synth.selfsynth import derive_seed
from synth.store import SynthStore


def load_prompts(cfg: DistillConfig) -> list[str]:
    """The prompt texts, in a stable order."""
    src = cfg.prompts
    if src == "seeds":
        lang = get_language(cfg.lang)
        if cfg.continuation:  # openings of every seed text: varied starting points for free text
            texts = [lang.system_prompt] + [t for s in lang.seeds for t in (s.instruction, s.response)]
            prompts = [_opening(t) for t in texts] + texts
        else:
            prompts = [s.instruction for s in lang.seeds]
    elif Path(src).is_file():
        prompts = [p for p in (_prompt_of(rec, cfg.prompt_field) for rec in read_jsonl(src, strict=True)) if p]
    elif "/" in src:  # an HF dataset id (online users)
        prompts = _hf_prompts(src, cfg)
    else:
        raise PolyspecError(f"prompts {src!r}: not a file, 'seeds', or an HF dataset id (org/name)")
    if not prompts:
        raise PolyspecError(f"no prompts found in {src!r}")
    return prompts[: cfg.limit] if cfg.limit else prompts


def run_distill(cfg: DistillConfig, target: Any = None, engine: Engine | None = None) -> dict:
    lang = get_language(cfg.lang)
    prompts = load_prompts(cfg)
    target, engine = open_engine(cfg.engine, cfg.target, target, engine)
    fmt = target.spec.prompt_format
    temps = cfg.temperatures
    out_dir = Path(cfg.run) / "synth" / f"{lang.code}-{cfg.out_name}"
    args = {**cfg.model_dump(include={"seed", "temperatures", "continuation", "sampling"}),
            "prompts": hashlib.sha256("\x00".join(prompts).encode()).hexdigest(), "batch": cfg.engine.batch_size,
            "tokenizer": target.tokenizer_sha256}
    store = SynthStore(out_dir, hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:16])
    total = len(prompts) * len(temps)  # attempt a = prompt index * len(temps) + temperature index
    stop = [] if cfg.continuation else fmt.stop
    bar = tqdm(total=total, initial=store.next_attempt, desc=f"distill {lang.code}", unit="sample", dynamic_ncols=True)
    while store.next_attempt < total:
        t_batch = time.perf_counter()
        attempts = list(range(store.next_attempt, min(store.next_attempt + cfg.engine.batch_size, total)))
        reqs = []
        for a in attempts:
            p, t = prompts[a // len(temps)], temps[a % len(temps)]
            text = p if cfg.continuation else render(fmt, target.tokenizer, [{"role": "user", "content": p}])
            reqs.append(Request(text, derive_seed(cfg.seed, a, "distill"), t, cfg.sampling.top_p,
                                cfg.sampling.max_new_tokens, stop))
        accepted, rejected = [], []
        for a, r in zip(attempts, engine.generate(reqs)):
            p, t = prompts[a // len(temps)], temps[a % len(temps)]
            resp = r.text.strip() if cfg.continuation else strip_leakage(r.text, fmt.stop)
            label, prob = identify(p + "\n" + resp)
            rec = {
                "id": f"{lang.code}-distill-s{cfg.seed}-{a // len(temps):06d}-t{t:g}",
                "lang": lang.code,
                "source": "self-distill",
                "temperature": t,
                "conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": resp}],
                "lid": {"label": label, "prob": round(prob, 4)},
                "target": target.spec.name,
                "attempt": a,
                "tokens": {"instruction": 0, "response": r.num_tokens},
                "finished": r.finished,
            }
            if cfg.continuation:
                rec["text"] = p + r.text
            (accepted if resp else rejected).append(rec if resp else {**rec, "reason": "empty_response"})
        store.commit(accepted, rejected, attempts[-1] + 1, seconds=time.perf_counter() - t_batch)
        bar.update(len(attempts))
    bar.close()
    return store.write_stats({"lang": lang.code, "target": target.spec.name, "prompts": len(prompts),
                              "temperatures": temps, "complete": True})


def _opening(text: str, words: int = 6) -> str:
    """First few words (or characters, for scripts without spaces) of a text."""
    parts = text.split()
    return " ".join(parts[:words]) if len(parts) > 3 else text[: max(4, len(text) // 4)]


def _prompt_of(rec: dict, field: str) -> str | None:
    if isinstance(rec.get(field), str):
        return rec[field]
    for turn in rec.get("conversations") or []:
        if turn.get("from") in ("human", "user"):
            return turn.get("value")
    return None


def _hf_prompts(name: str, cfg: DistillConfig) -> list[str]:
    """Stream prompts from an HF dataset (online); the first ``limit`` (default 1000) records."""
    from datasets import load_dataset

    try:
        ds = load_dataset(name, split="train", streaming=True)
    except Exception as e:  # noqa: BLE001 - any hub/network failure becomes one line
        raise PolyspecError(f"cannot load dataset {name!r}: {first_line(e)}") from None
    out = []
    for rec in ds:
        p = _prompt_of(rec, cfg.prompt_field)
        if p:
            out.append(p)
        if len(out) >= (cfg.limit or 1000):
            break
    return out
