"""``python -m decoder.bench`` (``make eval``) — every decoding method on the same questions, same target,
same process; answers per method, ``report.md`` / ``report.json`` and PNG charts.

    python -m decoder.bench --bundle runs/default/export/bundle [--questions spec_bench/question.jsonl]
        [--langs vi,de,ja] [--per-cell 1] [--methods ar,hf-generate,adaspec,…] [--max-new-tokens 128]
        [--repeats 1] [--out runs/default/eval]

Questions: Spec-Bench ``question.jsonl`` lines {question_id, category, language, turns} (multi-turn: each
turn is answered by the method itself, then appended). Default: the built-in mini Multi-SpecBench
(``decoder/data/mini_multispecbench.jsonl``: 7 languages × 7 tasks × 3, plus a mixed-language set).

Protocol (issue #7): one warm-up question per method; generation ends at EOS, the prompt format's stop
strings or max_new_tokens, for every method alike; tokens are the answer's tokens; τ = tokens / target
forwards (prefill included; counted by a forward hook for transformers' own loops); speedup = tokens/s
over the faster of ``ar`` and ``hf-generate`` on the same questions; every greedy output is compared
with ``ar``'s (``identical``); mean ± std over ``--repeats`` passes. Methods are interleaved: each question
is answered by every method (in alternating order) before the next, so a drift in the machine's speed
falls on all methods alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from polyspec.errors import PolyspecError, cli_entry

BUILTIN = Path(__file__).resolve().parent / "data" / "mini_multispecbench.jsonl"
AR_METHODS = ("ar", "hf-generate")
DEFAULT_METHODS = ("ar,hf-generate,adaspec,eagle-full,fr-spec,spide,pld,ngram-tree,spectra,hybrid,hf-pld,hf-assisted")


def load_questions(path: str | Path | None, langs: list[str] | None = None, per_cell: int | None = None,
                   categories: list[str] | None = None) -> list[dict]:
    path = Path(path) if path else BUILTIN
    rows, seen = [], {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise PolyspecError(f"questions file not found: {path}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
            turns = q["turns"]
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
                raise ValueError("turns must be a non-empty list of strings")
        except (json.JSONDecodeError, KeyError, ValueError) as e:
            raise PolyspecError(f"{path}:{n}: not a Spec-Bench question ({e})") from None
        if "question_id" not in q and "id" in q:  # polyspec's held-out prompts (synth/data/heldout.jsonl)
            q["question_id"] = q["id"]
        q.setdefault("category", "unknown")
        q.setdefault("language", q.get("lang", "en"))
        if langs and q["language"] not in langs and q.get("prompt_language") not in langs:
            continue
        if categories and q["category"] not in categories:
            continue
        cell = (q["language"], q["category"])
        seen[cell] = seen.get(cell, 0) + 1
        if per_cell and seen[cell] > per_cell:
            continue
        rows.append(q)
    if not rows:
        raise PolyspecError(f"{path}: no questions left for languages {langs} / categories {categories}")
    return rows


# ------------------------------------------------------------------------------------------ methods


@dataclass
class Answer:
    tokens: list[int]
    text: str
    forwards: int
    seconds: float
    accept_lengths: list[int] = field(default_factory=list)
    steps: list = field(default_factory=list)


class ForwardCounter:
    """Counts the target's forward calls (transformers' own generate loops)."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_hook(lambda *_: self._inc())

    def _inc(self):
        self.n += 1


