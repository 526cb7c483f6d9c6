"""The drafter's held-out score against the general text its pretrain read (Yi et al. 2024: the gain
of the P step grows with log pretrain tokens). Collects the runs
``scripts/experiments/learning-curve.sh`` trained — one folder ``<run>/lc-<N>/<lang>/`` a point, N
corpus tokens beside the distilled answers — into a table and a plot.

    python -m pipelines.learning_curve table --run runs/chat --corpus runs/lc
        --points "0 100000 300000 1000000"
    python -m pipelines.learning_curve prefix --src runs/lc/corpus/en-prefill/data.jsonl
        --tokens 100000

``prefix`` writes a point's share of the prefilled corpus: its first chunks (document order) up to N
tokens, as ``data-<N>.jsonl`` beside the source (the chunks' feature files are named relative to
that folder).

Per point: the corpus tokens, the tokens each stage read (``tokens_per_s`` × seconds of its ``end``
event), its training rate, and the finetune's final weights' held-out score (train/score.py: τ and
α_1..α_γ, γ = the recipe's ``eval_depth``; α_i = the share of steps accepting at least i drafts).
The pretrain's own last score is kept in the JSON, but it reads a split of that point's pretrain
data (the held-out file is the finetune's), so it does not compare across points.
Writes ``<corpus>/learning-curve.json``, ``.md`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from polyspec.errors import PolyspecError, cli_entry
from polyspec.io import atomic_write_json, atomic_write_text, read_jsonl


def corpus_prefix(src: Path, tokens: int) -> tuple[Path, int, int]:
    """The first chunks of a prefilled corpus (``corpus prefill``'s data.jsonl) holding ≥ ``tokens``
    tokens → (``data-<tokens>.jsonl`` beside it, chunks, tokens)."""
    total, lines = 0, []
    with open(src, encoding="utf-8") as fh:
        for line in fh:
            if total >= tokens:
                break
            lines.append(line)
            total += json.loads(line)["tokens"]
    if total < tokens:
        raise PolyspecError(
            f"{src} holds {total:,} tokens, fewer than the {tokens:,} asked for (prefill more)"
        )
    dst = src.parent / f"data-{tokens}.jsonl"
    atomic_write_text(dst, "".join(lines))
    return dst, len(lines), total


def stage_summary(folder: Path) -> dict:
    """One stage's ``metrics.jsonl`` → tokens read, rate, steps and its last held-out score (the
    final weights'). Tokens and seconds cover every launch of a resumed stage; None where its
    metrics predate that count (an older end record of a resumed launch held that launch alone)."""
    path = folder / "metrics.jsonl"
    if not path.is_file():
        raise PolyspecError(
            f"{path}: no metrics (has scripts/experiments/learning-curve.sh trained this point?)"
        )
    end, evals, start = None, [], None
    for rec in read_jsonl(path):
        if rec.get("event") == "end":
            end = rec
        elif rec.get("event") == "start":
            start = rec
        elif "eval" in rec:
            evals.append(rec)
    if end is None or not evals:
        raise PolyspecError(f"{path}: the stage has not finished")
    last = evals[-1]
    if "stage_tokens" in end:
        tokens, seconds = end["stage_tokens"], end["stage_seconds"]
    elif start is None or not start.get("step"):  # one launch from step 0
        tokens, seconds = round(end["train_tokens_per_s"] * end["seconds"]), end["seconds"]
    else:
        tokens = seconds = None
    return {
        "examples": start["train_examples"] if start else None,
        "steps": last["step"],
        "tokens": tokens,
        "tokens_per_s": (
            round(tokens / seconds, 1) if tokens and seconds else end["train_tokens_per_s"]
        ),
        "seconds": seconds,
        "tau": last["eval"]["tau"],
        "alpha": last["eval"]["alpha"],
        "sequences": last["eval"]["sequences"],
        "top1_teacher_forced": last["eval"].get("top1_teacher_forced"),
    }


def count(n: int | None) -> str:
    """A table cell for a token count: "–" where it is unknown."""
    return "–" if n is None else f"{n:,}"


def collect(run: Path, corpus: Path, points: list[int], lang: str) -> list[dict]:
    rows = []
    for n in points:
        sub = corpus / "corpus" / f"{lang}-prefill" / f"data-{n}.jsonl"
        got = sum(r["tokens"] for r in read_jsonl(sub)) if n and sub.is_file() else 0
        base = run / f"lc-{n}" / lang
        rows.append(
            {
                "point": n,
                "corpus_tokens": got,
                "pretrain": stage_summary(base / "pretrain"),
                "finetune": stage_summary(base / "finetune"),
            }
        )
    return rows


def table(rows: list[dict]) -> list[str]:
    k = len(rows[0]["finetune"]["alpha"])
    head = (
        "| corpus tokens | pretrain: tokens read (steps) | finetune: tokens read (steps) | "
        "held-out τ | " + " | ".join(f"α{i + 1}" for i in range(k)) + " | held-out prompts |"
    )
    lines = [head, "|" + "---|" * (5 + k)]
    for r in rows:
        p, f = r["pretrain"], r["finetune"]
        lines.append(
            f"| {r['corpus_tokens']:,} | {count(p['tokens'])} ({p['steps']}) | "
            f"{count(f['tokens'])} ({f['steps']}) | "
            f"**{f['tau']:.3f}** | "
            + " | ".join(f"{a:.3f}" for a in f["alpha"])
            + f" | {f['sequences']} |"
        )
    return lines


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["pretrain"]["tokens"]]  # the x axis: points whose count is known
    x = [r["pretrain"]["tokens"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.plot(x, [r["finetune"]["tau"] for r in rows], "o-")
    a.set(
        xscale="log",
        xlabel="tokens the pretrain read (answers + corpus)",
        ylabel="held-out τ (chain, final weights)",
    )
    for i in range(len(rows[0]["finetune"]["alpha"])):
        b.plot(x, [r["finetune"]["alpha"][i] for r in rows], "o-", label=f"α{i + 1}")
    b.set(
        xscale="log",
        xlabel="tokens the pretrain read (answers + corpus)",
        ylabel="share of steps accepting ≥ i",
    )
    b.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipelines.learning_curve", description=__doc__.split("\n\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="the points' scores → learning-curve.json, .md, .png")
    t.add_argument(
        "--run",
        required=True,
        help="the run whose answers the points finetuned on (lc-<N>/ under it)",
    )
    t.add_argument(
        "--corpus", required=True, help="the folder holding corpus/<lang>-prefill/ and the outputs"
    )
    t.add_argument(
        "--points", required=True, help="corpus tokens of each point, space- or comma-separated"
    )
    t.add_argument("--lang", default="en")
    p = sub.add_parser(
        "prefix", help="the first N tokens of a prefilled corpus → data-<N>.jsonl beside it"
    )
    p.add_argument("--src", required=True, type=Path)
    p.add_argument("--tokens", required=True, type=int)
    a = ap.parse_args(argv)
    if a.cmd == "prefix":
        dst, n, total = corpus_prefix(a.src, a.tokens)
        print(f"[learning-curve] {dst}: {n:,} chunks, {total:,} tokens")
        return 0
    points = [int(p) for p in a.points.replace(",", " ").split()]
    rows = collect(Path(a.run), Path(a.corpus), points, a.lang)
    out = Path(a.corpus)
    lines = table(rows)
    atomic_write_json(out / "learning-curve.json", {"run": a.run, "lang": a.lang, "points": rows})
    atomic_write_text(out / "learning-curve.md", "\n".join(lines) + "\n")
    plot(rows, out / "learning-curve.png")
    print("\n".join(lines))
    print(f"[learning-curve] {out / 'learning-curve.json'}, .md, .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
