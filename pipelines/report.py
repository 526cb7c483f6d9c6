"""The final report of a pipeline run: ``<run>/report/report.md`` (+ ``summary.json``, charts, an
offline wandb run with the same metrics) gathered from the stages' own outputs and DONE records."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
from pathlib import Path

from polyspec.identity import identity, identity_mode
from polyspec.io import atomic_write_json, atomic_write_text, read_json_or_none, read_jsonl


def training_curves(run: Path, out: Path) -> dict:
    """Held-out simulated acceptance length over steps, per language and stage → training.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {}
    # train/ and an engine track's (train-eagle3/)
    for metrics in sorted(run.glob("train*/*/*/metrics.jsonl")):
        lang, stage = metrics.parent.parent.name, metrics.parent.name
        if metrics.parents[2].name != "train":
            stage = f"{stage} ({metrics.parents[2].name})"
        pts = []
        for rec in read_jsonl(metrics):  # a killed training run can leave a torn last line
            if "eval" in rec and "step" in rec:
                pts.append((rec["step"], rec["eval"]["accept_len"]))
        if pts:
            curves[f"{lang}/{stage}"] = pts
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, pts in curves.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("simulated acceptance length")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "training.png", dpi=110)
    plt.close(fig)
    return curves


def versions() -> dict:
    import torch
    import transformers

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "polyspec_commit": commit or None,
        "machine": platform.machine(),
        "system": platform.system(),
    }


def results_table(run: Path, ev: dict) -> list[str]:
    """The README's opening table for this run: per language the shipped drafter's decoder τ, its
    first-draft acceptance α₁ (the held-out score that picked ``best/``), speedups over the fastest
    AR beside the training-free methods (τ), hybrid ÷ pld and the answers identical to ``ar``.
    Methods the eval did not run are left out; a language with no α₁ (mixed, or no best/ recorded)
    shows –."""
    methods = [m for m in ("adaspec", "eagle3", "pld", "spectra", "hybrid") if m in ev["methods"]]
    if not methods:
        return []
    by = {m: ev["methods"][m]["by_language"] for m in methods}
    langs = sorted(next(iter(by.values())), key=lambda x: (x == "mixed", x))
    agree = ev.get("agreement") or {}

    def alpha1(lang: str) -> str:
        meta = read_json_or_none(run / "train" / lang / "final" / "config.json") or {}
        a = (meta.get("eval") or {}).get("alpha") or []
        return f"{a[0]:.2f}" if a else "–"

    def cell(m: str, x: dict) -> str:
        return f"{x['speedup']:.2f}× ({x['tau']:.2f})"

    def agreement(m: str, lang: str | None) -> str:
        g = agree.get(m, {})
        rows = list(g.values()) if lang is None else [g[lang]] if lang in g else []
        return (
            f"{sum(r['identical'] for r in rows)}/{sum(r['answers'] for r in rows)}"
            if rows
            else "–"
        )

    shown = [m for m in methods if m in agree]
    head = [
        "language",
        *(["adaspec τ", "α₁"] if "adaspec" in by else []),
        *(f"{m} speedup (τ)" for m in methods),
    ]
    if {"pld", "hybrid"} <= set(methods):
        head.append("hybrid ÷ pld")
    head.append("identical to ar: " + " · ".join(shown))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lang in [*langs, "all"]:
        x = {m: by[m][lang] if lang != "all" else ev["methods"][m]["overall"] for m in methods}
        row = [lang]
        if "adaspec" in by:
            row += [
                f"{x['adaspec']['tau']:.2f}",
                alpha1(lang) if lang not in ("mixed", "all") else "–",
            ]
        row += [cell(m, x[m]) for m in methods]
        if {"pld", "hybrid"} <= set(methods):
            row.append(f"{x['hybrid']['tok_s'] / max(x['pld']['tok_s'], 1e-9):.2f}")
        row.append(" · ".join(agreement(m, None if lang == "all" else lang) for m in shown))
        lines.append("| " + " | ".join(row) + " |")
    ar = ev["ar_baselines"]
    fastest = max(ar, key=lambda b: ev["methods"][b]["overall"]["tok_s"])
    lines += [
        "",
        f"{ev['target']}, {identity_mode(ev)} on {ev['device']} ({ev['cpu']}, {ev['threads']} "
        "threads), "
        f"{ev['questions']} questions, {ev['max_new_tokens']} new tokens, greedy. Speedup = "
        "tokens/s over the "
        f"fastest AR (`{fastest}`, {ev['methods'][fastest]['overall']['tok_s']:.1f} tok/s); τ = "
        "tokens per "
        "target forward; α₁ = first-draft acceptance of the shipped drafter on the held-out "
        "prompts."
        + (
            " `eagle3` = the EAGLE-3 drafter engines load (export/engines/), alone: chain γ 4, no "
            "prompt lookup."
            if "eagle3" in methods
            else ""
        ),
    ]
    return lines


