"""The llama.cpp check's numbers and tables: what llama.cpp's counts give (:func:`spec_metrics`),
the sums over prompts (:func:`summarize`, with the bound from the cost curve),
``<out>/llamacpp.json`` and ``<out>/llamacpp.md`` (:func:`write`, :func:`markdown`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines import draft_length
from polyspec.io import atomic_write_json, atomic_write_text

# What the report's numbers mean (its "definitions").
DEFINITIONS = {
    "plain tok/s": "llama-completion's eval rate (one-token forwards; sampling excluded)",
    "eagle3/ngram tok/s": "llama-speculative-simple's 'decoded … speed' (whole decode loop)",
    "steps": "n_predict - n_accept",
    "acceptance": "n_accept / n_drafted",
    "tokens_per_step": "n_predict / steps = 1 + n_accept / steps (llama.cpp's mean acceptance "
    "length)",
    "tau": "n_predict / (steps + 1) = polyspec's tokens / target forwards (prefill = 1 forward)",
    "identical": "speculative text is a byte prefix of plain's (equal at EOS)",
    "cost ratio": "t(k)/t(1), t(k) = one decode of k tokens at context 256 (llama-batched-bench)",
    "bound": "tokens_per_step / ratio(1 + n_drafted/steps): the speedup with free drafting "
    "(estimate)",
    "draft_length": "engines.draft_length: predicted speedup E(k) / (t(k+1)/t(1) + a + c·k), E(k) "
    "= 1 + α_1…α_k "
    "(the drafter's held-out per-position acceptance), a and c fitted from the eagle3 runs",
}


def spec_metrics(
    tokens: int, n_drafted: int, n_accept: int, runs: int = 1
) -> dict[str, float | int | None]:
    """Derived from llama.cpp's counts (summed over ``runs`` generations): steps S = tokens −
    n_accept (target verifications: each gives its accepted drafts + 1), acceptance = n_accept /
    n_drafted, tokens_per_step = tokens / S (llama.cpp's mean acceptance length, = 1 + n_accept /
    S), tau = tokens / (S + runs) (polyspec's τ = tokens / target forwards, each generation's
    prefill counted as one forward), mean_draft = n_drafted / S."""
    steps = tokens - n_accept
    return {
        "steps": steps,
        "acceptance": n_accept / n_drafted if n_drafted else None,
        "tokens_per_step": tokens / steps if steps > 0 else None,
        "tau": tokens / (steps + runs),
        "mean_draft": n_drafted / steps if steps > 0 else None,
    }


def cost_ratio(curve: dict[int, float], k: float) -> float | None:
    """t(k)/t(1) from the cost curve, linear between measured k (None outside it)."""
    if not curve or 1 not in curve or k < min(curve) or k > max(curve):
        return None
    return draft_length.ratio(curve, k)


def summarize(
    rows: list[dict],
    modes: tuple[str, ...] = ("eagle3", "ngram"),
    curve: dict[int, float] | None = None,
) -> dict:
    """Overall numbers over every prompt: per mode tokens / decode seconds (tok/s = their ratio),
    speedup over plain's, and for speculative modes the summed counts → acceptance, tokens per step,
    τ, identical count."""
    out: dict[str, Any] = {}
    plain = [r["plain"] for r in rows if r.get("plain")]
    ptok, psec = sum(p["runs"] for p in plain), sum(p["decode_s"] for p in plain)
    out["plain"] = {
        "prompts": len(plain),
        "tokens": ptok,
        "decode_s": psec,
        "tok_s": ptok / psec if psec else None,
    }
    for mode in modes:
        runs = [r[mode] for r in rows if r.get(mode)]
        if not runs:
            continue
        tok, sec = sum(r["tokens"] for r in runs), sum(r["decode_s"] for r in runs)
        drafted, accepted = sum(r["n_drafted"] for r in runs), sum(r["n_accept"] for r in runs)
        s = {
            "prompts": len(runs),
            "tokens": tok,
            "decode_s": sec,
            "tok_s": tok / sec if sec else None,
            "n_drafted": drafted,
            "n_accept": accepted,
            **spec_metrics(tok, drafted, accepted, len(runs)),
            "identical": sum(bool(r["identical"]) for r in runs),
        }
        s["speedup"] = (
            s["tok_s"] / out["plain"]["tok_s"] if s["tok_s"] and out["plain"]["tok_s"] else None
        )
        s["bound"] = _bound(s, curve)
        out[mode] = s
    return out


def _bound(s: dict, curve: dict[int, float] | None) -> float | None:
    """The speedup a mode could reach if drafting cost nothing: tokens per step ÷ t(1 + mean
    draft)/t(1)."""
    if not curve or s.get("tokens_per_step") is None or s.get("mean_draft") is None:
        return None
    r = cost_ratio(curve, 1 + s["mean_draft"])
    return s["tokens_per_step"] / r if r else None


# ------------------------------------------------------------------------------------------- report


def _f(x, fmt: str = "{:.1f}", none: str = "—") -> str:
    return none if x is None else fmt.format(x)


def markdown(report: dict) -> str:
    """The report as tables: per prompt and overall, then the cost curve and the definitions."""
    rows, o, curve = report["rows"], report["overall"], report.get("cost_curve")
    modes = [m for m in o if m != "plain"]
    st = report["settings"]
    lines = [
        f"# llama.cpp: plain vs EAGLE-3 vs n-gram — {report['target']['name']} "
        f"({report['target']['architecture']}, "
        f"{report['target']['outtype']})",
        "",
        f"{report['llamacpp']['package']}; greedy, -n {st['n']} (plain {st['plain_n']}), draft "
        f"max {st['draft_n_max']}, "
        f"ngram-simple n={st['ngram']['size_n']} m={st['ngram']['size_m']}, {st['threads']} "
        "thread(s), "
        f"{st['prompts_per_lang']} prompt(s) × {', '.join(st['langs'])}."
        + (
            f" Load average {report['machine']['loadavg_1m_start']} → "
            f"{report['machine']['loadavg_1m_end']} on "
            f"{report['machine']['cpus']} CPUs."
            if report.get("machine")
            else ""
        )
        + " Prompt ids as polyspec's: "
        f"{sum(r.get('prompt_tokens_equal') is True for r in rows)}/{len(rows)}.",
        "",
    ]
    if report.get("eagle3_error"):
        for lang, msg in report["eagle3_error"].items():
            lines += [
                f"**EAGLE-3 refused by llama.cpp ({lang}):** `{msg}` — plain and n-gram only.",
                "",
            ]
    head = ["prompt", "tokens (prompt)", "plain tok/s"]
    for m in modes:
        head += [f"{m} tok/s (×)", f"{m} accept", f"{m} tok/step", f"{m} τ", f"{m} same"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cells(name: str, prompt_tokens: str, plain: dict, per_mode: dict) -> list[str]:
        c = [name, prompt_tokens, _f(plain.get("tok_s"))]
        for m in modes:
            r = per_mode.get(m)
            if not r:
                c += ["—"] * 5
                continue
            same = (
                f"{r['identical']}/{r['prompts']}"
                if "prompts" in r
                else ("yes" if r["identical"] else "**no**")
            )
            c += [
                f"{_f(r['tok_s'])} ({_f(r.get('speedup'), '{:.2f}×')})",
                _f(r["acceptance"], "{:.0%}"),
                _f(r["tokens_per_step"], "{:.2f}"),
                _f(r["tau"], "{:.2f}"),
                same,
            ]
        return c

    for r in rows:
        eq = "" if r.get("prompt_tokens_equal") in (True, None) else " ≠"
        name = r["id"] if r.get("drafter") in (None, r["lang"]) else f"{r['id']} ({r['drafter']})"
        lines.append(
            "| " + " | ".join(cells(name, f"{r['prompt_tokens']}{eq}", r["plain"], r)) + " |"
        )
    lines.append("| " + " | ".join(cells("**overall**", "", o["plain"], o)) + " |")
    if modes and curve:
        lines += [
            "",
            "Bound (the speedup with free drafting, estimated from the cost curve): "
            + ", ".join(
                f"{m} {_f(o[m].get('bound'), '{:.2f}×')} (measured "
                f"{_f(o[m].get('speedup'), '{:.2f}×')})"
                for m in modes
            )
            + ".",
        ]
    if curve and curve.get("ratio"):
        ks = list(curve["ratio"])
        lines += [
            "",
            f"## Verify cost: one target decode of k tokens at context {curve['context']} "
            f"(llama-batched-bench, min of {curve['passes']})",
            "",
            "| k | " + " | ".join(str(k) for k in ks) + " |",
            "|---|" + "---|" * len(ks),
            "| t(k) ms | " + " | ".join(f"{curve['t_s'][k] * 1000:.1f}" for k in ks) + " |",
            "| t(k)/t(1) | " + " | ".join(f"{curve['ratio'][k]:.2f}" for k in ks) + " |",
        ]
    for name, d in (report.get("draft_length") or {}).items():
        ks = list(d["predicted_speedup"])
        lines += [
            "",
            f"## Draft length for {name}: {d['draft_n']} ({d['chosen_by']})",
            "",
            f"α {', '.join(f'{x:.2f}' for x in d['alpha'])} ({d['alpha_from']}); a step costs "
            f"t(1 + drafted)/t(1) + {d['step_cost']['a']:.2f} + {d['step_cost']['c']:.2f} per "
            "drafted token "
            "(forwards of plain decoding, fitted from the eagle3 runs).",
            "",
            "| k | " + " | ".join(str(k) for k in ks) + " |",
            "|---|" + "---|" * len(ks),
            "| predicted × | " + " | ".join(f"{d['predicted_speedup'][k]:.2f}" for k in ks) + " |",
            "| measured × | "
            + " | ".join(_f(d["measured_speedup"].get(k), "{:.2f}") for k in ks)
            + " |",
        ]
    lines += ["", "## Definitions", ""] + [f"- {k}: {v}" for k, v in report["definitions"].items()]
    lines += ["", "## Commands (first prompt)", ""] + [
        f"- {m}: `{c}`" for m, c in report["commands"].items()
    ]
    if curve:
        lines.append(f"- cost curve: `{curve['command']}`")
    return "\n".join(lines) + "\n"


def write(out: Path, report: dict) -> None:
    """``out/llamacpp.json`` (the report) and ``out/llamacpp.md`` (its tables)."""
    atomic_write_json(out / "llamacpp.json", report)
    atomic_write_text(out / "llamacpp.md", markdown(report))
