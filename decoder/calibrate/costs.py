"""``python -m decoder.calibrate.costs`` — the decoder's cost structure on this device, in one run.

    python -m decoder.calibrate.costs [--target gemma3-270m] [--dtype auto] [--context 200]
                                      [--max-k 16] [--bundle B] [--compare-unpacked]
                                      [--out costs.json]

Prints, at a context of ``--context`` tokens: forward(1) (one target forward of one token with a KV
cache), and for k = 1…max-k the verification cost verify(k) = one forward of k tokens, as a ratio to
forward(1) (medians of ``--reps``, the smallest of ``--passes`` passes; the cache is rolled back
after each, so every measurement sees the same context); then the draft cost per token of each
drafter kind — EAGLE-1 (one layer of the target's family over [embed ‖ feature], a reduced head of
8K rows), EAGLE-3 (fc over three layers, a Llama layer, its own 8K head) and the small LM of the CPU
recipe — as milliseconds and as a share of forward(1). Without ``--bundle`` the drafters are random
(cost does not depend on weights); with one, its own drafters are measured too. ``tree_budget`` =
the largest k whose verify(k) ≤ (1 + ``--flat``)·verify(2) (UNISPEC-style device awareness: how many
draft tokens one forward verifies for about the price of the smallest speculative step);
``decoder.calibrate`` stores it per device. ``--compare-unpacked`` also measures the target with
plain ``nn.Linear`` layers in the same run (``polyspec.packed`` off; passes interleaved) and prints
both curves and packed ÷ plain time per k.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from polyspec.drafter_kind import DrafterKind
from polyspec.errors import PolyspecError, cli_entry
from polyspec.exact import add_exact_argument


def _time(fn, reps: int, sync) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls after one warm-up."""
    return _time_round_robin({None: fn}, reps, sync)[None]


def _time_round_robin(fns: dict, reps: int, sync) -> dict:
    """{key: median seconds of ``fns[key]()``}, the repetitions taken in turns (every key once, then
    again, ``reps`` times) after one warm-up of each: a burst of interference on a shared CPU then
    falls on every key alike instead of on the consecutive repetitions of one key, so the medians,
    and the curve's ratios, stay what the device costs (evidence:
    docs/experiments.md#make-demo-and-the-held-out-bench-on-the-xeon-again-3444-from-a-fresh-clone-the-hybrid-106-pld-in-bf16-and-099-in-fp32-2026-11-28-bf16-host-code-cf36b24--286f3d9)."""
    for fn in fns.values():
        fn()
    out = {key: [] for key in fns}
    for _ in range(reps):
        for key, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            out[key].append(time.perf_counter() - t0)
    return {key: statistics.median(v) for key, v in out.items()}


