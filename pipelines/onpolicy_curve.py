"""The chat drafter's held-out score against the on-policy answer tokens it finetuned on (the data
the references scale: EAGLE-3's scaling figure; "Scylla", arXiv 2505.07858). Collects the points
``scripts/experiments/onpolicy-curve.sh`` trained into a table and a plot.

    python -m pipelines.onpolicy_curve answers --src R/synth/en-distill/data.jsonl --tokens 140000
    python -m pipelines.onpolicy_curve table --run R --points "140000 300000 ..." [--seeds "1"]
    python -m pipelines.onpolicy_curve merge --curve R1/onpolicy-curve.json --curve R2/… --out P

``answers`` writes a point's share of the distilled answers: the first prompts of the (shuffled)
prompt set, all of their temperatures, up to N answer tokens, as ``data-<N>.jsonl`` beside the
source (feature files are named relative to that folder), so the points nest:
each holds the smaller ones. Data made in rounds (the curve script's ``N_INSTR="1150 2400"``: each
round's prompts are new to the earlier rounds, ``<lang>-distill-r<i>/``) is read in round order:
``--src`` once a round; a point takes round 1 whole before round 2's first prompts, and prints the
files it trains on.

A point is the folder ``<run>/oc-<N>[-s<seed>]/<lang>/``: ``finetune/`` (from the shared pretrain,
scored at its end on the 24 held-out prompts; the first draft's teacher-forced top-1 over every
answer position beside α₁, train/score.py) beside ``<run>/oc-<N>[-s<seed>]-chat/<lang>/finetune/
eval_only.json`` (the same final weights scored on the second held-out set,
``synth/data/heldout-chat.jsonl``). Beside each set's score, the decoder's own α₁ and τ on the same
prompts (``python -m pipelines.score_check --drafter <point>/finetune/final``, which writes
``<point>/finetune/score_check-heldout.json`` and ``score_check-heldout-chat.json``; "–" until it
ran): the teacher-forced top-1, the score's α₁ and the decoder's α₁ must agree within noise, a gap
is a train/decode mismatch (issue 68). Per point: answer tokens, tokens read,
steps, τ (chain γ 4) and α₁..α₄ on both sets; the slope per decade of answer tokens is a
least-squares fit of τ and α₁ against log₁₀ tokens over the seed-0 points; the seeds' spread is
their range at a point. Beside each point, where its drafter stands (``fit``): the first draft's
training top-1 on answers not yet seen and on answers seen before, next to the held-out top-1 — a
data-limited drafter fits seen answers far better than unseen ones, a capacity-limited one fits
neither. Writes ``<run>/onpolicy-curve.json``, ``.md`` and ``.png``, the json with the curve's
``label`` (``--label``, default this host's kind). ``merge`` pools several runs' curves (one
continued in another run, on another disk or host) into one table, slope and plot, a series each.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

from pipelines.learning_curve import count, stage_summary
from polyspec.device import host_kind
from polyspec.errors import PolyspecError, cli_entry
from polyspec.io import atomic_write_json, atomic_write_text, read_json_or_none, read_jsonl


def answers_prefix(src: Path, tokens: int, upto: int | None = None) -> tuple[Path, int, int]:
    """The first prompts' answers of a distilled set holding ≥ ``tokens`` answer tokens, every
    temperature of the last prompt included → (``data-<upto or tokens>.jsonl`` beside it, records,
    tokens). With ``upto`` (the point this share belongs to) a set holding fewer is taken whole."""
    stats = read_json_or_none(src.parent / "stats.json") or {}
    temps = len(stats.get("temperatures") or [0])
    total, lines, last = 0, [], None
    with open(src, encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            prompt = rec["attempt"] // temps
            if total >= tokens and prompt != last:
                break
            lines.append(line)
            total += rec["tokens"]["response"]
            last = prompt
    if total < tokens and upto is None:
        raise PolyspecError(
            f"{src} holds {total:,} answer tokens, fewer than the {tokens:,} asked for "
            "(distill more: rerun its command)"
        )
    dst = src.parent / f"data-{upto or tokens}.jsonl"
    atomic_write_text(dst, "".join(lines))
    return dst, len(lines), total


def answers_across(srcs: list[Path], tokens: int) -> list[tuple[Path, int, int]]:
    """A point's answers from the data rounds in order (round 1 whole before round 2's first
    prompts, so the points still nest): each round's share as ``data-<tokens>.jsonl`` beside it."""
    parts, left = [], tokens
    for src in srcs:
        if left <= 0:
            break
        parts.append(answers_prefix(src, left, upto=tokens))
        left -= parts[-1][2]
    if left > 0:
        have = tokens - left
        raise PolyspecError(
            f"{', '.join(map(str, srcs))} hold {have:,} answer tokens, fewer than the {tokens:,} "
            "asked for (distill more: rerun its command, or add a data round)"
        )
    return parts


