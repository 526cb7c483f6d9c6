"""The vLLM check's summaries, draft length and tables: each run against plain
(:func:`summarize_run`), the draft length per drafter (:func:`choose_length`), ``<out>/vllm.json``
and ``<out>/vllm.md`` (:func:`write`, :func:`markdown`), and what was measured written into an
export's ``engines.json`` (:func:`write_engines`).

**Draft length.** Per drafter, from its batch-1 runs: each step's cost in plain forwards, (seconds −
the prompts' prefill) / drafts ÷ plain's seconds per token, fitted as 1 + a + c·k
(``engines.draft_length.fit_step_cost`` with a flat verify curve: the sweep measures the whole
step); vLLM's α from the longest run; the predicted speedup E(k) / (1 + a + c·k) for k ≤ 8 and the
measured ones → ``draft_n`` (``engines.draft_length.choose``; a chosen length not run yet is run
too). Written into ``--engines`` (``engines.json``: ``draft_n.vllm``, the serve command, and
``num_speculative_tokens_per_batch_size.vllm``: each measured batch size's best measured length, 0
where no length beat plain there).
"""

from __future__ import annotations

from pathlib import Path

from engines import draft_length
from polyspec.draft_length import TOLERANCE, shortest_within
from polyspec.errors import PolyspecError
from polyspec.io import atomic_write_json, atomic_write_text, read_json_or_none

# the verify curve as the fit sees it: the sweep's step costs already hold verification
FLAT = {1: 1.0, 2: 1.0}
# What the report's numbers mean (its "definitions").
DEFINITIONS = {
    "tok/s": "generated tokens / seconds of vLLM's generate calls (warm-up call excluded)",
    "speedup": "tok/s / plain's tok/s at the same batch size, same prompts",
    "alpha_i": "accepted_per_pos[i] / drafts: the share of verification steps that kept the first "
    "i drafts",
    "tokens_per_step": "1 + accepted / drafts (vLLM's mean acceptance length)",
    "tau": "tokens / (drafts + prompts): tokens per target forward, the prefill counted as one "
    "(not for ngram: "
    "vLLM counts only its steps that found a match)",
    "identical": "token ids equal to plain's at the same batch size",
    "margin": "plain's logprob of its token − of the mode's token at the first divergence (top 5 "
    "probed)",
    "hybrid": "the plugin's hybrid (hybrid-m<m>@<d>): prompt lookup's drafts where the context's "
    "last m tokens recur, else the drafter's d; m from engines.vllm.calibrate (tokens per cost: "
    "(1 + accepted) / (1 + c·drafts), c from the step-cost fit)",
    "draft_n": "engines.draft_length.choose: E(k) / (1 + a + c·k) with vLLM's α and the step cost "
    "fitted "
    "from the batch-1 sweep, overruled by a measured speedup > 5 % better",
}


# ---------------------------------------------------------------------------------------- summaries


def summarize_run(run: dict, plain: dict, prompts: int) -> dict:
    s = run["spec"]
    out = {
        "tokens": run["tokens"],
        "seconds": round(run["seconds"], 3),
        "tok_s": round_or_none(run["tok_s"], 2),
        "speedup": round_or_none(run["tok_s"] / plain["tok_s"], 4)
        if run["tok_s"] and plain["tok_s"]
        else None,
        "drafts": s["drafts"],
        "draft_tokens": s["draft_tokens"],
        "accepted": s["accepted"],
    }
    if s["drafts"]:
        out["alpha"] = [round(a / s["drafts"], 4) for a in s["accepted_per_pos"]]
        out["tokens_per_step"] = round(1 + s["accepted"] / s["drafts"], 4)
        out["acceptance"] = (
            round(s["accepted"] / s["draft_tokens"], 4) if s["draft_tokens"] else None
        )
        # tokens / target forwards, prefill = 1
        out["tau"] = round(run["tokens"] / (s["drafts"] + prompts), 4)
    return out