def build_methods(names: list[str], target, bundle, assistant: str | None, log, gamma: int | None = None,
                  engine_bundle=None) -> dict:
    """name → callable(prompt_ids, max_new_tokens) → Answer. Methods that cannot run are skipped (logged).
    ``gamma``: the drafter methods' γ instead of the bundle's calibrated one (``--gamma``). ``engine_bundle``: the
    EAGLE-3 drafters engines load (``python -m export engines``), which method ``eagle3`` runs."""
    import torch

    from decoder.core import NEEDS_BUNDLE, Decoder

    fmt = target.spec.prompt_format
    tok = target.tokenizer
    counter = ForwardCounter(target.model)
    methods = {}

    def ours(drafters=None, **kw):
        if gamma is not None and kw["method"] in NEEDS_BUNDLE:  # the methods whose γ calibration sets
            kw.setdefault("gamma", gamma)
        dec = Decoder(target, drafters or bundle, log=log, **kw)

        def run(ids, n):
            out = dec.generate(ids, n)
            return Answer(out.tokens, out.text, out.target_forwards, out.wall_s, out.accept_lengths, out.steps)
        return run

    def hf(**kw):
        from transformers import StoppingCriteria, StoppingCriteriaList

        from decoder.stopping import Stopper, eos_ids

        class StopText(StoppingCriteria):
            """The prompt format's stop strings, checked on the decoded tail. (transformers' own
            ``stop_strings`` cannot be used: assisted generation forwards them to the assistant's
            ``generate`` without the tokenizer and fails.)"""

            def __init__(self, start: int):
                self.start = start
                self.tail = max((len(x) for x in fmt.stop), default=0) + 2

            def __call__(self, input_ids, scores, **_):
                text = tok.decode(input_ids[0, max(self.start, input_ids.shape[1] - self.tail):])
                return torch.tensor([any(x in text for x in fmt.stop)], device=input_ids.device)

        def run(ids, n):
            x = torch.tensor([ids], device=target.device)
            counter.n = 0
            stop = StoppingCriteriaList([StopText(len(ids))]) if fmt.stop else None
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                                            pad_token_id=tok.pad_token_id, stopping_criteria=stop, **kw)
            dt = time.perf_counter() - t0
            new = out[0, len(ids):].tolist()
            st = Stopper(tok, eos_ids(target), list(fmt.stop), n)  # the same cut and text as ours
            st.push(new)
            return Answer(st.tokens, st.text(), counter.n, dt)
        return run

    sizes = bundle.vocab_sizes if bundle is not None else []
    langs = bundle.languages if bundle is not None else []
    for name in names:
        if name == "ar":
            methods[name] = ours(method="ar")
        elif name == "hf-generate":
            methods[name] = hf()
        elif name == "hf-pld":
            methods[name] = hf(prompt_lookup_num_tokens=10)
        elif name == "pld":
            methods[name] = ours(method="pld", gamma=10)
        elif name == "ngram-tree":
            methods[name] = ours(method="ngram-tree")
        elif name == "spectra":
            methods[name] = ours(method="spectra")
        elif name == "hybrid":  # drafter + n-gram sources in one tree (n-gram sources only without a bundle)
            methods[name] = ours(method="hybrid")
        elif name == "hf-assisted":
            folder = assistant
            if folder is None and bundle is not None and bundle.manifest["drafter_type"] == "small-lm":
                from export.interop import write_hf_assistant

                folder = str(write_hf_assistant(bundle, target, bundle.root.parent / "hf-assistant")[0])
            if folder is None:
                log("hf-assisted skipped: it needs a small-LM drafter (--assistant <hf-assistant folder>, or a "
                    "small-LM bundle); the bundle holds EAGLE drafters, which transformers cannot use as assistants")
                continue
            from transformers import AutoModelForCausalLM

            helper = AutoModelForCausalLM.from_pretrained(folder).to(target.device).eval()
            methods[name] = hf(assistant_model=helper)
        elif name == "eagle3":  # what an engine serves: the language's EAGLE-3 drafter alone, chain γ 4, no lookup
            engines = engine_bundle if engine_bundle is not None else bundle
            if engines is None or not _eagle3_bundle(engines):
                log("eagle3 skipped: it needs EAGLE-3 drafters (--engine-bundle <run>/export/engines/bundle, or a "
                    "--bundle of EAGLE-3 drafters)")
                continue
            methods[name] = ours(drafters=engines, method="adaspec", lookup_runs=False, gamma=gamma or 4)
        elif bundle is None:
            log(f"{name} skipped: it needs --bundle")
        elif name == "adaspec":
            methods[name] = ours(method="adaspec")
        elif name == "adaspec-noloop":  # ablation: the drafter drafts every step, also inside running loops
            methods[name] = ours(method="adaspec", lookup_runs=False)
        elif name == "adaspec-tree":
            methods[name] = ours(method="adaspec", shape="tree")
        elif name == "adaspec-fixsize":  # ADASPEC Table 2 ablation: adaptive language, fixed smallest size
            methods[name] = ours(method="adaspec", size=min(sizes))
        elif name == "eagle-full":  # the language's drafter, full-vocabulary head (EAGLE-2 style, chain)
            methods[name] = ours(method="chain", size="full")
        elif name == "eagle-tree":
            methods[name] = ours(method="tree", size="full")
        elif name == "fr-spec":  # one static frequency vocabulary for every language (English when available)
            vl = "en" if "en" in langs else langs[0]
            if vl != "en":
                log(f"fr-spec: the bundle has no English vocabulary; using {vl!r} top-{min(sizes)} for every language")
            methods[name] = ours(method="chain", vocab_lang=vl, size=min(sizes))
        elif name == "spide":
            methods[name] = ours(method="spide")
        elif name in ("chain", "tree"):
            methods[name] = ours(method=name)
        else:
            raise PolyspecError(f"unknown method {name!r}")
    return methods


