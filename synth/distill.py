"""Self-distillation (Yi et al. 2024, Appendix F.2): the target answers given prompts at several
temperatures (default 0, 0.3, 0.7, 1.0) so a drafter learns the target's own output distribution.

Prompts come from a jsonl file (``{"instruction": …}`` or ShareGPT ``conversations``, e.g. a synth
``data.jsonl``), from an HF dataset when online, or from ``seeds``: the built-in language seeds.
With ``continuation: true`` the target continues raw text (no prompt format): the offline
pretraining corpus for small-LM drafters. Output: ``<run>/synth/<lang>-<out_name>/`` with the synth
schema and ``source: self-distill`` (plus ``text`` = prompt + continuation in continuation mode).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from polyspec.errors import PolyspecError, first_line
from polyspec.features import disk_bytes, write_shard
from polyspec.io import read_jsonl
from polyspec.languages import get_language
from polyspec.lid import identify
from polyspec.prompts import render
from polyspec.targets import eagle3_layers
from synth.config import DistillConfig
from synth.engines import Engine, Request, engine_record, open_engine
from synth.filters import strip_leakage
from synth.selfsynth import derive_seed
from synth.store import SynthStore


def load_prompts(cfg: DistillConfig) -> list:
    """The prompts in a stable order: message lists (``[{"role": "user", "content": …}, …]``), or
    plain texts in continuation mode. ``pool``: the language's broad prompt pool (synth/pool.py);
    ``heldout``: its held-out prompts (never trained on: the training score and coverage read their
    greedy answers); ``heldout-chat``: its chat held-out prompts (synth/data/heldout-chat.jsonl,
    never trained on either), every user turn of each, answered in order."""
    src = cfg.prompts
    if src in ("pool", "heldout", "heldout-chat") and not cfg.continuation:
        from synth.pool import build_pool, load_heldout, load_heldout_chat

        if src == "pool":
            prompts = build_pool(cfg.lang, cfg.run, limit=cfg.limit, corpus=cfg.corpus_prompts)
        elif src == "heldout":
            prompts = [[{"role": "user", "content": r["turns"][0]}] for r in load_heldout(cfg.lang)]
        else:
            prompts = [
                [{"role": "user", "content": t} for t in r["turns"]]
                for r in load_heldout_chat(cfg.lang)
            ]
        if not prompts:
            raise PolyspecError(f"no {src} prompts for language {cfg.lang!r}")
        return prompts[: cfg.limit] if cfg.limit else prompts
    if src == "seeds":
        lang = get_language(cfg.lang)
        if cfg.continuation:  # openings of every seed text: varied starting points for free text
            texts = [lang.system_prompt] + [
                t for s in lang.seeds for t in (s.instruction, s.response)
            ]
            prompts = [_opening(t) for t in texts] + texts
        else:
            prompts = [s.instruction for s in lang.seeds]
    elif Path(src).is_file():
        recs = read_jsonl(src, strict=True)
        if not cfg.continuation and recs and all(isinstance(r.get("turns"), list) for r in recs):
            # a prompt set (synth/prompt_set.py: {id, kind, category, turns}): every user turn
            prompts = [[{"role": "user", "content": t} for t in r["turns"]] for r in recs]
            return prompts[: cfg.limit] if cfg.limit else prompts
        prompts = [p for p in (_prompt_of(rec, cfg.prompt_field) for rec in recs) if p]
    elif "/" in src:  # an HF dataset id (online users)
        prompts = _hf_prompts(src, cfg)
    else:
        raise PolyspecError(f"prompts {src!r}: not a file, 'seeds', or an HF dataset id (org/name)")
    if not prompts:
        raise PolyspecError(f"no prompts found in {src!r}")
    prompts = prompts[: cfg.limit] if cfg.limit else prompts
    return prompts if cfg.continuation else [[{"role": "user", "content": p}] for p in prompts]


def run_distill(cfg: DistillConfig, target: Any = None, engine: Engine | None = None) -> dict:
    """The target's answers to every prompt at every temperature, committed batch by batch into
    ``<run>/synth/<lang>-<out_name>/`` (a rerun resumes); the session's stats."""
    lang = get_language(cfg.lang)
    prompts = load_prompts(cfg)
    target, engine = open_engine(
        cfg.engine, cfg.target, target, engine, need_model=cfg.capture_features
    )
    fmt = target.spec.prompt_format
    temps = cfg.temperatures
    out_dir = Path(cfg.run) / "synth" / f"{lang.code}-{cfg.out_name}"
    aux = eagle3_layers(target.num_layers) if cfg.feature_layers == "eagle3" else []
    store = SynthStore(out_dir, _args_hash(cfg, prompts, target, aux))
    meta = {
        "target": target.spec.name,
        "tokenizer": target.tokenizer_sha256,
        "aux_layers": json.dumps(aux or None),
    }
    capture = cfg.capture_features
    total = len(prompts) * len(temps)  # attempt a = prompt index * len(temps) + temperature index
    stop = [] if cfg.continuation else fmt.stop
    wall = time.perf_counter()
    bar = tqdm(
        total=total,
        initial=store.next_attempt,
        desc=f"distill {lang.code}",
        unit="sample",
        dynamic_ncols=True,
    )
    histories = _EarlierTurns(engine, target, prompts, temps, cfg, stop, total)
    while store.next_attempt < total:
        t_batch = time.perf_counter()
        attempts = _next_attempts(cfg, store, total)
        asked = {a: prompts[a // len(temps)] for a in attempts}
        earlier_nll: dict[int, list] = {}
        # multi-turn: the target's own answers to the earlier turns become the history
        if not cfg.continuation:
            asked, earlier_nll = histories.get(attempts)
        reqs = _requests(cfg, target, attempts, asked, stop)
        results = engine.generate(reqs, capture=aux if capture else None)
        shard = f"features/a{attempts[0]:07d}.safetensors"
        accepted, rejected, rows = _sort_results(
            cfg, lang, target, attempts, asked, earlier_nll, results, capture, shard
        )
        # the shard lands before the records that name it (a resume rewrites it)
        if rows and not _write_features(cfg, lang, out_dir, shard, rows, meta, accepted):
            capture = False
        store.commit(accepted, rejected, attempts[-1] + 1, seconds=time.perf_counter() - t_batch)
        bar.update(len(attempts))
        if _out_of_time(cfg, lang, store, total, wall):
            break
    bar.close()
    stats = store.write_stats(
        {
            "lang": lang.code,
            "target": target.spec.name,
            "prompts": len(prompts),
            "temperatures": temps,
            "complete": store.next_attempt >= total,
            "feature_bytes": disk_bytes(out_dir),
            "wall_seconds_this_session": round(time.perf_counter() - wall, 1),
            **engine_record(cfg.engine, engine),
        }
    )
    _print_summary(lang, stats, out_dir)
    return stats


def _args_hash(cfg: DistillConfig, prompts: list, target: Any, aux: list[int]) -> str:
    """The store's key: a hash of the settings and prompts that decide the records."""
    args = {
        **cfg.model_dump(
            include={
                "seed",
                "temperatures",
                "continuation",
                "sampling",
                "capture_features",
                "lid_filter",
            }
        ),
        "prompts": hashlib.sha256(json.dumps(prompts, sort_keys=True).encode()).hexdigest(),
        "batch": cfg.engine.batch_size,
        "per_commit": cfg.batches_per_commit,
        "tokenizer": target.tokenizer_sha256,
    }
    if cfg.capture_features:
        args["aux_layers"] = aux
    return hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:16]


def _next_attempts(cfg: DistillConfig, store: SynthStore, total: int) -> list[int]:
    """The attempts of the next commit, from the store's next one."""
    # one engine call per commit: its rows are refilled from its waiting prompts (continuous
    # batching)
    return list(
        range(
            store.next_attempt,
            min(store.next_attempt + cfg.engine.batch_size * cfg.batches_per_commit, total),
        )
    )


def _requests(
    cfg: DistillConfig, target: Any, attempts: list[int], asked: dict, stop: list[str]
) -> list[Request]:
    """One engine request per attempt: its prompt at its temperature with its own seed."""
    fmt, temps = target.spec.prompt_format, cfg.temperatures
    reqs = []
    for a in attempts:
        p, t = asked[a], temps[a % len(temps)]
        text = p if cfg.continuation else render(fmt, target.tokenizer, p)
        reqs.append(
            Request(
                text,
                derive_seed(cfg.seed, a, "distill"),
                t,
                cfg.sampling.top_p,
                cfg.sampling.max_new_tokens,
                stop,
            )
        )
    return reqs


def _sort_results(
    cfg: DistillConfig,
    lang,
    target: Any,
    attempts: list[int],
    asked: dict,
    earlier_nll: dict[int, list],
    results: list,
    capture: bool,
    shard: str,
) -> tuple[list[dict], list[dict], dict]:
    """The batch's accepted and rejected records, and the accepted ones' features by record id."""
    accepted, rejected, rows = [], [], {}
    for a, r in zip(attempts, results):
        rec, reason = _record(cfg, lang, target, a, asked[a], r, earlier_nll)
        if reason:
            rejected.append({**rec, "reason": reason})
            continue
        if capture and r.features is not None:
            rows[rec["id"]] = {"ids": r.ids, "start": r.prompt_tokens, **r.features}
            rec["features_file"] = shard
        accepted.append(rec)
    return accepted, rejected, rows


def _record(
    cfg: DistillConfig, lang, target: Any, a: int, p, r, earlier_nll: dict[int, list]
) -> tuple[dict, str | None]:
    """Attempt ``a``'s synth record and why it is rejected (None: it is kept)."""
    fmt, temps = target.spec.prompt_format, cfg.temperatures
    t = temps[a % len(temps)]
    resp = r.text.strip() if cfg.continuation else strip_leakage(r.text, fmt.stop)
    question = p if cfg.continuation else p[-1]["content"]
    label, prob = identify(question + "\n" + resp)
    rec = {
        "id": f"{lang.code}-distill-s{cfg.seed}-{a // len(temps):06d}-t{t:g}",
        "lang": lang.code,
        "source": "self-distill",
        "temperature": t,
        "conversations": _conversation(p, resp, cfg.continuation, [*earlier_nll.get(a, []), r.nll]),
        "lid": {"label": label, "prob": round(prob, 4)},
        "target": target.spec.name,
        "attempt": a,
        "tokens": {"instruction": 0, "response": r.num_tokens},
        "finished": r.finished,
    }
    if cfg.continuation:
        rec["text"] = p + r.text
    reason = None if resp else "empty_response"
    # greedy answers are the decoder's own path (math, code, loops in any script): kept
    # whatever their language
    if reason is None and cfg.lid_filter and not cfg.continuation and t > 0:
        reason = _off_language(lang, question, resp)
    return rec, reason


def _write_features(
    cfg: DistillConfig,
    lang,
    out_dir: Path,
    shard: str,
    rows: dict,
    meta: dict,
    accepted: list[dict],
) -> bool:
    """The batch's feature shard, or (past ``max_feature_gb``) none: capture stops and the
    records lose their ``features_file``; whether it was written."""
    used = disk_bytes(out_dir)
    if used > cfg.max_feature_gb * 2**30:
        tqdm.write(
            f"distill {lang.code}: features use {used / 2**30:.1f} GB > max_feature_gb "
            f"{cfg.max_feature_gb}: capture stops, records go on"
        )
        for rec in accepted:
            rec.pop("features_file", None)
        return False
    write_shard(out_dir / shard, rows, meta)
    return True


def _out_of_time(cfg: DistillConfig, lang, store: SynthStore, total: int, wall: float) -> bool:
    """Whether ``max_seconds`` has passed with attempts left (said on the console)."""
    if (
        cfg.max_seconds is not None
        and time.perf_counter() - wall > cfg.max_seconds
        and store.next_attempt < total
    ):
        tqdm.write(
            f"distill {lang.code}: max_seconds {cfg.max_seconds:g} passed at attempt "
            f"{store.next_attempt:,} "
            f"of {total:,}: stopping here (a rerun goes on)"
        )
        return True
    return False


def _print_summary(lang, stats: dict, out_dir: Path) -> None:
    """The session's one-line summary on the console."""
    tqdm.write(
        f"distill {lang.code}: {stats['accepted']} records, {stats['tokens']} tokens at "
        f"{stats['tokens_per_second']} tok/s (generation {stats['seconds']} s), features "
        f"{stats['feature_bytes'] / 2**20:.0f} MB in {out_dir}"
    )


class _EarlierTurns:
    """The histories of multi-turn attempts, answered a window of ``WINDOW_BATCHES`` batches at a
    time.

    A multi-turn prompt is one pool prompt in ~9 (2 attempts in ~17), so per batch its earlier turns
    were a forward of 1–3 rows for up to max_new_tokens steps: on the AVX2 host ~12 s of a ~60 s
    batch of 32 (cProfile, vi pool) for ~1 % of the tokens. A window's multi-turn attempts are
    answered together instead; windows are fixed spans of attempt ids, so a resumed run answers
    exactly the batches an uninterrupted one does."""

    WINDOW_BATCHES = 16

    def __init__(
        self, engine, target, prompts: list, temps: list[float], cfg, stop: list[str], total: int
    ):
        self.engine, self.target, self.prompts, self.temps, self.cfg, self.stop = (
            engine,
            target,
            prompts,
            temps,
            cfg,
            stop,
        )
        self.total, self.window = total, cfg.engine.batch_size * self.WINDOW_BATCHES
        self.asked: dict[int, list] = {}
        self.nlls: dict[int, list] = {}
        self.done: set[int] = set()

    def prompt(self, a: int) -> list:
        # attempt a = prompt index * len(temps) + temperature index
        return self.prompts[a // len(self.temps)]

    def get(self, attempts: list[int]) -> tuple[dict, dict]:
        for w in sorted({a // self.window for a in attempts} - self.done):
            span = range(w * self.window, min((w + 1) * self.window, self.total))
            multi = {a: self.prompt(a) for a in span if len(self.prompt(a)) > 1}
            if multi:
                asked, nlls = _answer_earlier_turns(
                    self.engine, self.target, multi, self.temps, self.cfg, self.stop
                )
                self.asked.update(asked)
                self.nlls.update(nlls)
            self.done.add(w)
        asked = {a: self.asked.pop(a, self.prompt(a)) for a in attempts}
        return asked, {a: self.nlls.pop(a) for a in attempts if a in self.nlls}


def _answer_earlier_turns(
    engine, target, asked: dict, temps: list[float], cfg, stop: list[str]
) -> tuple[dict, dict]:
    """Prompts with several user turns (synth/pool.py multiturn): each earlier turn is answered by
    the target at the attempt's temperature (its own seed stream) and put into the history before
    the next turn."""
    fmt, out = target.spec.prompt_format, {}
    todo = {a: list(p) for a, p in asked.items()}
    history = {a: [] for a in asked}
    # each generated earlier answer's NLL (Result.nll)
    nlls: dict[int, list] = {a: [] for a in asked}
    while True:
        pending = [a for a, p in todo.items() if len(p) > 1]
        if not pending:
            break
        reqs = []
        for a in pending:
            msgs = history[a] + [todo[a][0]]
            reqs.append(
                Request(
                    render(fmt, target.tokenizer, msgs),
                    derive_seed(cfg.seed, a, f"turn{len(history[a])}"),
                    temps[a % len(temps)],
                    cfg.sampling.top_p,
                    cfg.sampling.max_new_tokens,
                    stop,
                )
            )
        for a, r in zip(pending, engine.generate(reqs)):
            history[a] += [
                todo[a].pop(0),
                {"role": "assistant", "content": strip_leakage(r.text, fmt.stop)},
            ]
            nlls[a].append(r.nll)
    for a, p in todo.items():
        out[a] = history[a] + p
    return out, nlls


def _conversation(p, resp: str, continuation: bool, nlls: list | None = None) -> list[dict]:
    """ShareGPT turns: every message asked (multi-turn prompts carry earlier turns) + the target's
    answer. ``nlls``: the generated gpt turns' NLLs in order (the target's own answers); each gpt
    turn the target wrote carries its ``nll`` (mean per token, given the conversation before it)
    when the engine gave one."""
    if continuation:
        turns = [{"from": "human", "value": p}, {"from": "gpt", "value": resp}]
    else:
        turns = [
            {"from": "human" if m["role"] == "user" else "gpt", "value": m["content"]}
            for m in p
            if m["role"] != "system"
        ] + [{"from": "gpt", "value": resp}]
    gpt = [t for t in turns if t["from"] == "gpt"]
    # the last len(nlls) gpt turns are generated
    for t, v in zip(gpt[len(gpt) - len(nlls or []) :], nlls or []):
        if v is not None:
            t["nll"] = round(float(v), 5)
    return turns


def _off_language(lang, asked: str, resp: str) -> str | None:
    """An answer confidently in another language to a prompt in the language (a request to translate
    into another language is asked in the language but answered in the other: its prompt names that
    language and stays unfiltered only through the LID of the prompt's first line, which is the
    instruction)."""
    if len(resp) < 24:
        return None
    p_label, _ = identify(asked)
    label, prob = identify(resp)
    if (
        p_label == lang.lid_code
        and label != lang.lid_code
        and prob >= lang.lid_threshold
        and not _is_translation(asked)
    ):
        return f"lid_{label}"
    return None


def _is_translation(asked: str) -> bool:
    head = asked.split(":")[0].lower()
    return any(w in head for w in ("transl", "übersetz", "tradu", "dịch", "翻訳", "翻译", "訳"))


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
