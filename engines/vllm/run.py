"""The vLLM check's runs (``python -m engines.vllm``, ``make check-vllm``): polyspec's drafters
served by vLLM's offline ``LLM``, one engine per mode, on the held-out prompts.

**What runs.** One vLLM engine per mode (:mod:`polyspec.vllm_process`: vLLM's environment,
``make setup-vllm``), greedy, on the held-out prompts (``synth/data/heldout.jsonl``, first turn,
rendered and tokenized by polyspec as every engine gets them: vLLM receives the token ids):

- ``plain``: the target alone. Its engine stays up for the whole bench: it runs first, again at
  batch 1 after every other mode (``plain_again``: the drift of the machine over the bench), and
  answers the margin probes.
- ``ngram``: vLLM's prompt lookup (``method: ngram``, ``--ngram-k`` drafts, n-grams of ``--ngram-n``
  down to 1).
- ``eagle3@k``: each speculators-format EAGLE-3 folder (``--drafters``: an engines export's
  ``speculators/``, the folders themselves, or a bundle, exported first) at every draft length of
  ``--sweep``: a language's drafter on that language's prompts, the multilingual one on each of its
  languages.
- ``draft@k``: each small-LM drafter of ``--draft-models``
  (``python -m export --format hf-assistant``'s folders) as vLLM's ``draft_model`` method.
- ``hybrid-m<m>@d``: each EAGLE-3 drafter with polyspec's vLLM plugin's ``hybrid``
  (``plugins/vllm``): per request and step, prompt lookup's ``--ngram-k`` drafts where the context's
  last ``m`` … max(m, n_max) tokens recur, else the drafter's ``d``. ``--hybrid-min auto`` (the
  default): after the sweep, ``m`` calibrated from this run's curves (:mod:`engines.vllm.calibrate`:
  prompt lookup's acceptance by match length on plain's answers against the drafter's α and step
  cost), ``d`` the chosen ``draft_n``, n_max ``HYBRID_N_MAX``; else every ``--hybrid-min`` ×
  ``--hybrid-drafter``. Its drafter folder is ``<out>/hybrid/<drafter>-m<m>-d<d>/``: links to the
  drafter's files and the plugin's ``polyspec_vllm.json``.

The prompts: the first ``--prompts`` held-out prompts of each language, or ``--questions FILE``
(the decoder bench's question files, :mod:`decoder.bench.questions`: users bench their own prompts).

Every mode runs at each batch size of ``--batch``: the prompts in groups of that size, one
``generate`` call per group (batch 1: one prompt at a time). A mode vLLM refuses (an EAGLE-3 drafter
for a target whose vLLM model has no EAGLE-3 support: Gemma-3 in vLLM 0.32) is recorded with vLLM's
own error line and the bench goes on.

**What is measured.** tok/s = generated tokens / seconds of vLLM's ``generate`` calls (after one
warm-up call); speedup = a mode's tok/s / plain's at the same batch size. vLLM's own counters
(``disable_log_stats=False``): ``drafts`` (verification steps that carried drafts),
``draft_tokens``, ``accepted`` and ``accepted_per_pos``; α_i = accepted_per_pos[i] / drafts (the
share of steps whose first i drafts were kept, polyspec's α_i), tokens per step = 1 + accepted /
drafts (vLLM's mean acceptance length). ``identical``: a mode's token ids equal plain's at the same
batch size; the first divergent position's ``margin`` = plain's logprob of its own token − of the
mode's token there (the plain engine asked for its top 5 after the common prefix): in bf16 a
verification of k + 1 tokens rounds otherwise than a one-token decode, so near-ties flip (fp32:
identity is required, exit status 1 otherwise).

The bench writes ``<out>/vllm.json``, ``<out>/vllm.md`` (:mod:`engines.vllm.report`) and each
engine's log under ``<out>/logs/``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.common import bench_plan, heldout_prompts, resolve_drafters
from engines.vllm.report import (
    DEFINITIONS,
    batch_schedule,
    best_measured,
    choose_length,
    polyspec_alpha,
    round_or_none,
    summarize_run,
    write,
    write_engines,
)
from engines.vllm.serve import hybrid_folder, plugin_folder
from export.interop import check_speculators
from polyspec.device import host_kind
from polyspec.errors import PolyspecError
from polyspec.heldout import load_heldout
from polyspec.io import read_json_or_none
from polyspec.vllm_process import VLLMProcess, vllm_python

TOP_LOGPROBS = 5
HYBRID_N_MAX = 6  # the longest suffix the calibrated hybrid matches
SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
    "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos",
}

# vLLM 0.32 on CPU: a start-up that loads a torch.compile artifact another engine cached can fail
# ("'function' object has no attribute 'finalize_loading'") and overflow the stack recompiling; a
# retry compiles afresh (evidence:
# docs/experiments.md#vllm-for-real-on-the-amd-epyc-zen-4-host-the-chat-drafter-from-a-fresh-clone-every-draft-length-and-the-compile-cache-failure-2026-12-02-code-5335322)  # noqa: E501
NO_COMPILE_CACHE = {"VLLM_DISABLE_COMPILE_CACHE": "1"}


@dataclass
class Settings:
    n: int = 128  # max new tokens
    prompts: int = 24  # held-out prompts per language
    sweep: tuple[int, ...] = (1, 2, 3, 4)
    batches: tuple[int, ...] = (1, 16)
    dtype: str = "float32"
    ngram_k: int = 3
    ngram_n: int = 3
    # vLLM's enforce_eager: no torch.compile (start-up ~30 s instead of ~2 min; slower steps)
    eager: bool = False
    k_max: int = 8  # longest draft length the choice considers
    # polyspec's hybrid (the vLLM plugin): calibrated (engines.vllm.calibrate: m from this run's
    # curves, the drafter at its draft_n), or these shortest n-gram matches × drafter lengths
    hybrid_auto: bool = True
    hybrid_min: tuple[int, ...] = ()
    hybrid_drafter: tuple[int, ...] = (2,)
    questions: str | None = None  # question files instead of the held-out prompts
    # groups of several prompts mix languages (:func:`prompt_groups`); else one language a group
    mixed: bool = False
    hybrid_for: tuple[str, ...] = ()  # the drafters the calibrated hybrid runs for (empty: all)


@dataclass
class Mode:
    name: str  # plain | ngram | eagle3@k | draft@k
    drafter: str | None
    langs: list[str]
    speculative_config: dict | None = None
    runs: dict[int, dict] = field(default_factory=dict)  # batch size → run


# ------------------------------------------------------------------------------------------ running


def prompt_rows(target, langs: list[str], k: int, questions: str | None = None) -> list[dict]:
    """The first ``k`` held-out prompts of each language (or of ``questions``, question files) as
    the engines get them: polyspec's rendering and ids."""
    from polyspec.prompts import encode, render

    fmt = target.spec.prompt_format
    rows = []
    for lang in langs:
        for q in heldout_prompts(lang, k) if questions is None else _questions(questions, lang, k):
            text = render(fmt, target.tokenizer, [{"role": "user", "content": q["turns"][0]}])
            rows.append(
                {
                    "id": q["id"],
                    "lang": lang,
                    "category": q["category"],
                    "ids": encode(fmt, target.tokenizer, text),
                }
            )
    return rows