# -------------------------------------------------------------------------------------------- runs


def answer_question(run, target, q: dict, max_new_tokens: int) -> list[Answer]:
    from polyspec.prompts import encode, render

    fmt = target.spec.prompt_format
    messages, answers = [], []
    for turn in q["turns"]:
        messages.append({"role": "user", "content": turn})
        ids = encode(fmt, target.tokenizer, render(fmt, target.tokenizer, messages))
        a = run(ids, max_new_tokens)
        answers.append(a)
        messages.append({"role": "assistant", "content": a.text.strip() or "…"})
    return answers


def _eagle3_bundle(bundle) -> bool:
    """Whether a bundle's drafters are of the EAGLE-3 form (read from their config, no weights loaded)."""
    cfg = json.loads((bundle.drafter_dir(bundle.languages[0]) / "config.json").read_text(encoding="utf-8"))
    return cfg.get("drafter_type") == "eagle" and cfg.get("arch") == "eagle3"


def run_bench(target, bundle, questions: list[dict], methods: list[str], max_new_tokens: int, repeats: int,
              out: Path, assistant: str | None = None, log=print, gamma: int | None = None,
              engine_bundle=None) -> dict:
    from tqdm.auto import tqdm

    from polyspec.io import atomic_write_json, atomic_write_text

    runners = build_methods(methods, target, bundle, assistant, log, gamma=gamma, engine_bundle=engine_bundle)
    if not any(m in runners for m in AR_METHODS):
        raise PolyspecError("the methods must include ar or hf-generate (speedups are relative to them)")
    order = [m for m in AR_METHODS if m in runners] + [m for m in runners if m not in AR_METHODS]
    # method → repeat → question → turns
    results: dict[str, list[list[list[Answer]]]] = {m: [[] for _ in range(repeats)] for m in order}
    failed: dict[str, str] = {}

    def answer(m: str, q: dict, n: int) -> list[Answer] | None:
        """m's answers to q; None when m failed: it is left out from then on (only the sole AR baseline's
        failure ends the run, since every speedup is relative to it)."""
        try:
            return answer_question(runners[m], target, q, n)
        except Exception as e:  # noqa: BLE001 - one broken peer must not cost the other methods' results
            if m in AR_METHODS and len([x for x in AR_METHODS if x in results]) == 1:
                raise
            from polyspec.errors import first_line

            failed[m] = f"{type(e).__name__}: {first_line(e)}"
            log(f"{m} failed and is left out of the report: {failed[m]}")
            results.pop(m)
            return None

    for m in order:  # one warm-up question per method
        answer(m, questions[0], min(16, max_new_tokens))
    # Interleaved: every question is answered by every method before the next question, in alternating order
    # (AR first, then AR last), so a drift of the machine's speed over the run (thermal, other load) falls on
    # every method alike instead of on whichever method's block it hits. Each method's own state (SPECTRA's
    # tables, the hybrid's measured arms) still sees the questions in the same order as a run of it alone.
    bar = tqdm(total=len(order) * repeats * len(questions), desc="eval", unit="q")
    step = 0
    for r in range(repeats):
        for q in questions:
            for m in [m for m in (order if step % 2 == 0 else order[::-1]) if m in results]:
                if (a := answer(m, q, max_new_tokens)) is not None:
                    results[m][r].append(a)
                bar.set_postfix(method=m)
                bar.update()
            step += 1
    bar.close()
    report = summarize(results, questions, target, bundle, max_new_tokens, repeats)
    out.mkdir(parents=True, exist_ok=True)
    (out / "answers").mkdir(exist_ok=True)
    ref = results["ar"][0] if "ar" in results else None
    for m, reps in results.items():
        lines = []
        for i, (q, turns) in enumerate(zip(questions, reps[0])):
            same = ref is None or [a.tokens for a in turns] == [a.tokens for a in ref[i]]
            lines.append(json.dumps({"question_id": q["question_id"], "method": m, "language": q["language"],
                                     "category": q["category"], "turns": [a.text for a in turns],
                                     "new_tokens": sum(len(a.tokens) for a in turns),
                                     "wall_time": sum(a.seconds for a in turns),
                                     "target_forwards": sum(a.forwards for a in turns),
                                     "accept_lengths": [x for a in turns for x in a.accept_lengths],
                                     "identical": same}, ensure_ascii=False))
        atomic_write_text(out / "answers" / f"{m}.jsonl", "\n".join(lines) + "\n")
    report["agreement"] = agreement(results, questions, target, log)
    report["trace"] = adaptive_trace(results, questions)
    report["failed"] = failed
    report["gamma"] = gamma  # None: each drafter method's γ came from the bundle's calibration
    atomic_write_json(out / "report.json", report)
    atomic_write_text(out / "report.md", render_markdown(report))
    charts(report, out)
    return report


