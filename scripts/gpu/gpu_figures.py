"""The decoder's cost figures on one target, one load, one JSON (scripts/gpu/gpu-check.sh's last
step).

    python scripts/gpu/gpu_figures.py --target /tmp/gpu-check/target [--bundle <engines bundle>]
        [--max-k 64] --out f.json

- verify(k)/forward(1) for k = 1…max-k at a 200-token context (decoder.calibrate.costs' protocol: a
  KV-cached forward of k tokens, rolled back after each; ``stable_curve``: --passes passes over
  every k, each k keeping the smallest of its medians of --reps, as ``decoder.calibrate`` measures
  it), and tree_budget (the flat region UNISPEC-style calibration uses; read off the monotone fit);
- the draft cost per drafted token of every drafter kind shaped for the target (random weights: cost
  does not depend on them) and of the bundle's EAGLE-3 drafter when given (EAGLE-3, Li et al. 2025);
- autoregressive tokens/s of polyspec's own loop (``Decoder(method="ar")``) and of transformers'
  ``generate``, greedy, on the built-in English seed instructions, no stop strings (both produce the
  same tokens; checked), and where each loop's time per token goes (``ar_profile``: host calls,
  kernels, device time, synchronizing calls);
- ``sdpa_ab``: the ``ar`` and ``pld`` loops with PyTorch's cuDNN attention allowed and not (CUDA
  only).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def draft_costs(target, context: list[int], bundle: str | None) -> dict:
    from decoder.calibrate.costs import draft_cost, random_runtimes

    kinds = random_runtimes(target)
    if bundle:
        from decoder.drafts.runtimes import build_runtimes
        from export.bundle import load_bundle

        b = load_bundle(bundle, target_pin=target.pin())
        rts, banks = build_runtimes(b, target, target.device)
        lang = b.languages[0]
        kinds[f"bundle:{lang}"] = (rts[lang], banks[lang].head(lang, min(b.vocab_sizes)))
    return {kind: draft_cost(target, rt, head, context) for kind, (rt, head) in kinds.items()}


def seed_prompt_ids(target, seeds) -> list[list[int]]:
    """The seed instructions as one-turn user prompts in the target's prompt format, encoded."""
    from polyspec.prompts import encode, render

    fmt = target.spec.prompt_format
    return [
        encode(
            fmt,
            target.tokenizer,
            render(fmt, target.tokenizer, [{"role": "user", "content": s.instruction}]),
        )
        for s in seeds
    ]


def ar_loops(target, max_new_tokens: int, prompts: int):
    """→ ({"polyspec-ar": fn, "hf-generate": fn}: prompt ids → greedy tokens, the English seed
    prompts' ids, the polyspec loop's per-step forward + argmax seconds as it runs,
    StepStat.verify_s)."""
    from decoder.core import Decoder
    from polyspec.languages import get_language
    from polyspec.targets import greedy_generate

    ids = seed_prompt_ids(target, get_language("en").seeds[:prompts])
    dec = Decoder(target, None, method="ar")
    steps: list[float] = []

    def polyspec_ar(p):
        out = dec.generate(p, max_new_tokens, stop=[])
        steps.extend(s.verify_s for s in out.steps)
        return out.tokens

    return (
        {
            "polyspec-ar": polyspec_ar,
            "hf-generate": lambda p: greedy_generate(target, p, max_new_tokens),
        },
        ids,
        steps,
    )