def _questions(path: str, lang: str, k: int) -> list[dict]:
    """The first ``k`` questions of ``lang`` in question files, shaped as held-out prompts."""
    from decoder.bench.questions import read_question_files, select_questions

    qs = select_questions(read_question_files(path), [lang], source=path)[:k]
    return [
        {"id": str(q["question_id"]), "category": q["category"], "turns": q["turns"]} for q in qs
    ]


def spec_counters(metrics: dict) -> dict:
    got = {k: metrics.get(name, 0) for k, name in SPEC_COUNTERS.items()}
    got["accepted_per_pos"] = list(got["accepted_per_pos"] or [])
    return got


def counter_delta(after: dict, before: dict) -> dict:
    pos = [
        a - (before["accepted_per_pos"][i] if i < len(before["accepted_per_pos"]) else 0)
        for i, a in enumerate(after["accepted_per_pos"])
    ]
    return {
        **{k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")},
        "accepted_per_pos": pos,
    }


def prompt_groups(rows: list[dict], batch: int, mixed: bool) -> list[list[dict]]:
    """The ``generate`` calls of a pass: each language's prompts in groups of ``batch``; or, mixed,
    the languages taken in turn (vi, de, ja, vi, …) so that every group of more than one prompt
    mixes them (ADASPEC per request: one server, requests of several languages in one batch)."""
    by_lang = {
        lang: [r for r in rows if r["lang"] == lang]
        for lang in dict.fromkeys(r["lang"] for r in rows)
    }
    if not mixed:
        return [m[i : i + batch] for m in by_lang.values() for i in range(0, len(m), batch)]
    turns = [
        r
        for i in range(max(map(len, by_lang.values())))
        for m in by_lang.values()
        for r in m[i : i + 1]
    ]
    return [turns[i : i + batch] for i in range(0, len(turns), batch)]


def _sum(a: dict | None, b: dict) -> dict:
    """Two groups' speculative counters together."""
    if a is None:
        return b
    n = max(len(a["accepted_per_pos"]), len(b["accepted_per_pos"]))
    pos = [
        (a["accepted_per_pos"][i] if i < len(a["accepted_per_pos"]) else 0)
        + (b["accepted_per_pos"][i] if i < len(b["accepted_per_pos"]) else 0)
        for i in range(n)
    ]
    return {
        **{k: a[k] + b[k] for k in ("drafts", "draft_tokens", "accepted")},
        "accepted_per_pos": pos,
    }


def run_pass(
    engine: VLLMProcess, rows: list[dict], params: dict, batch: int, mixed: bool = False
) -> dict:
    """All ``rows`` through ``engine`` in ``generate`` calls of ``batch`` prompts
    (:func:`prompt_groups`), each request tagged with its language (``extra_args.lang``: the
    plugin's per-request drafters read it, vLLM ignores it otherwise): outputs by prompt id,
    tokens and seconds, vLLM's speculative counters over the pass — per language too where a group
    holds one language (a mixed group's seconds are split by its tokens, its counters kept under
    ``mixed``)."""
    start = spec_counters(engine.metrics())
    outputs, seconds, spec = {}, {}, {}
    for group in prompt_groups(rows, batch, mixed):
        before = spec_counters(engine.metrics())
        got, sec = engine.generate(
            [r["ids"] for r in group],
            [{**params, "extra_args": {"lang": r["lang"]}} for r in group],
        )
        outputs.update({r["id"]: o["token_ids"] for r, o in zip(group, got)})
        langs = {r["lang"] for r in group}
        made = sum(len(o["token_ids"]) for o in got) or 1
        for r, o in zip(group, got):
            seconds[r["lang"]] = seconds.get(r["lang"], 0.0) + sec * len(o["token_ids"]) / made
        key = next(iter(langs)) if len(langs) == 1 else "mixed"
        spec[key] = _sum(spec.get(key), counter_delta(spec_counters(engine.metrics()), before))
    return _totals(
        {
            "outputs": outputs,
            "seconds_by_lang": seconds,
            "spec": counter_delta(spec_counters(engine.metrics()), start),
            "spec_by_lang": spec,
        },
        rows,
    )


def _totals(run: dict, rows: list[dict]) -> dict:
    tokens = sum(len(run["outputs"][r["id"]]) for r in rows)
    seconds = sum(run["seconds_by_lang"].values())
    return {
        **run,
        "tokens": tokens,
        "seconds": seconds,
        "tok_s": tokens / seconds if seconds else None,
    }


def run_mode(
    engine: VLLMProcess,
    rows: list[dict],
    params: dict,
    batches: tuple[int, ...],
    mixed: bool = False,
) -> dict[int, dict]:
    # warm-up: first-call costs stay out
    engine.generate([rows[0]["ids"]], [{**params, "max_tokens": 8}])
    return {b: run_pass(engine, rows, params, b, mixed) for b in batches}


def prefill_seconds(engine: VLLMProcess, rows: list[dict], params: dict) -> float:
    """Seconds of one-token generations of every prompt, one at a time: the prompts' prefill in a
    batch-1 pass."""
    return sum(engine.generate([r["ids"]], [{**params, "max_tokens": 1}])[1] for r in rows)


def margin_at(
    engine: VLLMProcess, prompt: list[int], prefix: list[int], own: int, other: int
) -> dict:
    """Plain's logprob of its own token − of ``other`` after ``prompt + prefix`` (``other`` outside
    its top 5: at least own − the 5th)."""
    got, _ = engine.generate(
        [prompt + prefix], [{"temperature": 0, "max_tokens": 1, "logprobs": TOP_LOGPROBS}]
    )
    lps = dict((int(t), lp) for t, lp in (got[0]["logprobs"] or [[]])[0])
    if own not in lps:
        return {"margin": None, "note": "plain's own token is not in its top logprobs"}
    if other in lps:
        return {"margin": round(lps[own] - lps[other], 4)}
    return {"margin": round(lps[own] - min(lps.values()), 4), "at_least": True}


def compare(plain: dict[str, list[int]], got: dict[str, list[int]]) -> dict[str, dict]:
    """Per prompt: identical, or the first divergent position and both tokens there."""
    out = {}
    for pid, toks in got.items():
        ref = plain[pid]
        i = next((j for j, (a, b) in enumerate(zip(ref, toks)) if a != b), min(len(ref), len(toks)))
        same = toks == ref
        out[pid] = (
            {"identical": same}
            if same
            else {
                "identical": False,
                "at": i,
                "plain": ref[i] if i < len(ref) else None,
                "mode": toks[i] if i < len(toks) else None,
            }
        )
    return out


# -------------------------------------------------------------------------------------------- bench


def engine_args(model: str, s: Settings, max_len: int) -> dict:
    return {
        "model": model,
        "dtype": s.dtype,
        "seed": 0,
        "max_model_len": max_len,
        "max_num_seqs": max(s.batches),
        "disable_log_stats": False,
        "enforce_eager": s.eager,
    }


def spec_modes(
    folders: dict[str, Path],
    plan: list[tuple[str | None, str]],
    draft_models: dict[str, Path],
    s: Settings,
    langs: list[str],
    out: Path | None = None,
) -> list[Mode]:
    modes = [
        Mode(
            "ngram",
            None,
            langs,
            {
                "method": "ngram",
                "num_speculative_tokens": s.ngram_k,
                "prompt_lookup_max": s.ngram_n,
                "prompt_lookup_min": 1,
            },
        )
    ]
    for name, folder in folders.items():
        own = [lang for d, lang in plan if d == name]
        modes += [
            Mode(
                f"eagle3@{k}",
                name,
                own,
                {"method": "eagle3", "model": str(folder), "num_speculative_tokens": k},
            )
            for k in s.sweep
        ]
        if out is not None:
            modes += [
                hybrid_mode(name, folder, own, m, s.ngram_n, d, s, out)
                for m in s.hybrid_min
                for d in s.hybrid_drafter
            ]
    return modes + _draft_model_modes(draft_models, s, langs)


def hybrid_mode(
    name: str,
    folder: Path,
    own: list[str],
    m: int,
    n_max: int,
    d: int,
    s: Settings,
    out: Path,
    max_batch: int | None = None,
) -> Mode:
    """The plugin's hybrid for one drafter (its folder of links and settings under ``out``);
    ``max_batch``: the drafter drafts only in steps of at most that many requests
    (``hybrid-m<m>-b<max_batch>@d``)."""
    tag = _hybrid_tag(m, max_batch)
    here = hybrid_folder(
        out / "hybrid" / f"{name}-{tag}-d{d}", folder, m, max(m, n_max), d, max_batch
    )
    return Mode(
        f"hybrid-{tag}@{d}",
        name,
        own,
        {"method": "eagle3", "model": str(here), "num_speculative_tokens": max(s.ngram_k, d)},
    )


def _hybrid_tag(m: int, max_batch: int | None) -> str:
    """The part of a hybrid mode's name (and folder) that says its settings."""
    return f"m{m}" if max_batch is None else f"m{m}-b{max_batch}"


def _draft_model_modes(draft_models: dict[str, Path], s: Settings, langs: list[str]) -> list[Mode]:
    modes = []
    for name, folder in draft_models.items():
        modes += [
            Mode(
                f"draft@{k}",
                name,
                [name] if name in langs else langs,
                {"method": "draft_model", "model": str(folder), "num_speculative_tokens": k},
            )
            for k in s.sweep
        ]
    return modes


@dataclass
class Context:
    """What every engine of one bench shares."""

    target: Any
    path: str  # the target's folder as vLLM loads it
    s: Settings
    rows: list[dict]
    params: dict  # SamplingParams keywords
    base: dict  # LLM keywords
    python: str
    out: Path
    eagle3: bool  # this vLLM serves EAGLE-3 drafts for the target's architecture
    folders: dict[str, Path] = field(default_factory=dict)  # the EAGLE-3 drafters by name
    # drafter → the calibrated hybrid (engines.vllm.calibrate): curve, m, d, why
    hybrid: dict[str, dict] = field(default_factory=dict)
    # drafter key → why vLLM serves none for this target
    refused: dict[str, str] = field(default_factory=dict)
    # mode → vLLM's error line (it failed every try)
    failed: dict[str, str] = field(default_factory=dict)
    plain: dict[int, dict] = field(default_factory=dict)
    prefill: dict[str, float] = field(default_factory=dict)
    load_start: tuple = ()

    def rows_of(self, langs: list[str]) -> list[dict]:
        return [r for r in self.rows if r["lang"] in langs]


def bench(
    target_name: str,
    out: str | Path,
    drafters: str | Path | None = None,
    langs: list[str] | None = None,
    s: Settings | None = None,
    engines_json: Path | None = None,
    draft_models: str | Path | None = None,
    log=print,
) -> dict:
    from polyspec.targets import load_target, model_path

    s, out = s or Settings(), Path(out)
    python = vllm_python()  # no vLLM environment: one line, before anything is loaded or written
    target = load_target(target_name, device="cpu", with_model=False)
    folders = resolve_drafters(drafters, target_name, out, log=log)
    plan = bench_plan(folders, langs)
    smalls = _draft_model_folders(draft_models)
    for folder in folders.values():  # a broken export: one line now, not after minutes of engines
        check_speculators(folder, target.vocab_size)
    eagle3 = probe_target(target, target_name, python, out)
    # a draft model named for a language with held-out prompts runs on them; any other name on every
    # language here
    all_langs = list(
        dict.fromkeys(
            [lang for _, lang in plan] + [n for n in smalls if langs is None and load_heldout(n)]
        )
    )
    rows = prompt_rows(target, all_langs, s.prompts, s.questions)
    max_len = max(len(r["ids"]) for r in rows) + s.n + max(s.sweep + (s.ngram_k,)) + 8
    path = model_path(target.spec)
    ctx = Context(
        target,
        path,
        s,
        rows,
        {"temperature": 0, "max_tokens": s.n, "stop": list(target.spec.prompt_format.stop) or None},
        engine_args(path, s, max_len),
        python,
        out,
        eagle3,
        folders=folders,
        load_start=os.getloadavg(),
    )
    if folders and not eagle3:
        why = (
            f"vLLM's {target.config.architectures[0]} does not implement SupportsEagle3: vLLM "
            "serves no EAGLE-3 drafter for this target (Gemma-3: polyspec's vLLM plugin adds it, "
            "pip install ./plugins/vllm in vLLM's environment; make setup-vllm does)"
        )
        ctx.refused = {name: why for name in folders}
        log(f"[vllm] {why}: plain, ngram and draft models only")
    modes = spec_modes(folders, plan, smalls, s, all_langs, out if eagle3 else None)
    t_start = time.perf_counter()
    log(
        f"[vllm] {sum(_key(m) not in ctx.refused for m in modes) + 1} engines × batch "
        f"{', '.join(map(str, s.batches))} on {len(rows)} prompts "
        f"({', '.join(all_langs)}), {s.dtype}, {s.n} new tokens; vLLM's Python: {python}"
    )
    with VLLMProcess(ctx.base, log=out / "logs" / "plain.log", python=python) as plain_engine:
        log(f"[vllm] plain: vLLM {plain_engine.version} up in {plain_engine.load_seconds:.0f} s")
        ctx.plain = run_mode(plain_engine, rows, ctx.params, s.batches, s.mixed)
        ctx.prefill = {
            lang: prefill_seconds(plain_engine, ctx.rows_of([lang]), ctx.params)
            for lang in all_langs
        }
        for mode in modes:
            run_spec(ctx, mode, log)
        report = _assemble(ctx, modes, plain_engine)
        extra = [
            _mode_at(m, d["draft_n"])
            for key, d in report["draft_length"].items()
            for m in [_sweep(modes)[key][0]]
            if d["draft_n"] not in {_k(x) for x in _sweep(modes)[key]}
        ]
        for mode in extra:  # a chosen length not run yet: run it too, so the choice is measured
            run_spec(ctx, mode, log)
            modes.append(mode)
        hybrid = _calibrated_hybrid(ctx, modes, report, log) if s.hybrid_auto and eagle3 else []
        for mode in hybrid:
            run_spec(ctx, mode, log)
            modes.append(mode)
        limited = _batch_limited_hybrid(ctx, modes, log)
        for mode in limited:  # measured too: what is served is what ran
            run_spec(ctx, mode, log)
            modes.append(mode)
        hybrid += limited
        adaspec = _adaspec_modes(ctx, report, log) if eagle3 else []
        for mode in adaspec:
            run_spec(ctx, mode, log)
            modes.append(mode)
        if extra or hybrid or adaspec:
            report = _assemble(ctx, modes, plain_engine)
        again = run_pass(plain_engine, rows, ctx.params, 1)
        first = ctx.plain.get(1)
        report["plain_again"] = {
            "tok_s": round_or_none(again["tok_s"], 2),
            "drift": round_or_none(again["tok_s"] / first["tok_s"], 4)
            if first and first["tok_s"]
            else None,
            "identical": sum(again["outputs"][p] == first["outputs"][p] for p in again["outputs"])
            if first
            else None,
        }
    report["machine"]["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    polyspec_alpha(report, engines_json)
    write(out, report)
    if engines_json:
        write_engines(engines_json, report, out)
    return report


def probe_target(target, name: str, python: str, out: Path) -> bool:
    """Whether vLLM serves EAGLE-3 drafts for the target's architecture (asked without loading a
    model); a target vLLM has no model class for is a one-line error."""
    arch = (getattr(target.config, "architectures", None) or ["?"])[0]
    with VLLMProcess(None, python=python, log=out / "logs" / "probe.log") as p:
        got = p.probe([arch])
    if not got["architectures"][arch]["known"]:
        raise PolyspecError(
            f"vLLM {got['vllm']} has no model class for {arch} ({name}): it cannot serve this "
            "target"
        )
    return got["architectures"][arch]["eagle3"]


def run_spec(ctx: Context, mode: Mode, log, tries: int = 2) -> None:
    """One speculative mode's engine: its runs into ``mode.runs``. An engine that fails is started
    again without vLLM's compile cache (its start-up can fail on that cache: a stack overflow
    recompiling after a load failure of a cached artifact, seen here; :data:`NO_COMPILE_CACHE`);
    failing ``tries`` times, vLLM's error line goes into ``ctx.failed`` and the bench goes on.
    Drafters the probe found unservable (``ctx.refused``) are skipped."""
    if _key(mode) in ctx.refused:
        return
    cfg = {**ctx.base, "speculative_config": mode.speculative_config}
    stem = f"{mode.drafter or 'target'}-{mode.name.replace('@', '-')}"
    for attempt in range(1, tries + 1):
        try:
            with VLLMProcess(
                cfg,
                log=ctx.out / "logs" / f"{stem}-{attempt}.log",
                python=ctx.python,
                env=NO_COMPILE_CACHE if attempt > 1 else None,
            ) as eng:
                log(
                    f"[vllm] {mode.name} ({mode.drafter or 'no drafter'}): up in "
                    f"{eng.load_seconds:.0f} s"
                )
                mode.runs = run_mode(
                    eng, ctx.rows_of(mode.langs), ctx.params, ctx.s.batches, ctx.s.mixed
                )
            break
        except PolyspecError as e:
            msg = str(e).removeprefix("vLLM failed: ")
            log(
                f"[vllm] {mode.name} ({mode.drafter or 'no drafter'}) failed, try {attempt} of "
                f"{tries}: {msg}"
            )
            if attempt == tries:
                ctx.failed[f"{_key(mode)}: {mode.name}" if mode.drafter else mode.name] = msg
                return
    log(
        f"[vllm] {mode.name} ({mode.drafter or '-'}): "
        + ", ".join(
            f"batch {b} {r['tok_s']:.1f} tok/s "
            f"({r['tok_s'] / _subset(ctx.plain[b], ctx.rows_of(mode.langs))['tok_s']:.2f}×)"
            for b, r in mode.runs.items()
        )
    )


def _assemble(ctx: Context, modes: list[Mode], plain_engine: VLLMProcess) -> dict:
    """The report from the runs so far (margins of divergences probed on the plain engine)."""
    entries = [_mode_entry(ctx, mode, plain_engine) for mode in modes if mode.runs]
    lengths = _draft_lengths(ctx, modes)
    _hybrid_schedules(ctx, modes)
    return {
        "vllm": {
            "version": plain_engine.version,
            "python": ctx.python,
            "eagle3_for_target": ctx.eagle3,
        },
        "machine": _machine_record(ctx),
        "target": {
            "name": ctx.target.spec.name,
            "path": ctx.path,
            "architecture": (getattr(ctx.target.config, "architectures", None) or ["?"])[0],
        },
        "settings": _settings_record(ctx),
        "plain": _plain_record(ctx),
        "prefill_seconds": {lang: round(x, 3) for lang, x in ctx.prefill.items()},
        "modes": entries,
        "refused": ctx.refused or None,
        "failed": ctx.failed or None,
        "draft_length": lengths,
        "hybrid": ctx.hybrid or None,
        "definitions": dict(DEFINITIONS),
    }


def _mode_entry(ctx: Context, mode: Mode, plain_engine: VLLMProcess) -> dict:
    """One mode's report entry: its configuration and, per batch size, its runs against plain's."""
    mine = ctx.rows_of(mode.langs)
    e = {
        "mode": mode.name,
        "drafter": mode.drafter,
        "langs": mode.langs,
        "speculative_config": mode.speculative_config,
        "by_batch": {},
    }
    for b, run in mode.runs.items():
        e["by_batch"][b] = _batch_entry(ctx, mode, b, run, mine, plain_engine)
    return e


def _batch_entry(
    ctx: Context, mode: Mode, b: int, run: dict, mine: list[dict], plain_engine: VLLMProcess
) -> dict:
    """One mode's run at batch size ``b`` against plain's: its figures, identity, divergences."""
    ref = _subset(ctx.plain[b], mine)
    same = compare(ref["outputs"], run["outputs"])
    _probe_margins(plain_engine, same, mine, ref)
    entry = {
        **summarize_run(run, ref, len(mine)),
        "identical": sum(c["identical"] for c in same.values()),
        "prompts": len(same),
        "divergences": {p: c for p, c in same.items() if not c["identical"]},
    }
    # the aims are per language (not where groups mixed languages: their counters are the group's)
    if len(mode.langs) > 1 and set(mode.langs) <= set(run.get("spec_by_lang", {})):
        entry["by_lang"] = {}
        for lang in mode.langs:
            rows = [r for r in mine if r["lang"] == lang]
            part = _lang_part(run, rows, lang)
            entry["by_lang"][lang] = summarize_run(part, _subset(ref, rows), len(rows))
    # its steps without a match carry no draft and vLLM does not count them
    if mode.name == "ngram":
        entry.pop("tau", None)
        for part in entry.get("by_lang", {}).values():
            part.pop("tau", None)
    return entry


def _lang_part(run: dict, rows: list[dict], lang: str) -> dict:
    """One language's share of a mode's pass (its prompts, seconds and counters)."""
    return {**_subset(run, rows), "spec": run["spec_by_lang"][lang]}


def _probe_margins(
    plain_engine: VLLMProcess, same: dict[str, dict], mine: list[dict], ref: dict
) -> None:
    """Each divergence of ``same`` gets plain's margin at its first differing position."""
    for pid, c in same.items():
        if not c["identical"] and c["plain"] is not None and c["mode"] is not None:
            r = next(x for x in mine if x["id"] == pid)
            c.update(
                margin_at(
                    plain_engine,
                    r["ids"],
                    ref["outputs"][pid][: c["at"]],
                    c["plain"],
                    c["mode"],
                )
            )


def _draft_lengths(ctx: Context, modes: list[Mode]) -> dict:
    """Per drafter: the length chosen at the smallest batch, the best measured at the largest, and
    the schedule by batch size vLLM reads (:func:`engines.vllm.report.batch_schedule`)."""
    s = ctx.s
    lengths = {}
    low, big = min(s.batches), max(s.batches)
    for key, mine in _sweep(modes).items():
        sub = ctx.rows_of(mine[0].langs)
        pick = choose_length(
            {_k(m): m.runs[low] for m in mine},
            _subset(ctx.plain[low], sub),
            sum(ctx.prefill[lang] for lang in mine[0].langs),
            len(sub),
            s.k_max,
        )
        if pick:
            ref = _subset(ctx.plain[big], sub)
            pick["best_measured_at_batch"] = {
                big: best_measured(
                    {
                        _k(m): m.runs[big]["tok_s"] / ref["tok_s"]
                        for m in mine
                        if m.runs[big]["tok_s"]
                    }
                )
            }
            pick["schedule"] = batch_schedule(
                {
                    b: {
                        _k(m): m.runs[b]["tok_s"] / _subset(ctx.plain[b], sub)["tok_s"]
                        for m in mine
                        if m.runs.get(b) and m.runs[b]["tok_s"]
                    }
                    for b in s.batches
                }
            )
            lengths[key] = pick
    return lengths


def _calibrated_hybrid(ctx: Context, modes: list[Mode], report: dict, log) -> list[Mode]:
    """Per EAGLE-3 drafter with a chosen ``draft_n``: prompt lookup's acceptance by match length on
    plain's batch-1 answers to the drafter's prompts, against the drafter's α and step cost
    (:mod:`engines.vllm.calibrate`) → ``m``; the hybrid mode to run (none where no match length
    beats the drafter). Records each choice in ``ctx.hybrid``."""
    from engines.vllm.calibrate import choose_ngram_min, ngram_curve

    s, todo = ctx.s, []
    for name, d in report["draft_length"].items():
        folder = ctx.folders.get(name)
        mine = next((m for m in modes if m.drafter == name and m.name.startswith("eagle3@")), None)
        if folder is None or mine is None or 1 not in ctx.plain:
            continue
        if s.hybrid_for and name not in s.hybrid_for:
            continue
        rows = ctx.rows_of(mine.langs)
        answers = ctx.plain[1]["outputs"]
        curve = ngram_curve(
            [(r["ids"] + answers[r["id"]], len(r["ids"])) for r in rows], HYBRID_N_MAX, s.ngram_k
        )
        c = d["step_cost"]["c"]
        pick = choose_ngram_min(curve, d["alpha"], d["draft_n"], s.ngram_k, c, HYBRID_N_MAX)
        m = pick["ngram_min"]
        ctx.hybrid[name] = {
            **pick,
            "drafter_tokens": d["draft_n"],
            "ngram_tokens": s.ngram_k,
            "ngram_max": HYBRID_N_MAX,
            "curve": curve,
        }
        log(
            f"[vllm] hybrid for {name}: n-gram rows from {m}-token matches "
            f"({pick['ngram_share']:.0%} of plain's answer positions), else the drafter's "
            f"{d['draft_n']}"
            if m <= HYBRID_N_MAX
            else f"[vllm] hybrid for {name}: no match length beats the drafter, not run"
        )
        if m <= HYBRID_N_MAX:
            n_max, k = HYBRID_N_MAX, d["draft_n"]
            todo.append(hybrid_mode(name, folder, mine.langs, m, n_max, k, s, ctx.out))
    return todo


def _adaspec_modes(ctx: Context, report: dict, log) -> list[Mode]:
    """ADASPEC per request (the plugin's ``languages``): one engine holds the multilingual drafter
    and each language's drafter, every request drafted by its language's — at the multilingual
    drafter's chosen draft length, alone and with its calibrated hybrid. None without a
    multilingual drafter or language drafters."""
    langs = {r["lang"] for r in ctx.rows}
    own = {name: f for name, f in ctx.folders.items() if name in langs}
    multi = next((n for n in ctx.folders if n not in langs and n in report["draft_length"]), None)
    if multi is None or not own:
        return []
    d = report["draft_length"][multi]["draft_n"]
    mine = sorted(langs)
    here = ctx.out / "adaspec"
    modes = [
        Mode(
            f"adaspec@{d}",
            multi,
            mine,
            {
                "method": "eagle3",
                "model": str(plugin_folder(here / f"{multi}-d{d}", ctx.folders[multi], None, own)),
                "num_speculative_tokens": d,
            },
        )
    ]
    h = ctx.hybrid.get(multi)
    if h and h["ngram_min"] <= HYBRID_N_MAX:
        from polyspec_vllm.settings import Hybrid

        tag = _hybrid_tag(h["ngram_min"], h.get("drafter_max_batch"))
        hybrid = Hybrid(
            h["ngram_min"], h["ngram_max"], h["drafter_tokens"], h.get("drafter_max_batch")
        )
        folder = plugin_folder(
            here / f"{multi}-{tag}-d{h['drafter_tokens']}", ctx.folders[multi], hybrid, own
        )
        modes.append(
            Mode(
                f"adaspec-hybrid-{tag}@{h['drafter_tokens']}",
                multi,
                mine,
                {
                    "method": "eagle3",
                    "model": str(folder),
                    "num_speculative_tokens": max(h["ngram_tokens"], h["drafter_tokens"]),
                },
            )
        )
    log(
        f"[vllm] adaspec: {multi} with {', '.join(sorted(own))} per request"
        f"{' (mixed-language batches)' if ctx.s.mixed else ''}: {', '.join(m.name for m in modes)}"
    )
    return modes


def _batch_limited_hybrid(ctx: Context, modes: list[Mode], log) -> list[Mode]:
    """A calibrated hybrid that ran below ``ngram`` at a measured batch size (its drafter rows cost
    more verification there than they bring) runs again with the drafter drafting only up to the
    largest measured batch size below the first it lost at (``drafter_max_batch``; above it, the
    n-gram rows alone). That mode becomes the served one (``ctx.hybrid[name]``)."""
    ngram = next((m for m in modes if m.name == "ngram" and m.runs), None)
    todo = []
    for name, h in ctx.hybrid.items():
        ran = _hybrid_run(ctx, modes, name)
        if ngram is None or ran is None or h.get("drafter_max_batch"):
            continue
        rows = ctx.rows_of(ran.langs)
        batches = sorted(b for b in ran.runs if b in ngram.runs)
        lost = [
            b
            for b in batches
            if ran.runs[b]["tok_s"] < _subset(ngram.runs[b], rows)["tok_s"] and ran.runs[b]["tok_s"]
        ]
        kept = [b for b in batches if lost and b < min(lost)]
        if not kept:  # level with ngram everywhere, or behind it already at the smallest
            continue
        h["unlimited"] = ran.name
        h["drafter_max_batch"] = max(kept)
        log(
            f"[vllm] hybrid for {name}: below ngram at batch {min(lost)}; again with the drafter "
            f"drafting in steps of at most {max(kept)} requests"
        )
        folder = ctx.folders[name]
        todo.append(
            hybrid_mode(
                name,
                folder,
                ran.langs,
                h["ngram_min"],
                h["ngram_max"],
                h["drafter_tokens"],
                ctx.s,
                ctx.out,
                max_batch=max(kept),
            )
        )
    return todo


def _hybrid_run(ctx: Context, modes: list[Mode], name: str) -> Mode | None:
    """The served hybrid mode of drafter ``name`` (its calibrated settings), if it ran."""
    h = ctx.hybrid[name]
    want = f"hybrid-{_hybrid_tag(h['ngram_min'], h.get('drafter_max_batch'))}@{h['drafter_tokens']}"
    return next((m for m in modes if m.drafter == name and m.runs and m.name == want), None)


def _hybrid_schedules(ctx: Context, modes: list[Mode]) -> None:
    """The calibrated hybrid's own draft length by batch size (``ctx.hybrid[name]["schedule"]``):
    its length where it beat plain at that measured size, 0 (no drafts) where it did not."""
    for name, h in ctx.hybrid.items():
        k = max(h["ngram_tokens"], h["drafter_tokens"])
        ran = _hybrid_run(ctx, modes, name)
        if ran is None:
            continue
        rows = ctx.rows_of(ran.langs)
        h["schedule"] = batch_schedule(
            {
                b: {k: run["tok_s"] / _subset(ctx.plain[b], rows)["tok_s"]}
                for b, run in ran.runs.items()
                if run["tok_s"]
            }
        )


def _machine_record(ctx: Context) -> dict:
    """The report's ``machine``: the host, its threads and its load when the bench started."""
    return {
        "host": host_kind(),
        "threads": int(os.environ.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0))),
        "loadavg_1m_start": round(ctx.load_start[0], 2),
    }