def summarize(results: dict, questions: list[dict], target, bundle, max_new_tokens: int, repeats: int) -> dict:
    ar_like = [m for m in AR_METHODS if m in results]
    ref = results["ar"][0] if "ar" in results else results[ar_like[0]][0]

    def group_key(q, by):
        if by == "language":
            return "mixed" if q["category"] == "mixed" else q["language"]
        return q["category"] if by == "category" else "all"

    def stats(m, by):
        out = {}
        keys = sorted({group_key(q, by) for q in questions})
        for key in keys:
            idx = [i for i, q in enumerate(questions) if group_key(q, by) == key]
            tok_s, taus = [], []
            base = []
            for r in range(repeats):
                toks = sum(len(a.tokens) for i in idx for a in results[m][r][i])
                secs = sum(a.seconds for i in idx for a in results[m][r][i])
                fwd = sum(a.forwards for i in idx for a in results[m][r][i])
                tok_s.append(toks / secs if secs else 0.0)
                taus.append(toks / fwd if fwd else 1.0)
                base.append(max(sum(len(a.tokens) for i in idx for a in results[b][r][i])
                                / max(sum(a.seconds for i in idx for a in results[b][r][i]), 1e-9) for b in ar_like))
            spd = [t / b for t, b in zip(tok_s, base)]
            same = all([a.tokens for a in results[m][0][i]] == [a.tokens for a in ref[i]] for i in idx)
            out[key] = {"tok_s": statistics.mean(tok_s), "tau": statistics.mean(taus), "speedup": statistics.mean(spd),
                        "speedup_std": statistics.stdev(spd) if len(spd) > 1 else 0.0, "identical": same,
                        "questions": len(idx)}
        return out

    methods = {}
    for m in results:
        hist: dict[int, int] = {}
        for a in (a for qa in results[m][0] for a in qa):
            for n in a.accept_lengths:
                hist[n] = hist.get(n, 0) + 1
        methods[m] = {"overall": stats(m, "all")["all"], "by_language": stats(m, "language"),
                      "by_category": stats(m, "category"), "accept_hist": dict(sorted(hist.items()))}
    import platform

    import torch

    return {"target": target.spec.name, "device": str(target.device), "dtype": str(target.dtype).replace("torch.", ""),
            "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "bundle": str(bundle.root) if bundle is not None else None, "questions": len(questions),
            "max_new_tokens": max_new_tokens, "repeats": repeats, "ar_baselines": ar_like, "methods": methods}