def distill_rounds(run: Path, lang: str) -> list[Path]:
    """The distilled answer folders of the curve's data rounds: ``<lang>-distill``, then
    ``<lang>-distill-r2``, ``-r3`` …"""
    synth = run / "synth"
    later = sorted(synth.glob(f"{lang}-distill-r*"), key=lambda p: int(p.name.rsplit("-r", 1)[1]))
    return [synth / f"{lang}-distill", *later]


def point_dir(run: Path, n: int, seed: int, lang: str) -> Path:
    return run / (f"oc-{n}" + (f"-s{seed}" if seed else "")) / lang


# the table's sets → the file pipelines.score_check writes for each
# (<point>/finetune/score_check-<name>.json)
DECODED = {"finetune": "heldout", "chat": "heldout-chat"}


def _decoded(path: Path) -> dict | None:
    """The decoder's τ and α on a held-out set beside the score's (``pipelines.score_check
    --drafter``), or None where it has not run."""
    rec = read_json_or_none(path)
    if rec is None:
        return None
    return {
        "tau": rec["decoder_tau"],
        "alpha": rec["decoder_alpha"],
        "score_tau": rec["score_tau"],
        "score_alpha": rec["score_alpha"],
        "answers_identical_to_captured": rec["answers_identical_to_captured"],
        "dtype": rec.get("dtype"),
    }


def collect(
    run: Path,
    distill: list[Path],
    points: list[int],
    seeds: list[int],
    lang: str,
    chat: bool = True,
) -> list[dict]:
    """``chat=False``: a language without a second held-out set (heldout-chat.jsonl is English):
    its rows' ``chat`` is None."""
    rows = []
    for n in points:
        subs = [d / f"data-{n}.jsonl" for d in distill if (d / f"data-{n}.jsonl").is_file()]
        got = sum(r["tokens"]["response"] for s in subs for r in read_jsonl(s)) if subs else None
        for seed in [0, *seeds]:
            base = point_dir(run, n, seed, lang)
            if seed and not (base / "finetune" / "metrics.jsonl").is_file():
                continue
            rows.append(
                {
                    "point": n,
                    "seed": seed,
                    "answer_tokens": got,
                    "finetune": stage_summary(base / "finetune"),
                    "fit": fit(base / "finetune"),
                    "chat": _eval_only(run / f"{base.parent.name}-chat" / lang) if chat else None,
                    "decoded": {
                        key: _decoded(base / "finetune" / f"score_check-{name}.json")
                        for key, name in DECODED.items()
                        if chat or key != "chat"
                    },
                }
            )
    return rows


def collect_arms(run: Path, n: int, arms: list[str], lang: str, chat: bool = True) -> list[dict]:
    """The recipe A/B's arms at point ``n`` (``<run>/oc-<n>-<arm>/``), each scored like a point."""
    return [
        {
            "arm": arm,
            "point": n,
            "finetune": stage_summary(run / f"oc-{n}-{arm}" / lang / "finetune"),
            "chat": _eval_only(run / f"oc-{n}-{arm}-chat" / lang) if chat else None,
        }
        for arm in arms
    ]


def recipe(rows: list[dict], arms: list[dict], spread: dict) -> list[dict]:
    """Each arm's held-out τ and α₁ against the point's seed-0 run, and whether the gain is larger
    than the seeds' range there (``None``: no second seed at that point)."""
    out = []
    for a in arms:
        base = next(r for r in rows if r["point"] == a["point"] and r["seed"] == 0)
        rng = spread.get(str(a["point"]), {}).get("tau_range")
        d = {
            key: {
                "d_tau": round(a[key]["tau"] - base[key]["tau"], 4),
                "d_alpha1": round(a[key]["alpha"][0] - base[key]["alpha"][0], 4),
            }
            for key in ("finetune", "chat")
            if a[key] is not None
        }
        gain = d["finetune"]["d_tau"]
        out.append({"arm": a["arm"], **d, "beats_seed_spread": None if rng is None else gain > rng})
    return out


