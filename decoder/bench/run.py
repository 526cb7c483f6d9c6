"""The evaluation harness behind ``python -m decoder.bench`` (``make eval``; its CLI:
``decoder/bench/__main__.py``): every decoding method on the same questions, same target, same
process; answers per method, ``report.md`` / ``report.json`` and PNG charts.

Questions: Spec-Bench ``question.jsonl`` lines (``decoder.bench.questions``; multi-turn: each turn
is answered by the method itself, then appended). Methods: any name of the registry
``decoder.methods`` (the decoder's methods, their presets such as
``eagle-full``/``fr-spec``/``eagle3``, and transformers'
``hf-generate``/``hf-pld``/``hf-assisted``). A method that cannot run with the inputs given (no
bundle, no small-LM drafter, …) is skipped and the report says why. The questions file and the
method names are checked before any model loads (torch and transformers are imported inside the
functions that run models, for that reason).

Protocol: one warm-up question per method; generation ends at EOS, the prompt format's stop strings
or max_new_tokens, for every method alike; tokens are the answer's tokens; τ = tokens / target
forwards (prefill included; counted by a forward hook for transformers' own loops); speedup =
tokens/s over the faster of ``ar`` and ``hf-generate`` on the same questions; every greedy output is
compared with ``ar``'s (``identical``); mean ± std over ``--repeats`` passes. Methods are
interleaved: each question is answered by every method (in alternating order) before the next, so a
drift in the machine's speed falls on all methods alike.

Failures: a method that raises (while being built or answering) is left out of the tables from then
on, and ``report.json`` (``failed``) and ``report.md`` ("Failed methods") say which method, on which
question, with the error's first line; its answers until then are kept in
``answers/<method>.jsonl``. The run exits 1 when a method failed, unless ``--keep-going``. Only the
failure of the sole baseline ends the run at once.
"""

from __future__ import annotations

import json
from pathlib import Path

from decoder.bench.questions import BUILTIN, load_questions
from decoder.bench.report import (
    Answer,
    adaptive_trace,
    agreement,
    by_source,
    charts,
    render_markdown,
    summarize,
)
from decoder.methods import BASELINES, DEFAULT_BENCH, BenchInputs, Method, get_method
from polyspec.errors import PolyspecError, first_line
from polyspec.io import atomic_write_json, atomic_write_text
from polyspec.prompts import encode, render

__all__ = [
    "AR_METHODS",
    "Answer",
    "BUILTIN",
    "DEFAULT_METHODS",
    "agreement",
    "answer_question",
    "build_methods",
    "charts",
    "load_questions",
    "render_markdown",
    "run_bench",
    "summarize",
]

AR_METHODS = BASELINES
DEFAULT_METHODS = ",".join(DEFAULT_BENCH)


def _failure(method: str, question_id, phase: str, e: BaseException, answered: int = 0) -> dict:
    """A failed method as report.json records it: phase ``build``, ``warm-up`` or ``answer``."""
    return {
        "method": method,
        "question_id": question_id,
        "phase": phase,
        "error": f"{type(e).__name__}: {first_line(e)}",
        "answered": answered,
    }


# ------------------------------------------------------------------------------------------ methods
def _decoder_runner(m: Method, b: BenchInputs):
    from decoder.core import Decoder  # start-up time: torch loads after the inputs are checked

    opts = m.bench_options(b)
    dec = Decoder(b.target, opts.pop("bundle", b.bundle), log=b.log, **opts)

    def run(ids, n):
        out = dec.generate(ids, n)
        return Answer(
            out.tokens, out.text, out.target_forwards, out.wall_s, out.accept_lengths, out.steps
        )

    return run


