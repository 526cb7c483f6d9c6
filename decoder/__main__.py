"""``python -m decoder run`` — decode one prompt with a bundle and print the text, τ and the step
trace.

    python -m decoder run --bundle runs/default/export/bundle --prompt "Viết một câu về Hà Nội."
                          [--lang auto|vi] [--method adaspec|chain|tree|ar|…]
                          [--size auto|full|8192] [--max-new-tokens 128] [--temperature 0]
                          [--top-p 1] [--trace] [--json]

The prompt is a user message, rendered with the target's prompt format (``--raw`` sends it as is).
The methods are the registry's decoder methods (``decoder.methods``).
"""

from __future__ import annotations

import argparse
import json
import sys

from decoder.core import Decoder
from decoder.methods import DECODER_METHODS, METHODS
from polyspec.errors import cli_entry
from polyspec.exact import add_exact_argument
from polyspec.prompts import encode, render
from polyspec.targets import load_target


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m decoder", description="Lossless speculative decoding with a bundle."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="decode one prompt")
    r.add_argument("--bundle", default=None, help="bundle folder (not needed for --method ar)")
    r.add_argument("--target", default="gemma3-270m")
    r.add_argument("--prompt", required=True)
    r.add_argument(
        "--raw", action="store_true", help="send the prompt text as is (no prompt format)"
    )
    r.add_argument(
        "--method",
        default="adaspec",
        choices=DECODER_METHODS,
        help="; ".join(f"{m}: {METHODS[m].paper}" for m in DECODER_METHODS),
    )
    r.add_argument(
        "--shape", default="chain", choices=["chain", "tree"], help="adaspec: draft shape"
    )
    r.add_argument(
        "--lang", default="auto", help="auto (from the prompt) or a bundle language (fixed)"
    )
    r.add_argument(
        "--size", default="auto", help="auto, full, or one of the bundle's vocabulary sizes (fixed)"
    )
    r.add_argument(
        "--gamma",
        type=int,
        default=None,
        help="chain draft length (default: calibration g*, else 4)",
    )
    r.add_argument("--max-new-tokens", type=int, default=128)
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--top-p", type=float, default=1.0)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--device", default="auto")
    r.add_argument(
        "--dtype",
        default=None,
        help="target dtype (default: the target's, auto = bf16 where native)",
    )
    add_exact_argument(r)
    r.add_argument(
        "--spectra-corpus",
        default=None,
        help="spectra/hybrid: retrieval corpus (synth JSONL or text; "
        "default: the bundle run's self-distilled text)",
    )
    r.add_argument(
        "--no-lookup-runs",
        action="store_true",
        help="adaspec: run the drafter every step, also where prompt lookup copies a running loop",
    )
    r.add_argument("--trace", action="store_true", help="print one line per step")
    r.add_argument("--json", action="store_true", help="print the full result as JSON")
    return ap


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)

    target = load_target(args.target, device=args.device, dtype=args.dtype, exact=args.exact)
    fmt = target.spec.prompt_format
    text = (
        args.prompt
        if args.raw
        else render(fmt, target.tokenizer, [{"role": "user", "content": args.prompt}])
    )
    ids = encode(fmt, target.tokenizer, text)
    dec = Decoder(
        target,
        args.bundle,
        method=args.method,
        shape=args.shape,
        lang=args.lang,
        size=args.size,
        gamma=args.gamma,
        spectra_corpus=args.spectra_corpus,
        lookup_runs=not args.no_lookup_runs,
        log=lambda m: print(f"note: {m}", file=sys.stderr),
    )
    out = dec.generate(
        ids,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )
    if args.json:
        print(json.dumps(out.to_dict(), ensure_ascii=False))
        return 0
    print(out.text.strip())
    if args.trace:
        for i, s in enumerate(out.steps):
            size = "full" if s.vocab_size is None else s.vocab_size
            print(
                f"step {i:3d}  +{s.new_tokens}  accepted {s.accepted}/{s.drafted} "
                f"({s.source or '-'})  lang {s.lang}  vocab {size}  "
                f"draft {s.draft_s * 1e3:.1f} ms  verify {s.verify_s * 1e3:.1f} ms"
                + (
                    f"  beside it: {s.spec_s * 1e3:.1f} ms drafted ({s.hidden_s * 1e3:.1f} "
                    f"hidden), {s.parallel}"
                    if s.parallel
                    else ""
                ),
                file=sys.stderr,
            )
    if out.parallel_hits or out.parallel_drops:
        print(
            f"[{args.method}] continuations drafted beside verification: {out.parallel_hits} used, "
            f"{out.parallel_drops} dropped; {out.overlap_s * 1e3:.0f} of {out.spec_s * 1e3:.0f} "
            "ms hidden",
            file=sys.stderr,
        )
    print(
        f"[{args.method}] {len(out.tokens)} tokens, {out.target_forwards} target forwards, τ = "
        f"{out.tau:.2f}, "
        f"{len(out.tokens) / out.wall_s:.1f} tok/s, finish: {out.finish_reason}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