def arms_table(arms: list[dict], deltas: list[dict]) -> list[str]:
    lines = [
        "| arm | held-out τ (Δ) | α1 (Δ) | α2 | teacher-forced top-1 | chat τ (Δ) | α1 (Δ) | "
        "gain > seed spread |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a, d in zip(arms, deltas):
        f, c = a["finetune"], a["chat"]
        beats = {None: "–", True: "yes", False: "no"}[d["beats_seed_spread"]]
        chat = (
            "– | –"
            if c is None
            else (
                f"{c['tau']:.3f} ({d['chat']['d_tau']:+.3f}) | "
                f"{c['alpha'][0]:.3f} ({d['chat']['d_alpha1']:+.3f})"
            )
        )
        lines.append(
            f"| {a['arm']} | {f['tau']:.3f} ({d['finetune']['d_tau']:+.3f}) | "
            f"{f['alpha'][0]:.3f} ({d['finetune']['d_alpha1']:+.3f}) | {f['alpha'][1]:.3f} | "
            f"{_num(f.get('top1_teacher_forced'))} | {chat} | {beats} |"
        )
    return lines


def _eval_only(folder: Path) -> dict:
    """The chat held-out score of a point's final weights (``eval_only.json`` of its eval stage)."""
    path = folder / "finetune" / "eval_only.json"
    rec = read_json_or_none(path)
    if rec is None:
        raise PolyspecError(f"{path}: not scored yet (rerun scripts/experiments/onpolicy-curve.sh)")
    return rec["eval"]


def fit(folder: Path) -> dict | None:
    """Where a point's drafter stands, from its training log (``metrics.jsonl``: ``top1_0``, the
    first draft's top-1 on the batch it trains on) and ``final/config.json`` (its epochs): the mean
    over epoch 1's second half (answers it has not seen yet: what it generalises to on the pool's
    distribution) and over the last epoch (answers seen before: what it can fit). Unseen ≈ seen
    with both low is the drafter's capacity; seen ≫ unseen is too little data; unseen ≫ the
    held-out top-1 is the pool's distance from the held-out prompts."""
    cfg = read_json_or_none(folder / "final" / "config.json") or {}
    epochs = ((cfg.get("train_config") or {}).get("finetune") or {}).get("epochs")
    path = folder / "metrics.jsonl"
    if not epochs or not path.is_file():
        return None
    logged = [(r["step"], r["top1_0"]) for r in read_jsonl(path) if "top1_0" in r]
    if not logged:
        return None
    per_epoch = logged[-1][0] / epochs

    def mean(lo: float, hi: float) -> float | None:
        xs = [t for s, t in logged if lo < s <= hi]
        return round(sum(xs) / len(xs), 4) if xs else None

    return {
        "epochs": epochs,
        "train_top1_unseen": mean(per_epoch / 2, per_epoch),
        "train_top1_seen": mean(per_epoch * (epochs - 1), logged[-1][0]) if epochs > 1 else None,
    }


def fit_table(rows: list[dict]) -> list[str]:
    lines = [
        "| answer tokens | seed | epochs | train top-1, unseen answers (epoch 1, 2nd half) | "
        "train top-1, seen answers (last epoch) | held-out teacher-forced top-1 | "
        "chat held-out top-1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f = r.get("fit") or {}
        lines.append(
            f"| {r['answer_tokens']:,} | {r['seed']} | {f.get('epochs', '–')} | "
            f"{_num(f.get('train_top1_unseen'))} | {_num(f.get('train_top1_seen'))} | "
            f"{_num(r['finetune'].get('top1_teacher_forced'))} | "
            f"{_num((r['chat'] or {}).get('top1_teacher_forced'))} |"
        )
    return lines


def slope_per_decade(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against log₁₀ ``xs``."""
    lx = [math.log10(x) for x in xs]
    mx, my = sum(lx) / len(lx), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in lx)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ys)) / den if den else 0.0


def summary(rows: list[dict]) -> dict:
    base = [r for r in rows if r["seed"] == 0]
    xs = [r["answer_tokens"] for r in base]
    out = {}
    for key in ("finetune", "chat"):
        if any(r[key] is None for r in base):
            continue
        out[key] = {
            "tau_per_decade": round(slope_per_decade(xs, [r[key]["tau"] for r in base]), 4),
            "alpha1_per_decade": round(slope_per_decade(xs, [r[key]["alpha"][0] for r in base]), 4),
        }
    spread = {}
    for n in {r["point"] for r in rows if r["seed"]}:
        taus = [r["finetune"]["tau"] for r in rows if r["point"] == n]
        a1 = [r["finetune"]["alpha"][0] for r in rows if r["point"] == n]
        spread[str(n)] = {
            "seeds": len(taus),
            "tau_range": round(max(taus) - min(taus), 4),
            "alpha1_range": round(max(a1) - min(a1), 4),
        }
    out["seed_spread"] = spread
    return out


def table(rows: list[dict]) -> list[str]:
    k = len(rows[0]["finetune"]["alpha"])
    alphas = " | ".join(f"α{i + 1}" for i in range(k))
    lines = [
        f"| answer tokens | seed | finetune: tokens read (steps) | held-out τ | {alphas} | "
        "teacher-forced top-1 | decoded α1 | decoded τ | "
        f"chat held-out τ | {alphas} | teacher-forced top-1 | decoded α1 | decoded τ |",
        "|" + "---|" * (11 + 2 * k),
    ]
    for r in rows:
        f, c = r["finetune"], r["chat"]
        dec = r.get("decoded") or {}
        lines.append(
            f"| {r['answer_tokens']:,} | {r['seed']} | {count(f['tokens'])} ({f['steps']}) | "
            f"**{f['tau']:.3f}** | "
            + " | ".join(f"{a:.3f}" for a in f["alpha"])
            + f" | {_num(f.get('top1_teacher_forced'))} | {_decoded_cells(dec.get('finetune'))} | "
            + (
                " | ".join(["–"] * (k + 4))
                if c is None
                else f"**{c['tau']:.3f}** | "
                + " | ".join(f"{a:.3f}" for a in c["alpha"])
                + f" | {_num(c.get('top1_teacher_forced'))} | {_decoded_cells(dec.get('chat'))}"
            )
            + " |"
        )
    return lines


def _decoded_cells(d: dict | None) -> str:
    """The decoder's α₁ and τ (two cells), "–" where score_check has not run."""
    return "– | –" if d is None else f"{_num(d['alpha'][0])} | {_num(d['tau'])}"


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def plot(curves: list[tuple[str, list[dict]]], out: Path) -> None:
    """τ and α₁ against answer tokens: a colour a held-out set, a marker a curve (its label in the
    legend where there are several), seed 0's points joined across the curves, other seeds alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    sets = (("finetune", "24 held-out", "C0"), ("chat", "32 chat held-out", "C2"))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2 if len(curves) > 1 else 3.8))
    for ax, ylabel, value in (
        (axes[0], "τ (chain γ 4, final weights)", lambda r, k: r[k]["tau"]),
        (axes[1], "α₁", lambda r, k: r[k]["alpha"][0]),
    ):
        for key, label, colour in sets:
            line = sorted(
                (r for _, rows in curves for r in rows if r["seed"] == 0 and r[key] is not None),
                key=lambda r: r["answer_tokens"],
            )
            ax.plot(
                [r["answer_tokens"] for r in line], [value(r, key) for r in line], "-", c=colour
            )
            for (name, rows), mark in zip(curves, itertools.cycle("osD^v")):
                for seed in sorted({r["seed"] for r in rows}):
                    pts = [r for r in rows if r["seed"] == seed and r[key] is not None]
                    tag = f"{label}, seed {seed}" + (f" — {name}" if len(curves) > 1 else "")
                    ax.plot(
                        [r["answer_tokens"] for r in pts],
                        [value(r, key) for r in pts],
                        mark,
                        c=colour,
                        alpha=1.0 if seed == 0 else 0.45,
                        label=tag if pts and ax is axes[0] else None,
                    )
        ax.set(xscale="log", xlabel="on-policy answer tokens", ylabel=ylabel)
        ax.xaxis.set_minor_formatter(NullFormatter())
    if len(curves) > 1:
        fig.legend(loc="lower center", ncol=2, fontsize=6.5, frameon=False)
        fig.tight_layout(rect=(0, min(0.6, 0.06 * (1 + len(curves))), 1, 1))
    else:
        axes[0].legend(fontsize=7)
        fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def merge(paths: list[Path]) -> tuple[list[tuple[str, list[dict]]], list[dict]]:
    """Several runs' ``onpolicy-curve.json`` (a curve continued on another machine or another draw
    of the same recipe's data) → the curves, each under its label, and their points pooled in
    token order, which the slope and the table read as one curve."""
    curves = []
    for path in paths:
        rec = read_json_or_none(path)
        if rec is None:
            raise PolyspecError(f"{path}: no such curve (python -m pipelines.onpolicy_curve table)")
        curves.append((rec.get("label") or rec["run"], rec["points"]))
    pooled = sorted(
        (dict(r, curve=name) for name, rows in curves for r in rows),
        key=lambda r: (r["answer_tokens"], r["seed"]),
    )
    return curves, pooled


def _write(
    prefix: Path, result: dict, lines: list[str], curves: list[tuple[str, list[dict]]]
) -> None:
    """PREFIX.json, .md and .png, then the table and the summary on stdout."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(prefix.with_suffix(".json"), result)
    atomic_write_text(prefix.with_suffix(".md"), "\n".join(lines) + "\n")
    plot(curves, prefix.with_suffix(".png"))
    print("\n".join(lines))
    print(json.dumps(result["summary"], indent=2))


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipelines.onpolicy_curve", description=__doc__.split("\n\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser(
        "answers", help="the first N answer tokens → data-<N>.jsonl beside each round's source"
    )
    p.add_argument(
        "--src", required=True, type=Path, action="append", help="a round's data.jsonl, in order"
    )
    p.add_argument("--tokens", required=True, type=int)
    t = sub.add_parser("table", help="the points → onpolicy-curve.json, .md, .png")
    t.add_argument("--run", required=True, type=Path)
    t.add_argument("--points", required=True, help="answer tokens of each point")
    t.add_argument("--seeds", default="", help="extra seeds trained at some points")
    t.add_argument("--lang", default="en")
    t.add_argument("--ab-point", type=int, help="the point the recipe A/B's arms trained at")
    t.add_argument("--arms", default="", help="the A/B's arm names (oc-<ab-point>-<arm>/)")
    t.add_argument("--label", help="the curve's name in a merged plot (default: this host's kind)")
    t.add_argument(
        "--no-chat",
        dest="chat",
        action="store_false",
        help="the language has no second held-out set (heldout-chat.jsonl is English only)",
    )
    m = sub.add_parser("merge", help="several runs' onpolicy-curve.json → one table, slope, plot")
    m.add_argument("--curve", required=True, type=Path, action="append", help="a run's curve")
    m.add_argument("--out", required=True, type=Path, help="PREFIX → PREFIX.json, .md, .png")
    a = ap.parse_args(argv)
    if a.cmd == "merge":
        curves, pooled = merge(a.curve)
        lines = table(pooled) + ["", "Curves:", ""]
        for name, rows in curves:
            lines.append(f"- {name}: " + ", ".join(f"{r['answer_tokens']:,}" for r in rows))
        result = {"curves": [str(p) for p in a.curve], "points": pooled, "summary": summary(pooled)}
        _write(a.out, result, lines, curves)
        return 0
    if a.cmd == "answers":
        for dst, n, total in answers_across(a.src, a.tokens):
            say = f"[onpolicy-curve] {dst}: {n:,} answers, {total:,} answer tokens"
            print(say, file=sys.stderr)
            print(dst)  # the files the point trains on, one a line
        return 0
    points = [int(x) for x in a.points.replace(",", " ").split()]
    seeds = [int(x) for x in a.seeds.replace(",", " ").split()]
    rows = collect(a.run, distill_rounds(a.run, a.lang), points, seeds, a.lang, a.chat)
    lines = table(rows)
    lines += ["", "Where the drafter stands (first draft's top-1):", "", *fit_table(rows)]
    label = a.label or host_kind()
    result = {
        "run": str(a.run),
        "label": label,
        "lang": a.lang,
        "points": rows,
        "summary": summary(rows),
    }
    names = a.arms.replace(",", " ").split()
    if names:
        if a.ab_point not in points:
            raise PolyspecError(f"--ab-point {a.ab_point} is not one of --points {points}")
        arms = collect_arms(a.run, a.ab_point, names, a.lang, a.chat)
        deltas = recipe(rows, arms, result["summary"]["seed_spread"])
        result.update(recipe_ab=arms, recipe_vs_point=deltas)
        lines += ["", f"Recipe A/B at {a.ab_point:,} answer tokens:", "", *arms_table(arms, deltas)]
    _write(a.run / "onpolicy-curve", result, lines, [(label, rows)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