def build_methods(
    names: list[str],
    target,
    bundle,
    assistant: str | None,
    log,
    gamma: int | None = None,
    engine_bundle=None,
    failed: list[dict] | None = None,
    skipped: dict[str, str] | None = None,
) -> dict:
    """name → callable(prompt_ids, max_new_tokens) → Answer, each built as its registry entry says
    (``decoder.methods``). A method that cannot run with these inputs is skipped (logged; its reason
    goes into ``skipped``). ``gamma``: the drafter methods' γ instead of the bundle's calibrated one
    (``--gamma``). ``engine_bundle``: the EAGLE-3 drafters engines load
    (``python -m export engines``), which ``eagle3`` runs. ``failed``: where a method that raises
    while being built is recorded (without it, the error propagates)."""
    b = BenchInputs(target, bundle, engine_bundle, assistant, gamma, log)
    counter = None  # the target's forwards in transformers' loops
    runners = {}
    for name in names:
        m = get_method(name)
        why = m.unavailable(b)
        if why is not None:
            log(f"{name} skipped: {why}")
            if skipped is not None:
                skipped[name] = why
            continue
        try:
            if m.kind != "transformers":
                runners[name] = _decoder_runner(m, b)
                continue
            from decoder.bench import (
                hf_loops,  # start-up time: transformers loads after the inputs are checked
            )

            counter = counter or hf_loops.ForwardCounter(target.model)
            kw = dict(m.options) | (
                {"assistant_model": hf_loops.load_assistant(b)} if m.assistant else {}
            )
            runners[name] = hf_loops.hf_runner(target, counter, **kw)
        except Exception as e:  # noqa: BLE001 - one broken method must not cost the others' results
            if failed is None:
                raise
            failed.append(_failure(name, None, "build", e))
            log(f"{name} failed while being built and is left out: {failed[-1]['error']}")
    return runners


# -------------------------------------------------------------------------------------------- runs
def answer_question(run, target, q: dict, max_new_tokens: int) -> list[Answer]:
    fmt = target.spec.prompt_format
    messages, answers = [], []
    for turn in q["turns"]:
        messages.append({"role": "user", "content": turn})
        ids = encode(fmt, target.tokenizer, render(fmt, target.tokenizer, messages))
        a = run(ids, max_new_tokens)
        answers.append(a)
        messages.append({"role": "assistant", "content": a.text.strip() or "…"})
    return answers


