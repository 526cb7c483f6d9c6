"""The bench's report: summary statistics, agreement with ``ar``, ``report.md`` and the PNG charts.

    report = summarize(results, questions, target, bundle, max_new_tokens, repeats)  # → report.json
    report["agreement"] = agreement(results, questions, target)
    text = render_markdown(report)                                                  # → report.md
    charts(report, out)

``results``: method → repeat → question → the answers to its turns (``Answer``).
"""

from __future__ import annotations

import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from decoder.methods import BASELINES, METHODS
from polyspec.prompts import encode, render


@dataclass
class Answer:
    """One method's answer to one turn."""

    tokens: list[int]
    text: str
    forwards: int  # target forwards, the prefill included
    seconds: float
    # tokens emitted per step (the decoder's methods)
    accept_lengths: list[int] = field(default_factory=list)
    steps: list = field(default_factory=list)  # decoder.core.StepStat per step


def by_source(steps: list) -> dict:
    """Steps, emitted tokens and seconds (drafting + verification) per proposer of a step's first
    draft (``StepStat.source``: ``pld``, ``drafter``, ``spectra``, ``a+b`` when merged; ``none``:
    nothing was proposed, a plain forward) — where a method's tokens and time went, e.g. which of
    the hybrid's arms ran."""
    out: dict[str, dict] = {}
    for s in steps:
        d = out.setdefault(s.source or "none", {"steps": 0, "tokens": 0, "seconds": 0.0})
        d["steps"] += 1
        d["tokens"] += s.new_tokens
        d["seconds"] = round(d["seconds"] + s.draft_s + s.verify_s, 6)
    return out