def adaptive_trace(results: dict, questions: list[dict]) -> dict | None:
    """Per-step (language, vocab size, accepted) of one adaspec answer: the answer with the most switches of
    drafter language or vocabulary size (mixed-language questions first on ties); ``switches`` = 0 says none
    switched anywhere."""
    if "adaspec" not in results:
        return None

    def switches(a) -> int:
        keys = [(s.lang, s.vocab_size) for s in a.steps]
        return sum(x != y for x, y in zip(keys, keys[1:]))

    cands = [(switches(a), q["category"] == "mixed", -i, i, t) for i, q in enumerate(questions)
             for t, a in enumerate(results["adaspec"][0][i])]
    n, _, _, pick, turn = max(cands)
    a = results["adaspec"][0][pick][turn]
    return {"question_id": questions[pick]["question_id"], "turn": turn, "text": a.text, "switches": n,
            "steps": [{"lang": s.lang, "vocab_size": s.vocab_size, "new_tokens": s.new_tokens} for s in a.steps]}


def agreement(results: dict, questions: list[dict], target, log=print) -> dict:
    """How each method's greedy answers agree with ``ar``'s, per language: answers identical, tokens before the
    first divergence (mean over the answers that diverge), and at each divergence the margin of the target's
    logits between AR's token and the method's token, recomputed by one forward over the prompt and the common
    prefix in the bench's dtype (rounding-level near-ties have margins near 0; a bug shows large ones).
    Only the first diverging turn of a question is measured (later turns have different prompts)."""
    import torch

    from polyspec.prompts import encode, render

    if "ar" not in results:
        return {}
    fmt, tok = target.spec.prompt_format, target.tokenizer
    ref = results["ar"][0]
    out: dict = {}
    cache: dict = {}
    for m, reps in results.items():
        if m == "ar":
            continue
        per: dict = {}
        for i, q in enumerate(questions):
            key = "mixed" if q["category"] == "mixed" else q["language"]
            g = per.setdefault(key, {"answers": 0, "identical": 0, "prefix": [], "margins": []})
            g["answers"] += 1
            mine, theirs = reps[0][i], ref[i]
            turn = next((t for t, (a, b) in enumerate(zip(mine, theirs)) if a.tokens != b.tokens), None)
            if turn is None:
                g["identical"] += 1
                continue
            a, b = mine[turn].tokens, theirs[turn].tokens
            k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            g["prefix"].append(k)
            if k >= min(len(a), len(b)):
                continue  # one answer ended (EOS / stop string) where the other went on: no token pair
            ck = (i, turn, k)
            if ck not in cache:
                messages = []
                for t in range(turn):
                    messages += [{"role": "user", "content": q["turns"][t]},
                                 {"role": "assistant", "content": theirs[t].text.strip() or "…"}]
                messages.append({"role": "user", "content": q["turns"][turn]})
                ids = encode(fmt, tok, render(fmt, tok, messages)) + b[:k]
                with torch.inference_mode():
                    x = torch.tensor([ids], device=target.device)
                    cache[ck] = target.model(input_ids=x, logits_to_keep=1).logits[0, -1].float()
            lg = cache[ck]
            g["margins"].append(float(lg[b[k]] - lg[a[k]]))
        out[m] = {}
        for key, g in per.items():
            ms = sorted(abs(x) for x in g["margins"])
            out[m][key] = {"answers": g["answers"], "identical": g["identical"],
                           "mean_tokens_before_divergence": statistics.mean(g["prefix"]) if g["prefix"] else None,
                           "margins": g["margins"], "margin_median": statistics.median(ms) if ms else None,
                           "margin_max": max(ms) if ms else None}
    return out