def choose_length(
    mode_runs: dict[int, dict], plain: dict, prefill_s: float, prompts: int, k_max: int
) -> dict | None:
    """``mode_runs``: draft length → batch-1 run of one drafter. The step cost fit, vLLM's α (the
    longest run's), the predicted and measured speedups, and the chosen ``draft_n``
    (engines.draft_length), no longer than the longest length measured: past it both α and the
    step cost would be extrapolated."""
    runs = {
        k: {"decode_s": r["seconds"] - prefill_s, "steps": r["spec"]["drafts"], "mean_draft": k}
        for k, r in mode_runs.items()
        if r["spec"]["drafts"]
    }
    if not runs or not plain["tok_s"]:
        return None
    plain_step = (plain["seconds"] - prefill_s) / max(plain["tokens"] - prompts, 1)
    fit = draft_length.fit_step_cost(runs, plain_step, FLAT)
    longest = mode_runs[max(runs)]["spec"]
    alpha = [a / longest["drafts"] for a in longest["accepted_per_pos"]]
    measured = {k: r["tok_s"] / plain["tok_s"] for k, r in mode_runs.items() if r["tok_s"]}
    k_max = min(k_max, max(runs))
    pick = draft_length.choose(alpha, FLAT, fit["a"], fit["c"], k_max=k_max, measured=measured)
    return {
        **pick,
        "alpha": [round(a, 4) for a in alpha],
        "alpha_from": f"vLLM, draft length {max(runs)}",
        "step_cost": {
            "a": round(fit["a"], 4),
            "c": round(fit["c"], 4),
            "points": [
                {k: round(v, 4) if isinstance(v, float) else v for k, v in p.items()}
                for p in fit["points"]
            ],
        },
    }


def best_measured(speedups: dict[int, float], tolerance: float = TOLERANCE) -> int | None:
    """The shortest draft length within ``tolerance`` of the best measured speedup."""
    return shortest_within(speedups, tolerance) if speedups else None