def _plain_record(ctx: Context) -> dict:
    """The report's ``plain``: the target alone per batch size (tok/s, tokens, seconds)."""
    return {
        b: {
            "tok_s": round_or_none(r["tok_s"], 2),
            "tokens": r["tokens"],
            "seconds": round(r["seconds"], 3),
        }
        for b, r in ctx.plain.items()
    }


def _settings_record(ctx: Context) -> dict:
    """The report's ``settings``: what every engine was given."""
    s = ctx.s
    return {
        "n": s.n,
        "prompts_per_lang": s.prompts,
        "batches": list(s.batches),
        "dtype": s.dtype,
        "prompts": {
            lang: len(ctx.rows_of([lang])) for lang in dict.fromkeys(r["lang"] for r in ctx.rows)
        },
        "sweep": list(s.sweep),
        "ngram": {"k": s.ngram_k, "n_max": s.ngram_n, "n_min": 1},
        "enforce_eager": s.eager,
        "temperature": 0,
        "mixed": s.mixed,
    }


def _subset(run: dict, rows: list[dict]) -> dict:
    """A run restricted to ``rows`` and their languages (a drafter's, or one language): outputs,
    tokens and seconds."""
    langs = {r["lang"] for r in rows}
    part = {
        "outputs": {r["id"]: run["outputs"][r["id"]] for r in rows},
        "seconds_by_lang": {k: v for k, v in run["seconds_by_lang"].items() if k in langs},
    }
    return _totals(part, rows)