def engines_section(run: Path) -> list[str]:
    """What ``export/engines/engines.json`` says: each engine drafter, its held-out score per
    language (own vs the multilingual one), and which engine loads it."""
    rec = read_json_or_none(run / "export" / "engines" / "engines.json")
    if not rec:
        return []
    lines = [
        "## Drafters for engines (export/engines/)",
        "",
        "| drafter | languages | held-out τ (chain γ 4) by language | speculators folder | GGUF |",
        "|---|---|---|---|---|",
    ]
    for name, d in rec["drafters"].items():
        by = d.get("heldout_tau_by_lang") or {}
        taus = ", ".join(f"{lang} {t:.2f}" for lang, t in by.items()) or (
            f"{d['heldout_tau']:.2f} (training split)" if d.get("heldout_tau") else "–"
        )
        lines.append(
            f"| {name} | {', '.join(d['languages'])} | {taus} | `{d['speculators']}` | "
            f"{'`' + d['gguf'] + '`' if d.get('gguf') else '–'} |"
        )
    lines.append("")
    for engine, e in rec["engines"].items():
        lines.append(
            f"- **{engine}** loads {', '.join(e.get('loads') or []) or 'nothing'}"
            + (f" — {e['why']}" if e.get("why") else f": `{e.get('command', '')}`")
        )
    return [*lines, "", *measured_engines(run)]


def measured_engines(run: Path) -> list[str]:
    """The engine checks' own tables (``make check-vllm``: vllm/vllm.md; ``make check-llamacpp``:
    llamacpp/llamacpp.md), their headings one level down and without their definitions, where they
    ran."""
    lines = []
    for sub, name in (("vllm/vllm.md", "vLLM"), ("llamacpp/llamacpp.md", "llama.cpp")):
        path = run / sub
        if not path.is_file():
            continue
        body = path.read_text(encoding="utf-8").split("\n## Definitions")[0].splitlines()
        lines += [
            f"### {name} (`{sub}`)",
            "",
            *("#" + ln if ln.startswith("## ") else ln for ln in body[1:]),
            "",
        ]
    return lines


def build_report(run: Path) -> tuple[Path, list[str]]:
    """``<run>/report/``: report.md, summary.json, the figures and the offline wandb run."""
    run = Path(run)
    out = run / "report"
    out.mkdir(parents=True, exist_ok=True)
    langs, sets, synth_rows = synth_sets(run)
    copy_figures(run / "vocab", out, ("coverage.png", "overlap.png"))
    coverage = read_json_or_none(run / "vocab" / "coverage.json") or {}
    curves = training_curves(run, out)
    calib = read_json_or_none(run / "export" / "bundle" / "calibration.json") or {}
    ev = read_json_or_none(run / "eval" / "report.json")
    copy_figures(
        run / "eval", out, ("speedup.png", "tau.png", "accept_hist.png", "adaptive_trace.png")
    )
    commands = provenance(run)
    summary = adaspec_summary(ev)
    v = versions()
    lines = [
        *head_section(run, langs, v, summary, ev),
        *synth_section(synth_rows),
        *vocab_section(coverage),
        *engines_section(run),
        *training_section(curves),
        *calibration_section(calib),
        *evaluation_section(run, ev),
        "## Provenance",
        "",
        *(f"- {c}" for c in commands),
        "",
    ]
    atomic_write_text(out / "report.md", "\n".join(lines))
    atomic_write_json(
        out / "summary.json",
        {
            "summary": summary,
            "versions": v,
            "langs": sorted(langs),
            "synth_sets": sets,
            "eval": ev and {m: d["overall"] for m, d in ev["methods"].items()},
        },
    )
    _wandb(run, ev, curves)
    return out / "report.md", summary


