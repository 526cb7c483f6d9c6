"""``python -m decoder.bench`` (``make eval``) — every decoding method on the same questions, same
target, same process; answers per method, ``report.md`` / ``report.json`` and PNG charts.

    python -m decoder.bench --bundle runs/default/export/bundle
        [--questions spec_bench/question.jsonl] [--langs vi,de,ja] [--per-cell 1]
        [--methods ar,hf-generate,adaspec,…] [--max-new-tokens 128] [--repeats 1]
        [--out runs/default/eval] [--keep-going]

The command line only: the questions, the methods, the protocol and the failures are
``decoder.bench.run``'s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from decoder.bench.questions import BUILTIN, read_question_files, select_questions
from decoder.bench.run import DEFAULT_METHODS, run_bench
from decoder.methods import parse_methods
from polyspec.errors import cli_entry
from polyspec.exact import add_exact_argument
from polyspec.identity import identity


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m decoder.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument(
        "--questions",
        default=None,
        help="Spec-Bench question.jsonl, or several comma-separated (default: built-in mini "
        "Multi-SpecBench)",
    )
    ap.add_argument(
        "--langs", default=None, help="comma-separated; default: the bundle's languages (+ mixed)"
    )
    ap.add_argument("--categories", default=None)
    ap.add_argument("--per-cell", type=int, default=None, help="questions per (language, category)")
    ap.add_argument(
        "--methods", default=DEFAULT_METHODS, help="comma-separated names of decoder.methods"
    )
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument(
        "--assistant",
        default=None,
        help="hf-assistant folder for hf-assisted (default, with a small-LM "
        "bundle: its first drafter)",
    )
    ap.add_argument("--out", default=None, help="default: <bundle>/../../eval or runs/default/eval")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None)
    add_exact_argument(ap)
    ap.add_argument(
        "--engine-bundle",
        default=None,
        help="the EAGLE-3 drafters engines load (<run>/export/engines/bundle): method eagle3 runs "
        "them",
    )
    ap.add_argument(
        "--gamma",
        type=int,
        default=None,
        help="γ of the drafter methods (adaspec, chain, tree, spide) instead of the bundle's "
        "calibrated one",
    )
    ap.add_argument(
        "--keep-going",
        action="store_true",
        help="exit 0 even when a method failed (the report lists it either way)",
    )
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    # the inputs first: a bad questions file or method name fails before any model loads
    methods = parse_methods(args.methods)
    rows = read_question_files(args.questions)

    # start-up time: torch and transformers load only now, after the inputs are checked
    from export.bundle import load_bundle
    from polyspec.targets import load_target

    target = load_target(args.target, device=args.device, dtype=args.dtype, exact=args.exact)
    bundle = load_bundle(args.bundle, target_pin=target.pin()) if args.bundle else None
    engines = (
        load_bundle(args.engine_bundle, target_pin=target.pin()) if args.engine_bundle else None
    )
    langs = args.langs.split(",") if args.langs else (bundle.languages if bundle else None)
    qs = select_questions(
        rows,
        langs,
        args.per_cell,
        args.categories.split(",") if args.categories else None,
        args.questions or BUILTIN,
    )
    out = (
        Path(args.out)
        if args.out
        else (
            Path(args.bundle).resolve().parent.parent / "eval"
            if args.bundle
            else Path("runs/default/eval")
        )
    )
    report = run_bench(
        target,
        bundle,
        qs,
        methods,
        args.max_new_tokens,
        args.repeats,
        out,
        assistant=args.assistant,
        log=lambda m: print(f"note: {m}", file=sys.stderr),
        gamma=args.gamma,
        engine_bundle=engines,
    )
    for m, d in report["methods"].items():
        o = d["overall"]
        same = identity(report, m) if m != "ar" and report.get("agreement") else o["identical"]
        print(
            f"{m:16s} speedup {o['speedup']:.2f}×  τ {o['tau']:.2f}  {o['tok_s']:.1f} tok/s  "
            f"identical: {same}"
        )
    print(f"report: {out / 'report.md'}")
    if report["failed"]:
        what = "; ".join(
            f"{f['method']} (question {f['question_id']}): {f['error']}"
            if f["question_id"] is not None
            else f"{f['method']} (build): {f['error']}"
            for f in report["failed"]
        )
        print(
            f"{'note' if args.keep_going else 'error'}: {len(report['failed'])} method(s) failed "
            "and are listed "
            f"in report.md: {what}",
            file=sys.stderr,
        )
        return 0 if args.keep_going else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