def _k(mode: Mode) -> int:
    return int(mode.name.split("@")[1])


def _sweep(modes: list[Mode]) -> dict[str, list[Mode]]:
    """The drafters' draft-length sweeps that ran, by drafter: ``<name>`` (EAGLE-3) or
    ``<name> (draft_model)`` (the hybrid's and adaspec's modes are not a sweep of the drafter's
    length)."""
    out: dict[str, list[Mode]] = {}
    for m in modes:
        if m.drafter and m.runs and not m.name.startswith(("hybrid", "adaspec")):
            out.setdefault(_key(m), []).append(m)
    return out


def _key(m: Mode) -> str:
    """The drafter a mode runs, as ``ctx.refused`` names it (EAGLE-3 drafters, the hybrid's too) or
    ``<name> (draft_model)``."""
    return f"{m.drafter} (draft_model)" if m.name.startswith("draft@") else m.drafter


def _mode_at(m: Mode, k: int) -> Mode:
    return Mode(
        f"{m.name.split('@')[0]}@{k}",
        m.drafter,
        m.langs,
        {**m.speculative_config, "num_speculative_tokens": k},
    )


def _draft_model_folders(path: str | Path | None) -> dict[str, Path]:
    """``--draft-models``: transformers model folders by name (``<path>/<name>/config.json``, or
    ``path`` itself)."""
    if path is None:
        return {}
    path = Path(path)
    if (path / "config.json").is_file():
        return {(read_json_or_none(path / "polyspec.json") or {}).get("lang") or path.name: path}
    found = (
        {p.name: p for p in sorted(path.iterdir()) if (p / "config.json").is_file()}
        if path.is_dir()
        else {}
    )
    if not found:
        raise PolyspecError(
            f"{path} holds no model folder (<name>/config.json); write them with python -m export "
            "--format hf-assistant"
        )
    return found