@torch.inference_mode()
def verify_curve(target, context: list[int], ks: list[int], reps: int = 12) -> dict:
    """{"forward1_s", "verify_s": {k: s}, "ratio": {k: verify(k)/forward(1)}} at ``len(context)``
    tokens."""
    from decoder.loop.runner import TargetRunner

    runner = TargetRunner(target)
    runner.reset()
    runner.forward(context, logits_for=slice(-1, None), features=False)
    dev = runner.head.weight.device
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    kmax = max([1, *ks])
    tail = [int(t) for t in context[-16:]] or [0]
    # k tokens for every k asked (a shorter probe would verify fewer)
    probe = (tail * (kmax // len(tail) + 1))[:kmax]

    def step(k):
        def run():
            runner.forward(probe[:k], features=False)
            runner.rollback(k)

        return run

    verify = _time_round_robin({k: step(k) for k in sorted(set(ks) | {1})}, reps, sync)
    f1 = verify[1]
    return {
        "context": len(context),
        "forward1_s": f1,
        "verify_s": verify,
        "ratio": {k: v / f1 for k, v in verify.items()},
    }


def stable_curve(
    target, context: list[int], ks: list[int], reps: int = 12, passes: int = 2
) -> dict:
    """``verify_curve`` measured ``passes`` times, each k keeping the smallest of its medians: on a
    shared CPU interference only ever adds time, and one noisy row must not set the tree budget
    (evidence: docs/experiments.md#one-noisy-pass-of-the-cost-curve)."""
    runs = [verify_curve(target, context, ks, reps) for _ in range(max(1, passes))]
    verify = {k: min(r["verify_s"][k] for r in runs) for k in runs[0]["verify_s"]}
    f1 = verify[1]
    ratio = {k: v / f1 for k, v in verify.items()}
    # how far apart the passes were, on the curve calibration reads — each pass's
    # verify(k)/forward(1), so a pass slower at every k by one factor (the host's speed drifting
    # between passes) is no disagreement: per k ≥ 2 the second-lowest pass's ratio over the lowest
    # one's (with two passes, the higher over the lower), then the median over k. With three passes
    # one disturbed pass does not set it. It is calibration's γ tolerance: read in seconds (the
    # slowest pass over the fastest) it once came out 0.80, and γ 1 was chosen whatever τ said
    # (evidence: docs/experiments.md#make-demo-and-the-held-out-bench-on-the-xeon-again-3444-from-a-fresh-clone-the-hybrid-106-pld-in-bf16-and-099-in-fp32-2026-11-28-bf16-host-code-cf36b24--286f3d9)  # noqa: E501
    spread = []
    for k in verify:
        if k != 1:
            rel = sorted(r["verify_s"][k] / r["verify_s"][1] for r in runs)
            spread.append(rel[min(1, len(rel) - 1)] / rel[0] - 1)
    spread = sorted(spread) or [0.0]
    return {
        "context": len(context),
        "forward1_s": f1,
        "verify_s": verify,
        "ratio": ratio,
        "passes": len(runs),
        "monotone": monotone(ratio),
        "noise": spread[len(spread) // 2],
    }


def monotone(ratio: dict[int, float]) -> dict[int, float]:
    """The least-squares non-decreasing fit of verify(k)/forward(1) over k (scipy's isotonic
    regression): more tokens never cost less, so a dip is noise, and a single row's bump is pooled
    with its neighbours instead of cutting a budget read off a flat curve."""
    from scipy.optimize import isotonic_regression  # start-up time: scipy loads only here

    ks = sorted(ratio)
    fit = isotonic_regression([ratio[k] for k in ks]).x
    return {k: float(v) for k, v in zip(ks, fit)}


def packing_curves(
    target,
    context: list[int],
    ks: list[int],
    reps: int = 12,
    passes: int = 2,
    min_numel: int | None = None,
) -> dict:
    """The verification curve of ``target`` (loaded with ``pack=False``) with plain ``nn.Linear``
    layers and with ``polyspec.packed`` linears, measured in one process, passes interleaved (plain,
    packed, plain, …) so a drift in the machine's speed falls on both; each k keeps its smallest
    median → {"plain": curve, "packed": curve, "packed_target": the packed twin}."""
    import copy
    import dataclasses

    from polyspec.packed import pack_linears

    twin = copy.deepcopy(target.model)
    n = pack_linears(twin, min_numel)  # None: what load_target packs
    if not n:
        raise PolyspecError(
            f"nothing to compare: no linear of {target.spec.name} can be packed on {target.device} "
            f"in {str(target.dtype).replace('torch.', '')}"
        )
    packed = dataclasses.replace(target, model=twin, packed_linears=n)
    runs = {"plain": [], "packed": []}
    for _ in range(max(1, passes)):
        for name, t in (("plain", target), ("packed", packed)):
            runs[name].append(verify_curve(t, context, ks, reps))
    out = {}
    for name, rs in runs.items():
        verify = {k: min(r["verify_s"][k] for r in rs) for k in rs[0]["verify_s"]}
        out[name] = {
            "context": len(context),
            "forward1_s": verify[1],
            "verify_s": verify,
            "ratio": {k: v / verify[1] for k, v in verify.items()},
            "passes": len(rs),
        }
    out["packed_target"] = packed
    return out


def calibration_context(target, n: int = 200) -> list[int]:
    """``n`` tokens of rendered built-in seed instructions (en, then de; repeated if short): the
    context at which costs are measured."""
    from polyspec.languages import get_language
    from polyspec.prompts import encode, render

    fmt = target.spec.prompt_format
    ids: list[int] = []
    for seed in get_language("en").seeds + get_language("de").seeds:
        ids += encode(
            fmt,
            target.tokenizer,
            render(fmt, target.tokenizer, [{"role": "user", "content": seed.instruction}]),
        )
        if len(ids) >= n:
            break
    while len(ids) < n:
        ids += ids
    return ids[:n]


def tree_budget(ratio: dict, flat: float = 0.15) -> int:
    """Largest k with verify(k) ≤ (1 + flat)·verify(2), counting only the contiguous flat region
    from k = 1.

    The reference is verify(2) — the smallest speculative step (the pending token and one draft) —
    not forward(1): on a GPU a forward of 2+ tokens takes other kernels than a 1-token decode and
    costs a fixed ~15 % more (evidence:
    docs/experiments.md#the-first-gpu-run-make-gpu-check-on-an-h100-with-a-random-8b-shaped-target-2026-11-26-commit-387e935),
    a step every speculative method pays once; the budget is how far a tree can grow beyond it for
    free. On CPUs whose curve starts flat, verify(2) ≈ forward(1)."""
    base = max(1.0, ratio.get(2, 1.0))
    best = 1
    for k in sorted(ratio):
        if ratio[k] > (1 + flat) * base:
            break
        best = k
    return best


def random_runtimes(target, draft_rows: int = 8192) -> dict:
    """kind → (runtime, head) of random-weight drafters of every kind, shaped for ``target``."""
    from decoder.drafts.runtimes import EagleRuntime, HeadBank, SmallLMRuntime
    from polyspec.drafter_models import (
        Eagle3Drafter,
        EagleDrafter,
        build_small_lm,
        eagle_layer_config,
    )

    dev, dtype = target.device, target.model.get_output_embeddings().weight.dtype
    emb, head_w = target.model.get_input_embeddings(), target.model.get_output_embeddings().weight
    ids = torch.arange(min(draft_rows, target.vocab_size))
    softcap = getattr(target.model.config, "final_logit_softcapping", None)
    out = {}
    e1 = EagleDrafter(eagle_layer_config(target.model.config)).to(dev, dtype).eval()
    out["eagle1"] = (
        EagleRuntime(e1, emb, head_w, softcap),
        HeadBank(head_w, {"x": ids}, len(ids), softcap).head("x", len(ids)),
    )
    # + the hint's lookups
    e1h = (
        EagleDrafter(eagle_layer_config(target.model.config), lookup_hint=True)
        .to(dev, dtype)
        .eval()
    )
    out["eagle1-hint"] = (EagleRuntime(e1h, emb, head_w, softcap), out["eagle1"][1])
    e3 = Eagle3Drafter.for_target(target, ids).to(dev, dtype).eval()
    out["eagle3"] = (
        EagleRuntime(e3, emb, e3.lm_head.weight),
        HeadBank(e3.lm_head.weight, {}, 0, draft_ids=("x", e3.draft_ids), pre=e3.norm).head(
            "x", None
        ),
    )
    sl = (
        build_small_lm(target, hidden_size=256, num_layers=2, num_heads=4, intermediate_size=768)
        .to(dev, dtype)
        .eval()
    )
    rt = SmallLMRuntime(sl)
    out["small-lm"] = (rt, HeadBank(rt.head_weight, {"x": ids}, len(ids)).head("x", len(ids)))
    return out


@torch.inference_mode()
def draft_cost(target, runtime, head, context: list[int], n: int = 8, reps: int = 8) -> float:
    """Seconds per drafted token: a chain of ``n`` drafts (head logits → argmax → one drafter entry
    each), the drafter synced on ``context`` first (as ``DrafterSource.draft_chain`` drafts)."""
    from decoder.loop.runner import TargetRunner

    runner = TargetRunner(target)
    runner.reset()
    runner.aux_layers = (
        list(runtime.drafter.aux_layers)
        if DrafterKind.of(getattr(runtime, "drafter", None)) is DrafterKind.EAGLE3
        else None
    )
    feats, _ = runner.forward(context, logits_for=slice(-1, None))
    dev = feats.device
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    pend = len(context) - 1
    runtime.reset()
    parent0 = runtime.sync(context, feats, pend)

    def chain():
        parent, drafts = parent0, []
        for i in range(n):
            j = int(head.logits(parent).argmax())
            drafts.append(int(head.to_full(torch.tensor(j, device=dev))))
            parent = runtime.extend(
                torch.tensor([drafts[-1]], device=dev),
                parent.view(1, -1),
                torch.tensor([pend + 1 + i], device=dev),
                prefixes=[context + drafts],
            )[-1]
        runtime.rollback()

    return _time(chain, reps, sync) / n


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m decoder.calibrate.costs", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None, help="default: the target's (auto: bf16 where native)")
    add_exact_argument(ap)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--max-k", type=int, default=16)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument(
        "--passes",
        type=int,
        default=2,
        help="measure the curve this often, keep each k's smallest median",
    )
    ap.add_argument("--flat", type=float, default=0.15)
    ap.add_argument("--bundle", default=None, help="also measure this bundle's drafters")
    ap.add_argument("--out", default=None, help="write the measurements as JSON")
    ap.add_argument(
        "--compare-unpacked",
        action="store_true",
        help="also measure the target with plain nn.Linear layers (polyspec.packed off), "
        "interleaved",
    )
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)

    from polyspec.targets import load_target

    ks = list(range(1, args.max_k + 1))
    plain = None
    if args.compare_unpacked:
        target = load_target(
            args.target, device=args.device, dtype=args.dtype, pack=False, exact=args.exact
        )
        ctx = calibration_context(target, args.context)
        both = packing_curves(target, ctx, ks, args.reps, args.passes)
        plain, curve, target = both["plain"], both["packed"], both["packed_target"]
    else:
        target = load_target(args.target, device=args.device, dtype=args.dtype, exact=args.exact)
        ctx = calibration_context(target, args.context)
        curve = stable_curve(target, ctx, ks, args.reps, args.passes)
    f1 = curve["forward1_s"]
    print(
        f"{target.spec.name} on {target.device} ({str(target.dtype).replace('torch.', '')}, "
        f"{torch.get_num_threads()} threads, {target.packed_linears} packed linears), context "
        f"{len(ctx)}: "
        f"forward(1) {f1 * 1e3:.1f} ms"
    )
    print("k      " + " ".join(f"{k:>5d}" for k in curve["ratio"]))
    print("ratio  " + " ".join(f"{r:5.2f}" for r in curve["ratio"].values()))
    if plain is not None:
        print(f"plain nn.Linear, same run: forward(1) {plain['forward1_s'] * 1e3:.1f} ms")
        print("ratio  " + " ".join(f"{r:5.2f}" for r in plain["ratio"].values()))
        print("packed ÷ plain, verify(k) time")
        print(
            "       "
            + " ".join(
                f"{curve['verify_s'][k] / plain['verify_s'][k]:5.2f}" for k in curve["verify_s"]
            )
        )
    # as calibration reads it: the non-decreasing fit
    budget = tree_budget(monotone(curve["ratio"]), args.flat)
    print(
        f"tree_budget (verify(k) ≤ {1 + args.flat:.2f}·verify(2) on the non-decreasing fit): "
        f"{budget}"
    )
    kinds = random_runtimes(target)
    if args.bundle:
        from decoder.drafts.runtimes import build_runtimes
        from export.bundle import load_bundle

        b = load_bundle(args.bundle, target_pin=target.pin())
        rts, banks = build_runtimes(b, target, target.device)
        lang = b.languages[0]
        kinds[f"bundle:{lang}"] = (rts[lang], banks[lang].head(lang, min(b.vocab_sizes)))
    drafts = {}
    for kind, (rt, head) in kinds.items():
        d = draft_cost(target, rt, head, ctx)
        drafts[kind] = d
        print(f"draft {kind:14s} {d * 1e3:6.2f} ms/token  = {100 * d / f1:5.1f} % of forward(1)")
    result = {
        **curve,
        "plain": plain,
        "tree_budget": budget,
        "flat": args.flat,
        "draft_s_per_token": drafts,
        "device": str(target.device),
        "dtype": str(target.dtype),
        "threads": torch.get_num_threads(),
    }
    if args.out:
        from polyspec.io import atomic_write_json

        atomic_write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