def batch_schedule(speedups: dict[int, dict[int, float]]) -> list[list[int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size`` from measured speedups (batch size → {draft
    length: tok/s over plain's}): the batch sizes above the previous measured one up to each
    measured ``b`` draft ``b``'s best measured length, or 0 (no drafts) where none beat plain; vLLM
    carries the last range's K to larger batches. → [[start, end, K], …]."""
    out, start = [], 1
    for b in sorted(speedups):
        k, best = max(speedups[b].items(), key=lambda kv: (kv[1], -kv[0]), default=(0, 0.0))
        out.append([start, b, k if best > 1.0 else 0])
        start = b + 1
    return out


def round_or_none(x: float | None, nd: int) -> float | None:
    return None if x is None else round(x, nd)


# ------------------------------------------------------------------------------------- engines.json


def polyspec_alpha(report: dict, engines_json: Path | None) -> None:
    """Each drafter's held-out α as polyspec scored it (``engines.json``) beside vLLM's, in its
    draft-length entry."""
    rec = read_json_or_none(engines_json) if engines_json else None
    for name, d in report["draft_length"].items():
        alpha, source = draft_length.drafter_alpha_from(rec, name, str(engines_json))
        d["polyspec_alpha"], d["polyspec_alpha_from"] = alpha, source


def write_engines(engines_json: Path, report: dict, out: Path) -> None:
    """What vLLM was measured to do into an export's ``engines.json``: each drafter's chosen
    ``draft_n`` (and the serve command's), the measured speedups, or why vLLM serves no EAGLE-3
    drafter for this target."""
    rec = read_json_or_none(engines_json)
    if rec is None:
        raise PolyspecError(f"{engines_json} not found: --engines names an export's engines.json")
    lengths = {k: d for k, d in report["draft_length"].items() if k in rec.get("drafters", {})}
    draft_length.set_draft_lengths(rec, lengths, "vllm")
    for name, h in (report.get("hybrid") or {}).items():  # the calibrated hybrid, for serving
        if name in rec.get("drafters", {}) and h["ngram_min"] <= h["ngram_max"]:
            keys = (
                "ngram_min",
                "ngram_max",
                "drafter_tokens",
                "ngram_tokens",
                "drafter_max_batch",
                "schedule",
            )
            rec["drafters"][name].setdefault("hybrid", {})["vllm"] = {
                k: h[k] for k in keys if k in h
            }
    for name, d in lengths.items():  # the draft length by batch size, 0 where drafting lost
        if d.get("schedule"):
            rec["drafters"][name].setdefault("num_speculative_tokens_per_batch_size", {})[
                "vllm"
            ] = d["schedule"]
    table = rec.setdefault("engines", {}).setdefault("vllm", {"format": "speculators"})
    table["tested_here"] = (
        f"make check-vllm: vLLM {report['vllm']['version']} on {report['machine']['host']}, "
        f"{report['settings']['dtype']} → {out / 'vllm.md'}"
    )
    ngram = next((m["by_batch"] for m in report["modes"] if m["mode"] == "ngram"), {})
    table["measured"] = {
        **{
            name: {"draft_n": d["draft_n"], "speedup": d["measured_speedup"].get(d["draft_n"])}
            for name, d in lengths.items()
        },
        "ngram": {b: r.get("speedup") for b, r in ngram.items()},
    }
    if not report["vllm"].get("eagle3_for_target", True):
        table["loads"] = []
        table["why"] = next(
            iter((report.get("refused") or {}).values()), "no EAGLE-3 for this target in vLLM"
        )
    atomic_write_json(engines_json, rec)


# ------------------------------------------------------------------------------------------- report


def _f(x, fmt: str = "{:.2f}", none: str = "—") -> str:
    return none if x is None else fmt.format(x)


def _schedule_line(lead: str, schedule: list[list[int]]) -> str:
    """A draft-length-by-batch-size schedule in words."""
    ranges = ", ".join(f"{a}–{b}: {k}" for a, b, k in schedule)
    return f"{lead}`num_speculative_tokens_per_batch_size`, 0 = no drafts): {ranges}."


def _by_lang_lines(report: dict, batches: list[int]) -> list[str]:
    """The modes that ran several languages (ngram, a multilingual drafter, its hybrid), one row
    per language: × plain per batch size and vLLM's α at the first."""
    rows = []
    for e in report["modes"]:
        by = {b: (e["by_batch"].get(b) or e["by_batch"].get(str(b)) or {}) for b in batches}
        for lang in e["langs"] if any("by_lang" in r for r in by.values()) else []:
            parts = [by[b].get("by_lang", {}).get(lang, {}) for b in batches]
            rows.append(
                f"| {e['mode']} | {e['drafter'] or '—'} | {lang} | "
                + " | ".join(_f(r.get("speedup"), "{:.2f}×") for r in parts)
                + " | "
                + (", ".join(f"{a:.2f}" for a in parts[0].get("alpha") or []) or "—")
                + " |"
            )
    if not rows:
        return []
    head = ["mode", "drafter", "language"] + [f"b{b} ×" for b in batches] + ["α₁…α_k (vLLM)"]
    return _table_section("By language (the modes that ran several)", head, rows)


def _table_section(title: str, head: list[str], rows: list[str]) -> list[str]:
    """A report section: its heading and a table of ``head`` over ``rows`` (rows already cells)."""
    return ["", f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head), *rows]


def per_language_choice(report: dict, batches: list[int]) -> dict:
    """ADASPEC per request against its alternatives, on the same prompts (issue: which default):
    per batch size, × plain of ``adaspec@k`` (one server, a drafter per language), the one
    multilingual drafter (``eagle3@k``) and one server per language (the language drafters'
    ``eagle3@k`` runs together: their tokens over their summed seconds, against plain on every
    prompt). {} where adaspec did not run."""
    modes = report["modes"]
    ada = [e for e in modes if e["mode"].startswith("adaspec@")]
    if not ada:
        return {}
    k = ada[0]["mode"].split("@")[1]
    multi = ada[0]["drafter"]
    at = lambda e, b: e["by_batch"].get(b) or e["by_batch"].get(str(b)) or {}  # noqa: E731
    plain = report["plain"]
    out = {}
    for b in batches:
        ref = plain.get(b) or plain.get(str(b)) or {}
        own = [
            at(e, b)
            for e in modes
            if e["mode"] == f"eagle3@{k}" and e["drafter"] in e["langs"] and len(e["langs"]) == 1
        ]
        servers = (
            sum(r["tokens"] for r in own) / sum(r["seconds"] for r in own)
            if own and all(r.get("seconds") for r in own)
            else None
        )
        row = {
            "one server per language": round_or_none(servers / ref["tok_s"], 4)
            if servers and ref.get("tok_s")
            else None,
        }
        for e in modes:
            if e["mode"] == "ngram":
                row["ngram"] = at(e, b).get("speedup")
            elif e["drafter"] == multi and e["mode"] == f"eagle3@{k}":
                row["the multilingual drafter"] = at(e, b).get("speedup")
            elif e["drafter"] == multi and e["mode"].startswith(("hybrid", "adaspec")):
                adaspec = e["mode"].startswith("adaspec")
                row[e["mode"] if adaspec else f"{e['mode']} (multilingual)"] = at(e, b).get(
                    "speedup"
                )
        out[b] = row
    return out


def _choice_lines(report: dict, batches: list[int]) -> list[str]:
    got = per_language_choice(report, batches)
    if not got:
        return []
    cols = list(dict.fromkeys(c for row in got.values() for c in row))
    return _table_section(
        "One server, a drafter per language (adaspec) or not — × plain on the same prompts",
        ["batch"] + cols,
        [
            f"| {b} | " + " | ".join(_f(row.get(c), "{:.2f}×") for c in cols) + " |"
            for b, row in got.items()
        ],
    )


def markdown(report: dict) -> str:
    st, m = report["settings"], report["machine"]
    batches = st["batches"]
    lines = [
        f"# vLLM: plain vs EAGLE-3 vs n-gram — {report['target']['name']} "
        f"({report['target']['architecture']}, "
        f"{st['dtype']})",
        "",
        f"vLLM {report['vllm']['version']} on {m['host']}, {m['threads']} thread(s); greedy, "
        f"{st['n']} new tokens, "
        f"{sum(st['prompts'].values())} held-out prompts "
        f"({', '.join(f'{k} {v}' for k, v in st['prompts'].items())}); "
        f"batch {', '.join(map(str, batches))} (prompts in groups of that size"
        + ("; the languages mixed in every group" if st.get("mixed") else ", one language a group")
        + "); ngram k "
        f"{st['ngram']['k']}, "
        f"n {st['ngram']['n_max']}..1; enforce_eager {st['enforce_eager']}. Load average "
        f"{m['loadavg_1m_start']} → "
        f"{m.get('loadavg_1m_end', '?')}."
        + (
            f" Plain again at the end: {_f(report['plain_again']['drift'], '{:.2f}')}× its first "
            "tok/s, "
            f"{report['plain_again']['identical']} identical."
            if report.get("plain_again")
            else ""
        ),
        "",
    ]
    for name, msg in (report.get("refused") or {}).items():
        lines += [f"**vLLM refused drafter {name}:** `{msg}`", ""]
    for name, msg in (report.get("failed") or {}).items():
        lines += [f"**{name} failed in vLLM (twice):** `{msg}`", ""]
    head = ["mode", "drafter"]
    for b in batches:
        head += [f"b{b} tok/s (×)", f"b{b} same"]
    head += ["tokens/step", "τ", "α₁…α_k (vLLM)"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines.append(
        "| plain | — | "
        + " | ".join(f"{_f(report['plain'][b]['tok_s'], '{:.1f}')} | —" for b in batches)
        + " | 1 | 1 | — |"
    )
    for e in report["modes"]:
        cells = [e["mode"], e["drafter"] or "—"]
        for b in batches:
            r = e["by_batch"].get(b) or e["by_batch"].get(str(b)) or {}
            same = f"{r.get('identical')}/{r.get('prompts')}"
            worst = [
                c.get("margin")
                for c in (r.get("divergences") or {}).values()
                if c.get("margin") is not None
            ]
            if worst:
                same += f" (margin ≤ {max(worst):.2f})"
            cells += [f"{_f(r.get('tok_s'), '{:.1f}')} ({_f(r.get('speedup'), '{:.2f}×')})", same]
        r1 = e["by_batch"].get(batches[0]) or e["by_batch"].get(str(batches[0])) or {}
        cells += [
            _f(r1.get("tokens_per_step")),
            _f(r1.get("tau")),
            ", ".join(f"{a:.2f}" for a in r1.get("alpha") or []) or "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _by_lang_lines(report, batches)
    lines += _choice_lines(report, batches)
    for name, d in (report.get("draft_length") or {}).items():
        ks = list(d["predicted_speedup"])
        big = list(d.get("best_measured_at_batch", {}).items())
        lines += [
            "",
            f"## Draft length for {name}: {d['draft_n']} ({d['chosen_by']})",
            "",
            f"α {', '.join(f'{x:.2f}' for x in d['alpha'])} ({d['alpha_from']}); polyspec's "
            "held-out α "
            + (
                ", ".join(f"{x:.2f}" for x in d["polyspec_alpha"])
                if d.get("polyspec_alpha")
                else "not recorded"
            )
            + f"; a step costs 1 + "
            f"{d['step_cost']['a']:.2f} + {d['step_cost']['c']:.2f}·k plain forwards (fitted from "
            "the batch-1 "
            "sweep)." + (f" Best measured at batch {big[0][0]}: {big[0][1]}." if big else ""),
            "",
            "| k | " + " | ".join(str(k) for k in ks) + " |",
            "|---|" + "---|" * len(ks),
            "| predicted × | " + " | ".join(f"{d['predicted_speedup'][k]:.2f}" for k in ks) + " |",
            "| measured × | " + " | ".join(_f(d["measured_speedup"].get(k)) for k in ks) + " |",
        ]
        if d.get("schedule"):
            lines += ["", _schedule_line("By batch size (vLLM's ", d["schedule"])]
    for name, h in (report.get("hybrid") or {}).items():
        curve = {int(n): v for n, v in h["curve"].items()}
        ls = sorted(n for n in curve if n > 0)
        lines += [
            "",
            f"## Hybrid for {name}: n-gram rows from {h['ngram_min']}-token matches, else the "
            f"drafter's {h['drafter_tokens']}",
            "",
            f"Prompt lookup on plain's batch-1 answers ({h['ngram_tokens']} drafts, matches up to "
            f"{h['ngram_max']} tokens) against the drafter (tokens per cost "
            f"{h['drafter_value']:.2f}); n-gram rows on {h['ngram_share']:.0%} of the positions.",
            "",
            "| match length | " + " | ".join(str(n) for n in ls) + " |",
            "|---|" + "---|" * len(ls),
            "| share of positions | " + " | ".join(f"{curve[n]['share']:.2f}" for n in ls) + " |",
            "| accepted tokens | " + " | ".join(f"{curve[n]['accepted']:.2f}" for n in ls) + " |",
            "| tokens per cost | "
            + " | ".join(_f(h["ngram_value"].get(str(n), h["ngram_value"].get(n))) for n in ls)
            + " |",
        ]
        if h.get("drafter_max_batch"):
            lines += [
                "",
                f"`{h['unlimited']}` ran below `ngram` at a measured batch size: served with the "
                f"drafter drafting in steps of at most {h['drafter_max_batch']} requests "
                "(n-gram rows alone above; `drafter_max_batch`).",
            ]
        if h.get("schedule"):
            lines += ["", _schedule_line("Served by batch size (", h["schedule"])]
    lines += ["", "## Definitions", ""] + [f"- {k}: {v}" for k, v in report["definitions"].items()]
    return "\n".join(lines) + "\n"


def write(out: Path, report: dict) -> None:
    """``out/vllm.json`` (the report) and ``out/vllm.md`` (its tables)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "vllm.json", report)
    atomic_write_text(out / "vllm.md", markdown(report))
