"""``python -m vocab.coverage`` — how much of the target's greedy text a run's ranked vocabularies
cover, measured on answers the vocabulary never counted: the ``ar`` answers of an eval
(``decoder.bench``), i.e. the target's own greedy text on the benchmark's prompts (measuring on them
trains nothing).

    python -m vocab.coverage --run runs/cpu-full [--answers runs/cpu-full/eval/answers/ar.jsonl]
        [--ks 8192,16384,32768] [--target gemma3-270m] [--out runs/cpu-full/eval/coverage.json]

The vocab stage's own ``coverage.json`` is measured on the held-out prompts' answers
(``synth/<l>-heldout``), a few hundred tokens per language; an eval's ``ar`` answers are a second,
independent sample (its size grows with the eval's questions per cell and new tokens).
Mixed-language questions are left out (their language is not one vocabulary's). Prints one line per
language and writes JSON {lang: {tokens, answers, coverage: {k: share}}}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from polyspec.errors import PolyspecError, cli_entry
from polyspec.io import atomic_write_json, read_jsonl
from vocab.analysis import coverage_curve
from vocab.count import token_counts
from vocab.files import load_ranked


def answer_counts(answers: Path, tokenizer, vocab_size: int) -> dict[str, tuple[np.ndarray, int]]:
    """language → (token counts [|V|] of every turn of its answers, number of answers); mixed left
    out."""
    texts: dict[str, list[str]] = {}
    for rec in read_jsonl(answers):
        if rec.get("category") == "mixed" or not rec.get("language"):
            continue
        texts.setdefault(rec["language"], []).extend(
            t for t in rec.get("turns", []) if isinstance(t, str)
        )
    return {lang: (token_counts(tokenizer, tx, vocab_size), len(tx)) for lang, tx in texts.items()}


def measure(
    run: Path, answers: Path, tokenizer, tokenizer_sha256: str, vocab_size: int, ks: list[int]
) -> dict:
    if not answers.is_file():
        raise PolyspecError(f"{answers} is missing (make eval RUN={run} METHODS=ar,… writes it)")
    out = {}
    for lang, (counts, n) in sorted(answer_counts(answers, tokenizer, vocab_size).items()):
        path = run / "vocab" / f"{lang}.safetensors"
        if not path.is_file():
            continue  # the eval asked a language the run has no vocabulary for
        ranked = load_ranked(path, tokenizer_sha256)
        out[lang] = {
            "tokens": int(counts.sum()),
            "answers": n,
            "coverage": coverage_curve(ranked.ranked_ids, counts, ks),
        }
    if not out:
        raise PolyspecError(
            f"no answer in {answers} is in a language with a vocabulary under {run / 'vocab'}"
        )
    return out


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m vocab.coverage", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--run", required=True)
    ap.add_argument("--answers", default=None, help="default: <run>/eval/answers/ar.jsonl")
    ap.add_argument("--ks", default="8192,16384,32768")
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--out", default=None, help="default: coverage.json beside the answers' folder")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    from polyspec.targets import load_target

    run = Path(args.run)
    answers = Path(args.answers) if args.answers else run / "eval" / "answers" / "ar.jsonl"
    ks = [int(k) for k in args.ks.split(",") if k.strip()]
    target = load_target(args.target, device="cpu", with_model=False)  # the tokenizer suffices
    result = measure(run, answers, target.tokenizer, target.tokenizer_sha256, target.vocab_size, ks)
    out = Path(args.out) if args.out else answers.parent.parent / "coverage.json"
    atomic_write_json(out, {"answers": str(answers), "ks": ks, "languages": result})
    for lang, r in result.items():
        print(
            f"{lang}: {r['tokens']} tokens in {r['answers']} answers · "
            + " · ".join(f"top-{k}: {100 * v:.1f} %" for k, v in r["coverage"].items())
        )
    print(f"coverage: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