def synth_sets(run: Path) -> tuple[set, list[str], list[str]]:
    """The synth sets with stats: their languages, their folder names and their table rows."""
    langs, sets, synth_rows = set(), [], []
    for stats_path in sorted((run / "synth").glob("*/stats.json")):
        s = read_json_or_none(stats_path)
        if not s or "accepted" not in s:
            continue
        sets.append(stats_path.parent.name)  # <lang> (self-synth) or <lang>-<name> (distilled)
        langs.add(s.get("lang") or stats_path.parent.name)
        share = answers_in_language(stats_path.parent / "data.jsonl", s.get("lang"))
        synth_rows.append(synth_row(stats_path.parent.name, s, share))
    return langs, sets, synth_rows


def answers_in_language(data: Path, lang: str | None) -> tuple[int, int] | None:
    """How many of a synth set's answers fastText's language ID places in the set's language (the
    self-synthesis filter keeps only those; on-policy answers are kept whatever their language, so
    this says how often the target answered in the language it was asked in): (in it, answers)."""
    from polyspec.io import read_jsonl
    from polyspec.lid import identify

    if not lang or not data.is_file():
        return None
    got = [
        turn["value"]
        for row in read_jsonl(data)
        for turn in row.get("conversations", [])
        if turn.get("from") == "gpt"
    ]
    return sum(identify(text)[0] == lang for text in got), len(got)


def synth_row(name: str, s: dict, share: tuple[int, int] | None = None) -> str:
    """One synth set's row: kept/attempted, rejects by reason and LID label, answers in the set's
    language, answer tokens, speed, engine."""
    rejects = ", ".join(f"{k} {v}" for k, v in s.get("lid_labels_of_rejects", {}).items()) or "–"
    reasons = ", ".join(f"{k} {v}" for k, v in s.get("rejected_by_reason", {}).items()) or "–"
    engine = s.get("engine", "transformers") + (
        f" {s['engine_version']}" if s.get("engine_version") else ""
    )
    return (
        f"| {name} | {s['accepted']}/{s['attempted']} | {reasons} | "
        f"{rejects} | "
        + (f"{share[0]}/{share[1]} ({share[0] / share[1]:.0%})" if share and share[1] else "–")
        + f" | {s.get('tokens', '–')} | "
        f"{s.get('tokens_per_second', 0)} | {engine} |"
    )


def copy_figures(src: Path, out: Path, names: tuple[str, ...]) -> None:
    """The figures of ``names`` that ``src`` holds, copied into ``out``."""
    for png in names:
        if (src / png).is_file():
            shutil.copy2(src / png, out / png)


def provenance(run: Path) -> list[str]:
    """Each finished stage's command and seconds from its DONE record, in order of finishing."""
    commands = []
    for done in sorted(
        run.glob("**/DONE.json"), key=lambda p: (read_json_or_none(p) or {}).get("finished", "")
    ):
        d = read_json_or_none(done) or {}
        if d.get("cmd"):
            commands.append(f"{d['stage']} ({d.get('seconds', '?')} s): `{' '.join(d['cmd'][1:])}`")
    return commands


def adaspec_summary(ev: dict | None) -> list[str]:
    """adaspec's τ, speedup and identity to ar per language and overall (none without its eval)."""
    summary = []
    if ev and "adaspec" in ev["methods"]:
        a = ev["methods"]["adaspec"]
        for lang, x in a["by_language"].items():
            same = (
                identity(ev, "adaspec", lang)
                if ev.get("agreement")
                else ("yes" if x["identical"] else "NO")
            )
            summary.append(
                f"{lang}: adaspec τ {x['tau']:.2f}, speedup {x['speedup']:.2f}× vs fastest AR, "
                f"identical to ar: {same}"
            )
        summary.append(
            f"all: adaspec τ {a['overall']['tau']:.2f}, speedup {a['overall']['speedup']:.2f}×"
            + (f", identical to ar: {identity(ev, 'adaspec')}" if ev.get("agreement") else "")
        )
    return summary


def head_section(run: Path, langs: set, v: dict, summary: list[str], ev: dict | None) -> list[str]:
    """The title, the run's languages and versions, the summary and the results table."""
    return [
        "# polyspec run report",
        "",
        f"Run `{run}` · languages {', '.join(sorted(langs))} · "
        + ", ".join(f"{k} {val}" for k, val in v.items() if val),
        "",
        "## Summary",
        "",
        *(f"- {s}" for s in summary),
        "",
        *(results_table(run, ev) if ev else []),
        "",
    ]