def run_bench(
    target,
    bundle,
    questions: list[dict],
    methods: list[str],
    max_new_tokens: int,
    repeats: int,
    out: Path,
    assistant: str | None = None,
    log=print,
    gamma: int | None = None,
    engine_bundle=None,
) -> dict:
    """Answer ``questions`` with every method (interleaved, ``repeats`` passes) and write the
    answers, report.json, report.md and the charts under ``out`` → the report (``failed``: the
    methods that raised, ``skipped``: those that could not run with these inputs)."""
    from tqdm.auto import tqdm  # start-up time: loads with torch, after the inputs are checked

    failed: list[dict] = []
    skipped: dict[str, str] = {}
    runners = build_methods(
        methods,
        target,
        bundle,
        assistant,
        log,
        gamma=gamma,
        engine_bundle=engine_bundle,
        failed=failed,
        skipped=skipped,
    )
    if not any(m in runners for m in BASELINES):
        broken = "".join(
            f"; {f['method']} failed: {f['error']}" for f in failed if f["method"] in BASELINES
        )
        raise PolyspecError(
            f"the methods must include {' or '.join(BASELINES)} (speedups are relative to "
            f"them){broken}"
        )
    order = [m for m in BASELINES if m in runners] + [m for m in runners if m not in BASELINES]
    # method → repeat → question → turns
    results: dict[str, list[list[list[Answer]]]] = {m: [[] for _ in range(repeats)] for m in order}
    live = list(order)  # the methods that have not failed

    def answer(m: str, q: dict, n: int, phase: str) -> list[Answer] | None:
        """m's answers to q; None when m failed: it is left out from then on (only the sole
        baseline's failure ends the run, since every speedup is relative to it)."""
        try:
            return answer_question(runners[m], target, q, n)
        # one broken peer must not cost the other methods' results
        except Exception as e:  # noqa: BLE001
            if m in BASELINES and len([x for x in live if x in BASELINES]) == 1:
                raise
            failed.append(_failure(m, q["question_id"], phase, e, answered=len(results[m][0])))
            log(
                f"{m} failed on question {q['question_id']} and is left out of the report: "
                f"{failed[-1]['error']}"
            )
            live.remove(m)
            return None

    for m in order:  # one warm-up question per method
        answer(m, questions[0], min(16, max_new_tokens), "warm-up")
    # Interleaved: every question is answered by every method before the next question, in
    # alternating order (AR first, then AR last), so a drift of the machine's speed over the run
    # (thermal, other load) falls on every method alike instead of on whichever method's block it
    # hits. Each method's own state (SPECTRA's tables, the hybrid's measured arms) still sees the
    # questions in the same order as a run of it alone.
    bar = tqdm(total=len(order) * repeats * len(questions), desc="eval", unit="q")
    step = 0
    for r in range(repeats):
        for q in questions:
            for m in [m for m in (order if step % 2 == 0 else order[::-1]) if m in live]:
                if (a := answer(m, q, max_new_tokens, "answer")) is not None:
                    results[m][r].append(a)
                bar.set_postfix(method=m)
                bar.update()
            step += 1
    bar.close()
    done = {m: results[m] for m in order if m in live}
    report = summarize(done, questions, target, bundle, max_new_tokens, repeats)
    write_answers(out, results, questions, ref=done["ar"][0] if "ar" in done else None)
    report["agreement"] = agreement(done, questions, target, log)
    report["trace"] = adaptive_trace(done, questions)
    report["failed"] = failed
    report["skipped"] = skipped
    report["gamma"] = gamma  # None: each drafter method's γ came from the bundle's calibration
    atomic_write_json(out / "report.json", report)
    atomic_write_text(out / "report.md", render_markdown(report))
    charts(report, out)
    return report


def parallel_stats(steps: list) -> dict:
    """Drafting beside the verifications (``spide-parallel``): {"parallel": hits, drops, seconds
    drafted beside, seconds of it hidden behind the verification}; {} for methods that draft nothing
    beside."""
    hits = sum(s.parallel == "hit" for s in steps)
    drops = sum(s.parallel == "drop" for s in steps)
    if not hits and not drops:
        return {}
    return {
        "parallel": {
            "hits": hits,
            "drops": drops,
            "spec_s": round(sum(s.spec_s for s in steps), 6),
            "overlap_s": round(sum(s.hidden_s for s in steps), 6),
        }
    }


def write_answers(out: Path, results: dict, questions: list[dict], ref) -> None:
    """``answers/<method>.jsonl``: each method's answers of the first repeat (a failed method's
    until it failed), ``identical`` = the same tokens as ``ar``'s (``ref``)."""
    (out / "answers").mkdir(parents=True, exist_ok=True)
    for m, reps in results.items():
        lines = []
        for i, (q, turns) in enumerate(zip(questions, reps[0])):
            same = ref is None or [a.tokens for a in turns] == [a.tokens for a in ref[i]]
            steps = [s for a in turns for s in a.steps]
            lines.append(
                json.dumps(
                    {
                        "question_id": q["question_id"],
                        "method": m,
                        "language": q["language"],
                        "category": q["category"],
                        "turns": [a.text for a in turns],
                        "new_tokens": sum(len(a.tokens) for a in turns),
                        "wall_time": sum(a.seconds for a in turns),
                        "target_forwards": sum(a.forwards for a in turns),
                        "accept_lengths": [x for a in turns for x in a.accept_lengths],
                        "by_source": by_source(steps),
                        **parallel_stats(steps),
                        "identical": same,
                    },
                    ensure_ascii=False,
                )
            )
        atomic_write_text(out / "answers" / f"{m}.jsonl", "".join(line + "\n" for line in lines))
