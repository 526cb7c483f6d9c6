"""Benchmark: the batched synth engine vs one-prompt-at-a-time transformers ``generate``.

Same target, same prompts (the built-in seeds' instructions in every language, laid out as Alg. 1
response prompts), same sampling (T=1, EOS or max_new_tokens), one process; prints tokens/s of both
and their ratio.

    python -m synth.bench [--target gemma3-270m] [--prompts 16] [--batch-size 16]
        [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import time

import torch

from polyspec.errors import cli_entry
from polyspec.languages import builtin_codes, get_language
from polyspec.prompts import encode, render
from polyspec.targets import load_target
from synth.engines import Request, TransformersEngine


def bench_prompts(target, n: int) -> list[str]:
    fmt = target.spec.prompt_format
    pool = [
        s.instruction
        for i in range(6)
        for c in builtin_codes()
        for s in get_language(c).seeds[i : i + 1]
    ]
    return [render(fmt, target.tokenizer, [{"role": "user", "content": p}]) for p in pool[:n]]


def one_at_a_time(
    target, prompts: list[str], max_new_tokens: int, seed: int = 0
) -> tuple[int, float]:
    """transformers ``generate`` per prompt (batch size 1), sampling at T=1."""
    fmt, tok, eos = target.spec.prompt_format, target.tokenizer, target.tokenizer.eos_token_id
    tokens, t0 = 0, time.perf_counter()
    for i, p in enumerate(prompts):
        ids = torch.tensor([encode(fmt, tok, p)], device=target.device)
        torch.manual_seed(seed + i)
        with torch.inference_mode():
            out = target.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=max_new_tokens,
                pad_token_id=tok.pad_token_id,
            )
        new = out[0, ids.shape[1] :].tolist()
        tokens += new.index(eos) + 1 if eos in new else len(new)
    return tokens, time.perf_counter() - t0


def batched(
    target, prompts: list[str], max_new_tokens: int, batch_size: int, seed: int = 0
) -> tuple[int, float]:
    engine = TransformersEngine(target, batch_size=batch_size)
    t0 = time.perf_counter()
    res = engine.generate(
        [Request(p, seed + i, 1.0, 1.0, max_new_tokens) for i, p in enumerate(prompts)]
    )
    return sum(r.num_tokens for r in res), time.perf_counter() - t0


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m synth.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
    target = load_target(args.target, device=args.device)
    prompts = bench_prompts(target, args.prompts)
    batched(target, prompts[:2], 4, 2)  # warm-up both paths
    one_at_a_time(target, prompts[:1], 4)
    n1, s1 = one_at_a_time(target, prompts, args.max_new_tokens)
    nb, sb = batched(target, prompts, args.max_new_tokens, args.batch_size)
    result = {
        "target": target.spec.name,
        "device": str(target.device),
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "one_at_a_time": {"tokens": n1, "seconds": round(s1, 2), "tokens_per_s": round(n1 / s1, 1)},
        "batched": {
            "batch_size": args.batch_size,
            "tokens": nb,
            "seconds": round(sb, 2),
            "tokens_per_s": round(nb / sb, 1),
        },
    }
    result["speedup"] = round(
        result["batched"]["tokens_per_s"] / result["one_at_a_time"]["tokens_per_s"], 2
    )
    print(f"one-at-a-time generate: {n1} tokens in {s1:.1f}s = {n1 / s1:.1f} tok/s")
    print(f"batched engine (bs={args.batch_size}): {nb} tokens in {sb:.1f}s = {nb / sb:.1f} tok/s")
    print(f"ratio batched / one-at-a-time: {result['speedup']:.2f}x")
    if args.json:
        from polyspec.io import atomic_write_json

        atomic_write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