def render_markdown(r: dict) -> str:
    langs = sorted({k for m in r["methods"].values() for k in m["by_language"]}, key=lambda x: (x == "mixed", x))
    head = "| method | " + " | ".join(f"{lang} Spd. | {lang} τ" for lang in langs) + " | all Spd. | all τ | identical |"
    sep = "|" + "---|" * (2 * len(langs) + 4)
    rows = []
    for m, d in r["methods"].items():
        cells = []
        for lang in langs:
            x = d["by_language"].get(lang)
            cells += [f"{x['speedup']:.2f}×" if x else "–", f"{x['tau']:.2f}" if x else "–"]
        o = d["overall"]
        std = f" ± {o['speedup_std']:.2f}" if r["repeats"] > 1 else ""
        rows.append(f"| {m} | " + " | ".join(cells) + f" | {o['speedup']:.2f}×{std} | {o['tau']:.2f} | "
                    f"{'yes' if o['identical'] else 'NO'} |")
    cats = sorted({k for m in r["methods"].values() for k in m["by_category"]})
    chead = "| method | " + " | ".join(cats) + " |"
    crows = [f"| {m} | " + " | ".join(f"{d['by_category'][c]['speedup']:.2f}× / {d['by_category'][c]['tau']:.2f}"
                                     for c in cats) + " |" for m, d in r["methods"].items()]
    ar = r["methods"].get("ar", {}).get("overall", {})
    lines = [
        f"# Evaluation — {r['target']} on {r['device']} ({r['dtype']}, {r['threads']} threads)",
        "",
        f"{r['questions']} questions, max {r['max_new_tokens']} new tokens, {r['repeats']} repeat(s); bundle "
        f"`{r['bundle']}`. Spd. = tokens/s over the faster of {', '.join(r['ar_baselines'])} on the same questions; "
        f"τ = tokens per target forward. AR: {ar.get('tok_s', 0):.1f} tokens/s. Drafter γ: "
        + (f"{r['gamma']} (`--gamma`)." if r.get("gamma") else "the bundle's calibration."),
        "",
        "## Speedup and τ per language (mixed = questions switching language)",
        "", head, sep, *rows, "",
        "## Speedup / τ per task", "", chead, "|" + "---|" * (len(cats) + 1), *crows, "",
        *agreement_lines(r),
        "Charts: `speedup.png`, `tau.png`, `accept_hist.png`, `adaptive_trace.png`"
        + (f" (question {r['trace']['question_id']}: {r['trace']['switches']} switches of drafter language or "
           "vocabulary size)" if r.get("trace") and r["trace"]["switches"] else
           " (no adaspec answer switched drafter language or vocabulary size)" if r.get("trace") else "") + ".", "",
        *(f"Left out (failed): {m} — {why}" for m, why in r.get("failed", {}).items()),
    ]
    return "\n".join(lines)


def agreement_lines(r: dict) -> list[str]:
    ag = r.get("agreement") or {}
    if not ag:
        return []
    exact = "fp32: speculative greedy output must equal AR's token for token (tested)" if r["dtype"] == "float32" else (
        f"{r['dtype']}: a k-token verification and a 1-token forward round differently, so near-ties can flip a "
        "greedy token; each divergence's AR logit margin says whether it was a near-tie")
    def f(x, p=2):
        return "–" if x is None else f"{x:.{p}f}"

    rows = []
    for m, per in ag.items():
        for lang in sorted(per, key=lambda x: (x == "mixed", x)):
            g = per[lang]
            rows.append(f"| {m} | {lang} | {g['identical']}/{g['answers']} | {f(g['mean_tokens_before_divergence'], 1)} | "
                        f"{f(g['margin_median'], 3)} | {f(g['margin_max'], 3)} |")
    return ["## Agreement with `ar` (greedy, same dtype)", "", exact + ".", "",
            "| method | language | identical answers | tokens before 1st divergence (mean) | |margin| median | |margin| max |",
            "|---|---|---|---|---|---|", *rows, ""]