def synth_section(synth_rows: list[str]) -> list[str]:
    """Section 1: the synth sets' table."""
    return [
        "## 1 synth (ADASPEC Alg. 1)",
        "",
        "| synth set | kept/attempted | rejected by reason | LID labels of rejects | answers in "
        "its language (fastText) | answer tokens | tokens/s | engine |",
        "|---|---|---|---|---|---|---|---|",
        *synth_rows,
        "",
    ]


def vocab_section(coverage: dict) -> list[str]:
    """Section 2: the vocabularies' coverage figures and numbers."""
    lines = ["## 2 vocab", ""]
    if coverage:
        lines += [
            "Coverage of held-out text by the top-k ids: see `coverage.png`; top-8K overlap: "
            "`overlap.png`.",
            "",
            "```json",
            json.dumps(coverage, indent=1)[:1500],
            "```",
            "",
        ]
    return lines


def training_section(curves: dict) -> list[str]:
    """Section 3: the training figure and each curve's points."""
    lines = [
        "## 3 training (held-out simulated acceptance length)",
        "",
        "![training](training.png)",
        "",
    ]
    lines += [
        f"- {k}: " + ", ".join(f"step {s}: {a:.3f}" for s, a in pts) for k, pts in curves.items()
    ]
    return lines


def calibration_section(calib: dict) -> list[str]:
    """Section 4: one line per calibrated device."""
    lines = ["", "## 4 calibration (UNISPEC)", ""]
    for dev, c in calib.items():
        lines.append(calibration_line(dev, c))
    return lines


def evaluation_section(run: Path, ev: dict | None) -> list[str]:
    """Section 5: the eval's own report (less its title) and its figures."""
    lines = ["", "## 5 evaluation", ""]
    if ev:
        lines += [(run / "eval" / "report.md").read_text(encoding="utf-8").split("\n", 2)[2], ""]
        lines += [
            "![speedup](speedup.png) ![tau](tau.png) ![accept](accept_hist.png) "
            "![trace](adaptive_trace.png)",
            "",
        ]
    return lines


def calibration_line(dev: str, c: dict) -> str:
    """One device's calibration as the report states it: g*, τ(g) pooled over the prompts, the
    spread of τ(g*) over them, how often bootstrap resamples of the prompts choose g* again, the
    tree budget."""
    g = str(c.get("g_star"))
    tau = c.get("tau", {})
    line = f"- {dev}: g* = {g} ({c.get('chosen_by')}), tree budget {c.get('tree_budget')}"
    if tau:
        line += "; τ(g) " + ", ".join(f"{k}: {float(v):.2f}" for k, v in tau.items())
    sp = c.get("tau_spread", {}).get(g)
    if sp:
        line += (
            f"; τ(g*) over {c.get('prompts')} prompts {sp['min']:.2f}–{sp['max']:.2f} (sd "
            f"{sp['std']:.2f})"
        )
    st = c.get("stability")
    if isinstance(st, dict):
        line += (
            f"; bootstrap resamples of the prompts choose g* again {st['same']:.0%} of the time, "
            "and g* is within "
            f"{st['loss_p95']:.1%} of a resample's best in 95 % of them"
        )
    if c.get("seconds") is not None:
        line += f"; {c['seconds']} s"
    return line


def _wandb(run: Path, ev: dict | None, curves: dict) -> None:
    """The same metrics in an offline wandb run (nothing leaves the machine)."""
    try:
        import wandb
    except ImportError:  # pragma: no cover - wandb is a dependency
        return
    r = wandb.init(
        project="polyspec",
        name=f"report-{run.name}",
        dir=str(run / "report"),
        mode="offline",
        reinit=True,
        config={"run": str(run)},
    )
    for name, pts in curves.items():
        for step, acc in pts:
            r.log({f"train/{name}/accept_len": acc, "step": step})
    if ev:
        for m, d in ev["methods"].items():
            for lang, x in d["by_language"].items():
                r.summary[f"eval/{m}/{lang}/speedup"] = x["speedup"]
                r.summary[f"eval/{m}/{lang}/tau"] = x["tau"]
    r.finish()
