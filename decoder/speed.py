"""``python -m decoder.speed`` — decoding speed of every method on the same prompts, in one run.

    python -m decoder.speed --bundle runs/default/export/bundle [--langs vi,de,ja] [--max-new-tokens 96]
                            [--methods hf-generate,ar,chain,tree,adaspec] [--dtype bfloat16]

Prompts are the built-in seed instructions of each language, rendered with the target's prompt format.
Prints tokens/s, τ and the ratio to the faster of ``ar`` and ``hf-generate`` (both greedy, no stop strings,
so every method produces the same number of tokens), and checks every output equals ``ar``'s.
The full evaluation harness (benchmarks, baselines, reports) is ``decoder.bench``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from polyspec.errors import PolyspecError, cli_entry


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m decoder.speed")
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--langs", default="vi,de,ja")
    ap.add_argument("--prompts-per-lang", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--methods", default="hf-generate,ar,chain,tree,adaspec")
    ap.add_argument("--gamma", type=int, default=None, help="default: calibration g*, else 4")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)

    from decoder.core import Decoder
    from polyspec.languages import parse_languages
    from polyspec.prompts import encode, render
    from polyspec.targets import greedy_generate, load_target

    target = load_target(args.target, device=args.device, dtype=args.dtype)
    fmt = target.spec.prompt_format
    prompts = []
    for lang in parse_languages(args.langs):
        for seed in lang.seeds[: args.prompts_per_lang]:
            msgs = [{"role": "user", "content": seed.instruction}]
            prompts.append(encode(fmt, target.tokenizer, render(fmt, target.tokenizer, msgs)))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if any(m not in ("hf-generate", "ar") for m in methods) and not args.bundle:
        raise PolyspecError("speculative methods need --bundle")
    n = args.max_new_tokens
    greedy_generate(target, prompts[0], 4)  # warm-up
    results, reference = {}, None
    for m in methods:
        t0, tokens, forwards, outs = time.perf_counter(), 0, 0, []
        if m == "hf-generate":
            for ids in prompts:
                outs.append(greedy_generate(target, ids, n))
        else:
            dec = Decoder(target, args.bundle if m != "ar" else None, method=m, gamma=args.gamma)
            dec.generate(prompts[0], 4, stop=[])  # warm-up
            t0 = time.perf_counter()
            for ids in prompts:
                out = dec.generate(ids, n, stop=[])
                outs.append(out.tokens)
                forwards += out.target_forwards
        dt = time.perf_counter() - t0
        tokens = sum(len(o) for o in outs)
        reference = reference or outs
        results[m] = {"tok_s": tokens / dt, "tau": tokens / forwards if forwards else 1.0, "seconds": dt,
                      "identical": outs == reference}
    base = max(results[m]["tok_s"] for m in ("ar", "hf-generate") if m in results) if {"ar", "hf-generate"} & set(results) else None
    for m, r in results.items():
        r["speedup"] = r["tok_s"] / base if base else None
        print(f"{m:12s} {r['tok_s']:7.2f} tok/s  τ {r['tau']:.2f}  speedup {r['speedup'] or float('nan'):.2f}×  "
              f"identical {r['identical']}")
    print(json.dumps({"prompts": len(prompts), "max_new_tokens": n, "device": str(target.device),
                      "dtype": str(target.dtype), "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