def summarize(
    results: dict, questions: list[dict], target, bundle, max_new_tokens: int, repeats: int
) -> dict:
    """Per method: tok/s, τ, speedup over the faster baseline (mean ± std over repeats), identical
    to ``ar``; overall, per language (mixed questions apart) and per task; the histogram of tokens
    per step."""
    ar_like = [m for m in BASELINES if m in results]
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
                base.append(
                    max(
                        sum(len(a.tokens) for i in idx for a in results[b][r][i])
                        / max(sum(a.seconds for i in idx for a in results[b][r][i]), 1e-9)
                        for b in ar_like
                    )
                )
            spd = [t / b for t, b in zip(tok_s, base)]
            same = all(
                [a.tokens for a in results[m][0][i]] == [a.tokens for a in ref[i]] for i in idx
            )
            out[key] = {
                "tok_s": statistics.mean(tok_s),
                "tau": statistics.mean(taus),
                "tau_repeats": taus,
                "speedup": statistics.mean(spd),
                "speedup_std": statistics.stdev(spd) if len(spd) > 1 else 0.0,
                "identical": same,
                "questions": len(idx),
            }
        return out

    methods = {}
    for m in results:
        hist: dict[int, int] = {}
        for a in (a for qa in results[m][0] for a in qa):
            for n in a.accept_lengths:
                hist[n] = hist.get(n, 0) + 1
        steps: dict[str, list] = {}  # the first repeat's steps per language
        for i, q in enumerate(questions):
            steps.setdefault(group_key(q, "language"), []).extend(
                s for a in results[m][0][i] for s in a.steps
            )
        methods[m] = {
            "overall": stats(m, "all")["all"],
            "by_language": stats(m, "language"),
            "by_category": stats(m, "category"),
            "accept_hist": dict(sorted(hist.items())),
            "steps_by_source": {lang: by_source(x) for lang, x in steps.items()},
        }
    # start-up time: the bench CLI checks its inputs before torch loads (decoder.bench)
    import torch

    return {
        "target": target.spec.name,
        "device": str(target.device),
        "dtype": str(target.dtype).replace("torch.", ""),
        "exact": bool(getattr(target, "exact", False)),
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        **(
            {"cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled()}
            if target.device.type == "cuda"
            else {}
        ),
        "bundle": str(bundle.root) if bundle is not None else None,
        "questions": len(questions),
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "ar_baselines": ar_like,
        "methods": methods,
    }


def adaptive_trace(results: dict, questions: list[dict]) -> dict | None:
    """Per-step (language, vocab size, accepted) of one adaspec answer: the answer with the most
    switches of drafter language or vocabulary size (mixed-language questions first on ties);
    ``switches`` = 0 says none switched anywhere."""
    if "adaspec" not in results:
        return None

    def switches(a) -> int:
        keys = [(s.lang, s.vocab_size) for s in a.steps]
        return sum(x != y for x, y in zip(keys, keys[1:]))

    cands = [
        (switches(a), q["category"] == "mixed", -i, i, t)
        for i, q in enumerate(questions)
        for t, a in enumerate(results["adaspec"][0][i])
    ]
    n, _, _, pick, turn = max(cands)
    a = results["adaspec"][0][pick][turn]
    return {
        "question_id": questions[pick]["question_id"],
        "turn": turn,
        "text": a.text,
        "switches": n,
        "steps": [
            {"lang": s.lang, "vocab_size": s.vocab_size, "new_tokens": s.new_tokens}
            for s in a.steps
        ],
    }


def agreement(results: dict, questions: list[dict], target, log=print) -> dict:
    """How each method's greedy answers agree with ``ar``'s, per language: answers identical, tokens
    before the first divergence (mean over the answers that diverge), and at each divergence the
    margin of the target's logits between AR's token and the method's token, recomputed by one
    forward over the prompt and the common prefix in the bench's dtype (rounding-level near-ties
    have margins near 0; a bug shows large ones). Only the first diverging turn of a question is
    measured (later turns have different prompts)."""
    # start-up time: the bench CLI checks its inputs before torch loads (decoder.bench)
    import torch

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
            turn = next(
                (t for t, (a, b) in enumerate(zip(mine, theirs)) if a.tokens != b.tokens), None
            )
            if turn is None:
                g["identical"] += 1
                continue
            a, b = mine[turn].tokens, theirs[turn].tokens
            k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            g["prefix"].append(k)
            if k >= min(len(a), len(b)):
                # one answer ended (EOS / stop string) where the other went on: no token pair
                continue
            ck = (i, turn, k)
            if ck not in cache:
                messages = []
                for t in range(turn):
                    messages += [
                        {"role": "user", "content": q["turns"][t]},
                        {"role": "assistant", "content": theirs[t].text.strip() or "…"},
                    ]
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
            out[m][key] = {
                "answers": g["answers"],
                "identical": g["identical"],
                "mean_tokens_before_divergence": statistics.mean(g["prefix"])
                if g["prefix"]
                else None,
                "margins": g["margins"],
                "margin_median": statistics.median(ms) if ms else None,
                "margin_max": max(ms) if ms else None,
            }
    return out


def render_markdown(r: dict) -> str:
    langs = sorted(
        {k for m in r["methods"].values() for k in m["by_language"]},
        key=lambda x: (x == "mixed", x),
    )
    head = (
        "| method | "
        + " | ".join(f"{lang} Spd. | {lang} τ" for lang in langs)
        + " | all Spd. | all τ | identical |"
    )
    sep = "|" + "---|" * (2 * len(langs) + 4)
    rows = []
    for m, d in r["methods"].items():
        cells = []
        for lang in langs:
            x = d["by_language"].get(lang)
            cells += [f"{x['speedup']:.2f}×" if x else "–", f"{x['tau']:.2f}" if x else "–"]
        o = d["overall"]
        std = f" ± {o['speedup_std']:.2f}" if r["repeats"] > 1 else ""
        rows.append(
            f"| {m} | " + " | ".join(cells) + f" | {o['speedup']:.2f}×{std} | {o['tau']:.2f} | "
            f"{'yes' if o['identical'] else 'NO'} |"
        )
    cats = sorted({k for m in r["methods"].values() for k in m["by_category"]})
    chead = "| method | " + " | ".join(cats) + " |"
    crows = [
        f"| {m} | "
        + " | ".join(
            f"{d['by_category'][c]['speedup']:.2f}× / {d['by_category'][c]['tau']:.2f}"
            for c in cats
        )
        + " |"
        for m, d in r["methods"].items()
    ]
    ar = r["methods"].get("ar", {}).get("overall", {})
    lines = [
        f"# Evaluation — {r['target']} on {r['device']} ({r['dtype']}, {r['threads']} threads)",
        "",
        f"{r['questions']} questions, max {r['max_new_tokens']} new tokens, {r['repeats']} "
        "repeat(s); bundle "
        f"`{r['bundle']}`. Spd. = tokens/s over the faster of {', '.join(r['ar_baselines'])} on "
        "the same questions; "
        f"τ = tokens per target forward. AR: {ar.get('tok_s', 0):.1f} tokens/s. Drafter γ: "
        + (f"{r['gamma']} (`--gamma`)." if r.get("gamma") else "the bundle's calibration."),
        "",
        "## Speedup and τ per language (mixed = questions switching language)",
        "",
        head,
        sep,
        *rows,
        "",
        "## Speedup / τ per task",
        "",
        chead,
        "|" + "---|" * (len(cats) + 1),
        *crows,
        "",
        *agreement_lines(r),
        *source_lines(r),
        "Charts: `speedup.png`, `tau.png`, `accept_hist.png`, `adaptive_trace.png`"
        + (
            f" (question {r['trace']['question_id']}: {r['trace']['switches']} switches of "
            "drafter language or "
            "vocabulary size)"
            if r.get("trace") and r["trace"]["switches"]
            else " (no adaspec answer switched drafter language or vocabulary size)"
            if r.get("trace")
            else ""
        )
        + ".",
        "",
        *failure_lines(r),
        *method_lines(r),
    ]
    return "\n".join(lines)


def source_lines(r: dict) -> list[str]:
    """Where the steps went, for the methods whose steps come from more than one source (the
    hybrid's arms, adaspec's loop runs): per language, each source's share of the steps, tokens per
    step and tokens per second."""
    rows = []
    for m, d in r["methods"].items():
        per = d.get("steps_by_source") or {}
        if len({src for x in per.values() for src in x}) < 2:
            continue
        for lang in sorted(per, key=lambda x: (x == "mixed", x)):
            n = sum(x["steps"] for x in per[lang].values())
            cells = [
                f"{src} {x['steps'] / n:.0%} · {x['tokens'] / x['steps']:.2f} · "
                f"{x['tokens'] / max(x['seconds'], 1e-9):.0f}"
                for src, x in sorted(per[lang].items(), key=lambda kv: -kv[1]["steps"])
            ]
            rows.append(f"| {m} | {lang} | {n} | " + "; ".join(cells) + " |")
    if not rows:
        return []
    return [
        "## Where the steps went",
        "",
        "Per source of a step's first draft (`none`: nothing proposed, one plain forward; `a+b`: "
        "merged): share "
        "of the steps · tokens per step · tokens per second of those steps (first repeat).",
        "",
        "| method | language | steps | by source |",
        "|---|---|---|---|",
        *rows,
        "",
    ]


def agreement_lines(r: dict) -> list[str]:
    ag = r.get("agreement") or {}
    if not ag:
        return []
    if r.get("exact"):
        exact = (
            f"{r['dtype']}, shape-invariant forwards (`--exact`, polyspec/exact.py): a k-token "
            "verification "
            "computes what a 1-token forward computes, bit for bit, so every greedy answer must "
            "equal AR's"
        )
    elif r["dtype"] == "float32":
        exact = "fp32: speculative greedy output must equal AR's token for token (tested)"
    else:
        exact = (
            f"{r['dtype']}, not shape-invariant (`--exact off`): a k-token verification and a "
            "1-token forward "
            "round differently, so near-ties can flip a greedy token; each divergence's AR logit "
            "margin says "
            "whether it was a near-tie"
        )

    def f(x, p=2):
        return "–" if x is None else f"{x:.{p}f}"

    rows = []
    for m, per in ag.items():
        for lang in sorted(per, key=lambda x: (x == "mixed", x)):
            g = per[lang]
            rows.append(
                f"| {m} | {lang} | {g['identical']}/{g['answers']} | "
                f"{f(g['mean_tokens_before_divergence'], 1)} | "
                f"{f(g['margin_median'], 3)} | {f(g['margin_max'], 3)} |"
            )
    return [
        "## Agreement with `ar` (greedy, same dtype)",
        "",
        exact + ".",
        "",
        "| method | language | identical answers | tokens before 1st divergence (mean) | |margin| "
        "median | |margin| max |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def charts(r: dict, out: Path) -> None:
    """``speedup.png``, ``tau.png`` (per language), ``accept_hist.png`` and
    ``adaptive_trace.png``."""
    import matplotlib  # start-up time: matplotlib (~1 s) loads only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(r["methods"])
    langs = sorted(
        {k for m in r["methods"].values() for k in m["by_language"]},
        key=lambda x: (x == "mixed", x),
    )
    for metric, fname, label in (
        ("speedup", "speedup.png", "speedup vs fastest AR"),
        ("tau", "tau.png", "τ (tokens / target forward)"),
    ):
        fig, ax = plt.subplots(figsize=(max(6, len(langs) * 1.4), 4))
        w = 0.8 / max(len(methods), 1)
        for i, m in enumerate(methods):
            vals = [r["methods"][m]["by_language"].get(lang, {}).get(metric, 0) for lang in langs]
            ax.bar(
                [j + i * w for j in range(len(langs))],
                vals,
                width=w,
                label=m,
                color=plt.cm.tab20(i % 20),
            )
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
        if h and m not in BASELINES:
            xs = sorted(int(k) for k in h)
            total = sum(h.values())
            ax.plot(xs, [h[k] / total for k in xs], marker="o", label=m)
    ax.set_xlabel("tokens per step")
    ax.set_ylabel("share of steps")
    if ax.get_legend_handles_labels()[0]:  # none when only the baselines ran
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "accept_hist.png", dpi=110)
    plt.close(fig)
    tr = r.get("trace")
    fig, ax = plt.subplots(figsize=(8, 2.8))
    if tr and tr["steps"]:
        lang_ids = {lang: i for i, lang in enumerate(sorted({s["lang"] for s in tr["steps"]}))}
        xs = list(range(len(tr["steps"])))
        ax.step(
            xs, [lang_ids[s["lang"]] for s in tr["steps"]], where="post", label="drafter language"
        )
        ax.set_yticks(list(lang_ids.values()), list(lang_ids))
        ax2 = ax.twinx()
        ax2.plot(
            xs,
            [s["vocab_size"] or 0 for s in tr["steps"]],
            color="tab:orange",
            lw=0.8,
            label="vocab size",
        )
        ax2.set_ylabel("vocab size")
        ax.set_xlabel(f"step (question {tr['question_id']})")
    ax.set_title(
        "ADASPEC adaptive trace"
        + ("" if not tr or tr["switches"] else " — no answer switched language or vocabulary size")
    )
    fig.tight_layout()
    fig.savefig(out / "adaptive_trace.png", dpi=110)
    plt.close(fig)


def failure_lines(r: dict) -> list[str]:
    """The methods that failed (where, and the error's first line) and those skipped (why)."""
    lines = []
    if r.get("failed"):
        lines += [
            "## Failed methods",
            "",
            "Left out of the tables above; answers given before the failure are in "
            "`answers/<method>.jsonl`.",
            "",
        ]
        for f in r["failed"]:
            where = (
                "while being built"
                if f["question_id"] is None
                else (
                    f"on question {f['question_id']}"
                    + (" (warm-up)" if f["phase"] == "warm-up" else "")
                )
            )
            lines.append(f"- `{f['method']}` failed {where}: {f['error']}")
        lines.append("")
    if r.get("skipped"):
        lines += [
            "## Skipped methods",
            "",
            *(f"- `{m}`: {why}" for m, why in r["skipped"].items()),
            "",
        ]
    return lines


def method_lines(r: dict) -> list[str]:
    """What each method of the report is (``decoder.methods``)."""
    names = [
        m for m in [*r["methods"], *(f["method"] for f in r.get("failed", []))] if m in METHODS
    ]
    if not names:
        return []
    return [
        "## Methods",
        "",
        *(f"- `{m}` ({METHODS[m].title}): {METHODS[m].paper}" for m in dict.fromkeys(names)),
        "",
    ]