def charts(r: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(r["methods"])
    langs = sorted({k for m in r["methods"].values() for k in m["by_language"]}, key=lambda x: (x == "mixed", x))
    for metric, fname, label in (("speedup", "speedup.png", "speedup vs fastest AR"), ("tau", "tau.png", "τ (tokens / target forward)")):
        fig, ax = plt.subplots(figsize=(max(6, len(langs) * 1.4), 4))
        w = 0.8 / max(len(methods), 1)
        for i, m in enumerate(methods):
            vals = [r["methods"][m]["by_language"].get(lang, {}).get(metric, 0) for lang in langs]
            ax.bar([j + i * w for j in range(len(langs))], vals, width=w, label=m, color=plt.cm.tab20(i % 20))
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(langs))], langs)
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_ylabel(label)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in methods:
        h = r["methods"][m]["accept_hist"]
        if h and m not in AR_METHODS:
            xs = sorted(int(k) for k in h)
            total = sum(h.values())
            ax.plot(xs, [h[k] / total for k in xs], marker="o", label=m)
    ax.set_xlabel("tokens per step")
    ax.set_ylabel("share of steps")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "accept_hist.png", dpi=110)
    plt.close(fig)
    tr = r.get("trace")
    fig, ax = plt.subplots(figsize=(8, 2.8))
    if tr and tr["steps"]:
        lang_ids = {lang: i for i, lang in enumerate(sorted({s["lang"] for s in tr["steps"]}))}
        xs = list(range(len(tr["steps"])))
        ax.step(xs, [lang_ids[s["lang"]] for s in tr["steps"]], where="post", label="drafter language")
        ax.set_yticks(list(lang_ids.values()), list(lang_ids))
        ax2 = ax.twinx()
        ax2.plot(xs, [s["vocab_size"] or 0 for s in tr["steps"]], color="tab:orange", lw=0.8, label="vocab size")
        ax2.set_ylabel("vocab size")
        ax.set_xlabel(f"step (question {tr['question_id']})")
    ax.set_title("ADASPEC adaptive trace" + ("" if not tr or tr["switches"] else
                                              " — no answer switched language or vocabulary size"))
    fig.tight_layout()
    fig.savefig(out / "adaptive_trace.png", dpi=110)
    plt.close(fig)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m decoder.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--questions", default=None, help="Spec-Bench question.jsonl (default: built-in mini Multi-SpecBench)")
    ap.add_argument("--langs", default=None, help="comma-separated; default: the bundle's languages (+ mixed)")
    ap.add_argument("--categories", default=None)
    ap.add_argument("--per-cell", type=int, default=None, help="questions per (language, category)")
    ap.add_argument("--methods", default=DEFAULT_METHODS)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--assistant", default=None, help="hf-assistant folder for hf-assisted")
    ap.add_argument("--out", default=None, help="default: <bundle>/../../eval or runs/default/eval")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--engine-bundle", default=None,
                    help="the EAGLE-3 drafters engines load (<run>/export/engines/bundle): method eagle3 runs them")
    ap.add_argument("--gamma", type=int, default=None,
                    help="γ of the drafter methods (adaspec, chain, tree, spide) instead of the bundle's calibrated one")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)

    from export.bundle import load_bundle
    from polyspec.targets import load_target

    target = load_target(args.target, device=args.device, dtype=args.dtype)
    bundle = load_bundle(args.bundle, target_pin=target.pin()) if args.bundle else None
    engines = load_bundle(args.engine_bundle, target_pin=target.pin()) if args.engine_bundle else None
    langs = args.langs.split(",") if args.langs else (bundle.languages if bundle else None)
    qs = load_questions(args.questions, langs, args.per_cell, args.categories.split(",") if args.categories else None)
    out = Path(args.out) if args.out else (Path(args.bundle).resolve().parent.parent / "eval" if args.bundle
                                           else Path("runs/default/eval"))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    report = run_bench(target, bundle, qs, methods, args.max_new_tokens, args.repeats, out,
                       assistant=args.assistant, log=lambda m: print(f"note: {m}", file=sys.stderr), gamma=args.gamma,
                       engine_bundle=engines)
    for m, d in report["methods"].items():
        o = d["overall"]
        print(f"{m:16s} speedup {o['speedup']:.2f}×  τ {o['tau']:.2f}  {o['tok_s']:.1f} tok/s  identical {o['identical']}")
    print(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