def ar_speed(target, max_new_tokens: int, prompts: int, rounds: int = 2) -> dict:
    """polyspec's AR loop and transformers' generate, interleaved prompt by prompt over ``rounds``
    (neither runs in a warmer or hotter process state than the other), plus the loop's own per-step
    forward time (``step_ms``: forward + argmax, StepStat.verify_s) — beside forward(1), it says
    whether a gap is in the step or around it."""
    sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)
    runs, ids, steps = ar_loops(target, max_new_tokens, prompts)
    for fn in runs.values():
        fn(ids[0][:16])  # warm-up
    steps.clear()
    seconds, tokens, outputs = (
        dict.fromkeys(runs, 0.0),
        dict.fromkeys(runs, 0),
        {n: [] for n in runs},
    )
    for r in range(rounds):
        # who goes first alternates by prompt too: a first-seen shape's cost is shared
        for i, p in enumerate(ids):
            for name in runs if (r + i) % 2 == 0 else reversed(runs):
                sync()
                t0 = time.perf_counter()
                toks = runs[name](p)
                sync()
                seconds[name] += time.perf_counter() - t0
                tokens[name] += len(toks)
                if r == 0:
                    outputs[name].append(toks)
    out = {
        n: {"tok_s": tokens[n] / seconds[n], "tokens": tokens[n], "seconds": seconds[n]}
        for n in runs
    }
    out["polyspec-ar"]["step_ms"] = 1e3 * sum(steps) / max(len(steps), 1)
    out["rounds"] = rounds
    out["identical"] = outputs["polyspec-ar"] == [
        t[: len(a)] for t, a in zip(outputs["hf-generate"], outputs["polyspec-ar"])
    ]
    return out


def sdpa_ab(target, max_new_tokens: int = 96) -> dict:
    """tok/s of polyspec's ``ar`` and ``pld`` loops with PyTorch's cuDNN attention backend allowed
    and not (``torch.backends.cuda.enable_cudnn_sdp``; the order on, off, off, on, so drift falls on
    both), on prompts the process has not decoded before. cuDNN builds an attention graph for new
    (query, key) shapes, up to several hundred ms each (sglang#4650, mlx#2743), and speculative
    steps keep making new pairs, which made bf16 decoding uneven where fp32 (no cuDNN path) ran
    evenly (evidence:
    docs/experiments.md#bf16-on-an-h200-with-cudnn-attention-off-the-unevenness-was-cudnns-and-polyspec-now-turns-it-off-2026-11-27-code-71ab564--d5fe6f7)."""
    from decoder.core import Decoder
    from polyspec.languages import get_language

    if target.device.type != "cuda":
        return {"skipped": "CUDA only"}
    ids = seed_prompt_ids(target, get_language("en").seeds[-4:])  # not the prompts ar_speed decoded
    before = torch.backends.cuda.cudnn_sdp_enabled()
    out: dict = {"cudnn_sdp_enabled_by_default": before}
    try:
        for i, on in enumerate((True, False, False, True)):
            torch.backends.cuda.enable_cudnn_sdp(on)
            for method in ("ar", "pld"):
                dec = Decoder(target, None, method=method)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                n = len(dec.generate(ids[i], max_new_tokens, stop=[]).tokens)
                torch.cuda.synchronize()
                rec = out.setdefault(
                    f"{method}-cudnn-{'on' if on else 'off'}", {"tokens": 0, "seconds": 0.0}
                )
                rec["tokens"] += n
                rec["seconds"] += time.perf_counter() - t0
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
    for rec in out.values():
        if isinstance(rec, dict):
            rec["tok_s"] = rec["tokens"] / rec["seconds"]
    return out


