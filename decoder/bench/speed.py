"""``python -m decoder.bench.speed`` — decoding speed of every method on the same prompts, in one
run.

    python -m decoder.bench.speed --bundle runs/default/export/bundle [--langs vi,de,ja]
                                  [--max-new-tokens 96] [--dtype bfloat16]
                                  [--methods hf-generate,ar,chain,tree,adaspec]

Prompts are the built-in seed instructions of each language, rendered with the target's prompt
format. Prints tokens/s, τ and the ratio to the faster of ``ar`` and ``hf-generate`` (both greedy,
no stop strings, so every method produces the same number of tokens), and checks every output equals
``ar``'s. Methods: the registry's decoder methods (``decoder.methods``) and ``hf-generate``. The
full evaluation harness (benchmarks, presets, transformers' other loops, reports) is
``decoder.bench``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from decoder.core import Decoder
from decoder.methods import BASELINES, DECODER_METHODS, METHODS, parse_methods
from polyspec.errors import PolyspecError, cli_entry
from polyspec.exact import add_exact_argument
from polyspec.languages import parse_languages
from polyspec.prompts import encode, render
from polyspec.targets import greedy_generate, load_target


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m decoder.bench.speed")
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--langs", default="vi,de,ja")
    ap.add_argument("--prompts-per-lang", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument(
        "--methods",
        default="hf-generate,ar,chain,tree,adaspec",
        help=f"comma-separated, of {', '.join(DECODER_METHODS)}, hf-generate",
    )
    ap.add_argument("--gamma", type=int, default=None, help="default: calibration g*, else 4")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None)
    add_exact_argument(ap)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    methods = parse_methods(args.methods)
    other = [m for m in methods if m not in DECODER_METHODS and m != "hf-generate"]
    if other:
        raise PolyspecError(
            f"decoder.bench.speed runs {', '.join(DECODER_METHODS)} and hf-generate; "
            f"{', '.join(other)}: use python -m decoder.bench"
        )
    need = [m for m in methods if METHODS[m].needs_bundle]
    if need and not args.bundle:
        raise PolyspecError(f"{', '.join(need)} need --bundle (drafters)")

    target = load_target(args.target, device=args.device, dtype=args.dtype, exact=args.exact)
    fmt = target.spec.prompt_format
    prompts = []
    for lang in parse_languages(args.langs):
        for seed in lang.seeds[: args.prompts_per_lang]:
            msgs = [{"role": "user", "content": seed.instruction}]
            prompts.append(encode(fmt, target.tokenizer, render(fmt, target.tokenizer, msgs)))
    n = args.max_new_tokens
    greedy_generate(target, prompts[0], 4)  # warm-up
    results, reference = {}, None
    for m in methods:
        t0, tokens, forwards, outs = time.perf_counter(), 0, 0, []
        if METHODS[m].kind == "transformers":  # hf-generate: the target's own greedy generate
            for ids in prompts:
                outs.append(greedy_generate(target, ids, n))
        else:
            dec = Decoder(target, args.bundle, method=m, gamma=args.gamma)
            dec.generate(prompts[0], 4, stop=[])  # warm-up
            t0 = time.perf_counter()
            for ids in prompts:
                out = dec.generate(ids, n, stop=[])
                outs.append(out.tokens)
                forwards += out.target_forwards
        dt = time.perf_counter() - t0
        tokens = sum(len(o) for o in outs)
        reference = reference or outs
        results[m] = {
            "tok_s": tokens / dt,
            "tau": tokens / forwards if forwards else 1.0,
            "seconds": dt,
            "identical": outs == reference,
        }
    base = max((results[m]["tok_s"] for m in BASELINES if m in results), default=None)
    for m, r in results.items():
        r["speedup"] = r["tok_s"] / base if base else None
        print(
            f"{m:12s} {r['tok_s']:7.2f} tok/s  τ {r['tau']:.2f}  speedup "
            f"{r['speedup'] or float('nan'):.2f}×  "
            f"identical {r['identical']}"
        )
    print(
        json.dumps(
            {
                "prompts": len(prompts),
                "max_new_tokens": n,
                "device": str(target.device),
                "dtype": str(target.dtype),
                "results": results,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