def ar_profile(target, max_new_tokens: int = 32, top: int = 8) -> dict:
    """Where each AR loop's time per token goes, one profiled answer each (torch.profiler, after a
    warm-up): aten calls per token (host-side work: a launch-bound GPU runs at the pace its host
    issues kernels), the ops with the most host time, and on CUDA the kernels and device time per
    token and the synchronizing calls per token (``torch.cuda.set_sync_debug_mode``): it looks for a
    gap between the two loops on a GPU that host work shared with the CPU does not explain
    (evidence: docs/experiments.md#polyspecs-ar-loop-against-generate)."""
    import warnings

    from torch.profiler import ProfilerActivity, profile

    cuda = target.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    runs, ids, _ = ar_loops(target, max_new_tokens, 1)
    out: dict = {}
    for name, fn in runs.items():
        fn(ids[0][:16])  # warm-up
        sync()
        t0 = time.perf_counter()
        with profile(
            activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        ) as prof:
            n = len(fn(ids[0]))
            sync()
        wall = time.perf_counter() - t0
        ev = prof.key_averages()
        host = [e for e in ev if e.key.startswith("aten::")]
        rec = {
            "tokens": n,
            "profiled_ms_per_token": 1e3 * wall / n,
            "aten_calls_per_token": sum(e.count for e in host) / n,
            "top_host_ops": [
                [e.key, round(e.count / n, 2), round(e.self_cpu_time_total / 1e3 / n, 4)]
                for e in sorted(host, key=lambda e: -e.self_cpu_time_total)[:top]
            ],
        }
        if cuda:
            dev = [e for e in ev if e.device_type == torch.autograd.DeviceType.CUDA]
            rec["kernels_per_token"] = sum(e.count for e in dev) / n
            rec["device_ms_per_token"] = sum(e.self_device_time_total for e in dev) / 1e3 / n
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode(1)  # warn at every synchronizing call
                try:
                    n = len(fn(ids[0]))
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            rec["syncs_per_token"] = sum("synchroniz" in str(w.message) for w in caught) / n
        out[name] = rec
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument(
        "--bundle",
        default=None,
        help="also time this bundle's drafter (the smoke run's engines bundle)",
    )
    ap.add_argument("--max-k", type=int, default=64)
    # 2 passes of 3 cost what one pass of 6 did, and a slow spell of the machine falls on other k in
    # the other pass
    # (evidence: docs/experiments.md#the-gpu-path-on-an-h200-pytest--m-cuda-9-of-9-the-cost-figures-again-and-the-chat-target-with-its-trained-drafter-2026-11-27-code-eef6a0a--5f4e522)  # noqa: E501
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from decoder.calibrate.costs import calibration_context, stable_curve, tree_budget, verify_curve
    from polyspec.io import atomic_write_json
    from polyspec.targets import load_target

    t0 = time.time()
    target = load_target(args.target)
    result = {
        "target": target.spec.name,
        "device": str(target.device),
        "dtype": str(target.dtype).replace("torch.", ""),
        "gpu": torch.cuda.get_device_name() if target.device.type == "cuda" else None,
        "layers": target.num_layers,
        "hidden_size": target.hidden_size,
        "vocab_size": target.vocab_size,
        "load_s": round(time.time() - t0, 1),
    }
    ctx = calibration_context(target, args.context)
    ks = list(range(1, args.max_k + 1))
    for name, fn in (
        ("verify", lambda: stable_curve(target, ctx, ks, args.reps, args.passes)),
        # before any drafter's hooks
        ("ar", lambda: ar_speed(target, args.max_new_tokens, args.prompts)),
        ("ar_profile", lambda: ar_profile(target)),
        ("sdpa_ab", lambda: sdpa_ab(target)),  # before the drafters' hooks too
        ("draft_s_per_token", lambda: draft_costs(target, ctx, args.bundle)),
        # the same process later
        ("forward1_after", lambda: verify_curve(target, ctx, [1], args.reps * args.passes)),
    ):
        t1 = time.time()
        try:  # one failing figure must not lose the others
            result[name] = fn()
        except Exception as e:  # noqa: BLE001 - recorded, the next figure is still measured
            result[name] = {"error": f"{type(e).__name__}: {e}"}
        result[f"{name}_seconds"] = round(time.time() - t1, 1)
        atomic_write_json(args.out, result)
        print(f"{name}: {time.time() - t1:.1f}s", flush=True)
    if "ratio" in result["verify"]:
        result["tree_budget"] = tree_budget(result["verify"]["monotone"])
        f1 = result["verify"]["forward1_s"]
        if "error" not in result["draft_s_per_token"]:
            result["draft_share_of_forward1"] = {
                k: v / f1 for k, v in result["draft_s_per_token"].items()
            }
        print(
            f"forward(1) {f1 * 1e3:.2f} ms; verify(k)/forward(1): "
            + " ".join(
                f"{k}:{r:.2f}"
                for k, r in result["verify"]["ratio"].items()
                if k in (1, 2, 4, 8, 16, 32, 64)
            )
        )
    if torch.cuda.is_available():
        result["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    atomic_write_json(args.out, result)
    print(
        json.dumps(
            {
                k: v
                for k, v in result.items()
                if k in ("tree_budget", "ar", "ar_profile", "draft_s_per_token")
            },
            default=str,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
