"""UNISPEC device-aware calibration of the draft length γ, behind ``python -m decoder.calibrate``
(its CLI: ``decoder/calibrate/__main__.py``).

Costs, on this device: the verification cost curve s(k) for k = 1…16 tokens (one target forward of k
tokens at a 200-token context, medians of 12, the smallest of three passes, then made non-decreasing
by an isotonic fit; ``decoder.calibrate.costs``) and the drafter's time per draft token. Acceptance,
per prompt and for every draft length at once (``profile`` and ``walk``): ``adaspec`` answers each
calibration prompt at γ = max(sizes); one teacher-forced target forward over prompt + answer gives
the target's features at every position; at every answer position the drafter drafts a chain of
max(sizes) tokens, whose accepted length A(p) is read off the answer (greedy: the target's tokens
are known). Decoding at γ = g is then a walk: from the first pending position, a drafter step keeps
min(A(p), g) drafts plus the target's token; a loop run (``adaspec``'s prompt lookup,
``lookup_runs``) keeps what it keeps at any γ and is left out of τ. So τ(g) is exact for every g on
the very same positions, not one noisy decode per size, and costs one decode per prompt instead of
one per size and prompt. g* is the smallest g = 1..max(sizes) whose τ(g) / (s(g+1) + d·g), pooled
over the prompts, is within the tolerance of the best (``TOLERANCE``, 2 %, or the cost curve's
measured pass-to-pass noise when that is larger: τ(g) is exact, the costs are measured); its
stability (the share of 200 bootstrap resamples of the prompts that choose it again, and what it
loses against each resample's own best) and the spread of τ(g*) over prompts are reported. The tree
budget (nodes of ``hybrid``/``spectra`` trees) is the largest k whose s(k) ≤ 1.15·s(2)
(``decoder.calibrate.costs.tree_budget``; a tree gets that many tokens, the pending one among them).
The result is stored in the bundle's ``calibration.json`` under this device's key
(``decoder.calibrate.file``); ``Decoder`` uses its g* when γ is not given and its tree budget when
the node budget is not, for the methods whose registry entry reads them (``decoder.methods``:
``calibration``; printed as ``used_by``).
"""

from __future__ import annotations

import random
import statistics
import time

import numpy as np
import torch

from decoder.calibrate.costs import calibration_context, stable_curve, tree_budget, verify_curve
from decoder.calibrate.file import CALIBRATION, device_key, load_entry, load_g_star, save
from decoder.core import Decoder
from decoder.drafts.types import DecodeState
from polyspec.draft_length import choose_length
from polyspec.languages import get_language
from polyspec.prompts import encode, render

__all__ = [
    "CALIBRATION",
    "choose",
    "device_key",
    "fit",
    "load_entry",
    "load_g_star",
    "measure",
    "profile",
    "save",
    "stability",
    "walk",
]


def fit(sizes: list[int], verify_s: dict[int, float], tau: dict[int, float]) -> dict:
    """Linear verify cost and geometric acceptance, from measurements at ``sizes``."""
    from scipy.optimize import minimize_scalar  # start-up time: scipy (~1 s) loads only for the fit

    g = np.array(sizes, dtype=float)
    s = np.array([verify_s[x] for x in sizes])
    b, a = np.polyfit(g, s, 1) if len(sizes) > 1 else (0.0, float(s[0]))
    t = np.array([tau[x] for x in sizes])

    def curve(alpha, gg):
        return (1 - alpha ** (gg + 1)) / (1 - alpha)

    res = minimize_scalar(
        lambda al: float(((curve(al, g) - t) ** 2).sum()), bounds=(1e-4, 0.9999), method="bounded"
    )
    return {"a": float(a), "b": float(b), "alpha": float(res.x)}


def choose(
    sizes: list[int],
    verify_s: dict[int, float],
    tau: dict[int, float],
    draft_s_per_token: float,
    measured_tok_s: dict[int, float] | None = None,
    tolerance: float = 0.0,
) -> dict:
    """g* over 1..max(sizes): the argmax of τ(g) / (s(g) + d·g) — with ``tolerance``, the smallest g
    predicted within that fraction of the best (a flat optimum then gives the same, cheaper pick run
    after run) —, overruled by measurements if >5 % worse.

    τ(g) is the measured one where given (``measure`` gives it for every g), else the geometric
    fit's (1 − α^{g+1}) / (1 − α) through the given sizes. s(g) is the measured verification cost,
    interpolated between the measured g (bf16 on CPU and GPUs verify up to ~8–12 tokens for the
    price of one: a straight line through all sizes would hide that flat region); the linear fit a +
    b·g is kept for the record."""
    f = fit(sorted(tau), verify_s, tau)
    al = f["alpha"]
    gs = sorted(verify_s)
    curve = np.array([verify_s[g] for g in gs])

    def predicted(g):
        s = float(np.interp(g, gs, curve))
        t = tau[g] if g in tau else (1 - al ** (g + 1)) / (1 - al)
        return t / max(s + draft_s_per_token * g, 1e-9)

    grid = range(1, max(sizes) + 1)
    pred = {g: predicted(g) for g in grid}
    # the rule engines.draft_length's engine choice uses too
    pick = choose_length(pred, tolerance, measured_tok_s)
    why = "measured τ(g) for every g" if all(g in tau for g in grid) else "fit"
    if pick.overruled:
        why = "measured (the fitted pick was >5% slower when measured)"
    return {
        "g_star": int(pick.length),
        "g_fit": int(pick.predicted),
        "chosen_by": why,
        "fit": f,
        "predicted_tok_s": pred,
    }


def profile(dec: Decoder, prompt_ids: list[int], max_new_tokens: int, gamma: int) -> dict:
    """One prompt's acceptance at every answer position, for every draft length ≤ ``gamma`` at once.

    ``dec`` (an ``adaspec`` decoder at γ = ``gamma``) answers the prompt; one teacher-forced target
    forward over prompt + answer gives the target's features at every position; then, position by
    position as decoding would reach them, the source proposes what it would there — a loop run
    (prompt lookup, ``lookup_runs``) or the drafter's chain of ``gamma`` tokens — and ``acc[i]`` is
    how many of its tokens the answer continues with (greedy: exactly what verification would keep).
    ADASPEC's language and size switch every u tokens as they would. → {"prompt_len", "length",
    "acc", "loop", "draft_s", "drafted", "decode": the GenerationResult}."""
    out = dec.generate(prompt_ids, max_new_tokens, stop=[])
    full, P = list(prompt_ids) + list(out.tokens), len(prompt_ids)
    src, runner = dec.source, dec.runner
    runner.reset()
    with torch.inference_mode():
        feats, _ = runner.forward(full, logits_for=slice(-1, None), features=True)
    runner.reset()
    ctx = DecodeState(full[: P + 1], feats, P, pend=P)
    src.begin(ctx)
    acc, loop, draft_s, drafted = [], [], 0.0, 0
    for p in range(P, len(full) - 1):
        # the target's token after the last kept draft must still lie in the answer
        ctx.tokens, ctx.pend, ctx.max_depth = full[: p + 1], p, len(full) - 2 - p
        run = src.loop_run(ctx)
        if run.tokens:
            chain = run.tokens
        else:
            t0 = time.perf_counter()
            with torch.inference_mode():
                chain = src.draft_chain(ctx, min(gamma, ctx.max_depth))[0]
            if feats.is_cuda:
                torch.cuda.synchronize(feats.device)
            # the first draft syncs the whole prompt: a one-off, not the cost of a draft
            if p > P and chain:
                draft_s, drafted = draft_s + time.perf_counter() - t0, drafted + len(chain)
        n = 0
        while n < len(chain) and chain[n] == full[p + 1 + n]:
            n += 1
        acc.append(n)
        loop.append(bool(run.tokens))
        src.advance(ctx, 1)
    return {
        "prompt_len": P,
        "length": len(full),
        "acc": acc,
        "loop": loop,
        "draft_s": draft_s,
        "drafted": drafted,
        "decode": out,
    }


def walk(prof: dict, g: int) -> tuple[int, int]:
    """Greedy decoding at γ = g over one profiled answer → (tokens emitted by drafter steps, drafter
    steps): from the first pending position, a drafter step keeps min(A(p), g) drafts plus the
    target's token; a loop run keeps what it keeps at any γ and is not counted (γ does not govern
    it)."""
    P, end = prof["prompt_len"], prof["length"] - 1
    p = P
    kept = steps = 0
    while p < end:
        a = prof["acc"][p - P]
        if not prof["loop"][p - P]:
            a = min(a, g)
            steps += 1
            kept += a + 1
        p += a + 1
    return kept, steps


def stability(
    per_prompt: list[dict[int, tuple[int, int]]],
    verify_s: dict[int, float],
    draft_s_per_token: float,
    g_star: int,
    resamples: int = 200,
    seed: int = 0,
    tolerance: float = 0.0,
) -> dict:
    """How much the prompts decide g*: over bootstrap resamples of the prompts (same costs), the
    share whose pooled τ(g) choose ``g_star`` again (``same``), and what ``g_star`` loses on a
    resample against that resample's own best g in predicted tokens/s (``loss_median``,
    ``loss_p95``: a flat optimum makes ``same`` low and the loss small)."""
    gs = sorted(per_prompt[0])
    rng, same, losses = random.Random(seed), 0, []
    for _ in range(resamples):
        pick = [per_prompt[rng.randrange(len(per_prompt))] for _ in per_prompt]
        tau = {g: sum(x[g][0] for x in pick) / max(sum(x[g][1] for x in pick), 1) for g in gs}
        c = choose(gs, verify_s, tau, draft_s_per_token, tolerance=tolerance)
        same += c["g_star"] == g_star
        pred = c["predicted_tok_s"]
        losses.append(1 - pred[g_star] / max(pred.values()))
    losses.sort()
    return {
        "same": same / resamples,
        "loss_median": losses[len(losses) // 2],
        "loss_p95": losses[min(len(losses) - 1, int(0.95 * len(losses)))],
        "resamples": resamples,
    }


# the cost curve's share of the calibration time: its reps per point follow from forward(1), so that
# a fast device gets the repetitions that keep the pick of γ stable (evidence:
# docs/experiments.md#calibration-repetitions)
CURVE_SECONDS = 30.0
# how far the verification cost curve is measured: CPUs leave their flat region within 8–16 tokens,
# a GPU's curve can stay flat to ~40 tokens
# (evidence: docs/experiments.md#the-first-gpu-run-make-gpu-check-on-an-h100-with-a-random-8b-shaped-target-2026-11-26-commit-387e935)  # noqa: E501
DEFAULT_MAX_K = {"cpu": 16, "cuda": 64}


def measure(
    target,
    bundle,
    prompts: list[list[int]],
    sizes: list[int],
    max_new_tokens: int = 48,
    reps: int | None = None,
    log=print,
    max_k: int | None = None,
    flat: float = 0.15,
    context: int = 200,
) -> dict:
    """Verification cost curve (k = 1…max(max_k, max(sizes)+1) tokens), the drafter's cost per draft
    token, and τ(g) for every g = 1..max(sizes) on every prompt (``profile``, ``walk``): pooled, per
    prompt, and the spread; the flat-verify tree budget from the curve. The curve is measured as
    ``python -m decoder.calibrate.costs`` measures it — at ``context`` tokens, medians of ``reps``
    (default: what ``CURVE_SECONDS`` allows), three passes with the smallest median kept
    (``decoder.calibrate.costs.stable_curve``) — and g* and the budget read its non-decreasing fit
    (``monotone``), so that one noisy row cannot set them."""
    gmax = max(sizes)
    if max_k is None:  # as far as the device's curve can stay flat (DEFAULT_MAX_K)
        max_k = DEFAULT_MAX_K["cuda" if target.device.type == "cuda" else "cpu"]
    ctx, ks = calibration_context(target, context), list(range(1, max(max_k, gmax + 1) + 1))
    # as many as CURVE_SECONDS allow, at least 8 (evidence:
    # docs/experiments.md#calibration-repetitions)
    if reps is None:
        f1 = verify_curve(target, ctx, [1], 3)["forward1_s"]
        reps = max(8, min(24, int(CURVE_SECONDS / (3 * len(ks) * f1))))
    # three passes: the tree budget is read off a flat curve
    curve = stable_curve(target, ctx, ks, reps=reps, passes=3)
    # g* and the budget read the non-decreasing fit of the curve
    f1, mono = curve["forward1_s"], curve["monotone"]
    dec = Decoder(target, bundle, method="adaspec", gamma=gmax)
    dec.generate(prompts[0], 8, stop=[])  # warm-up
    per_prompt, draft_s, drafted, dec_toks, dec_secs, dec_kept, dec_steps = [], 0.0, 0, 0, 0.0, 0, 0
    for i, ids in enumerate(prompts):
        prof = profile(dec, ids, max_new_tokens, gmax)
        per_prompt.append({g: walk(prof, g) for g in range(1, gmax + 1)})
        draft_s, drafted = draft_s + prof["draft_s"], drafted + prof["drafted"]
        out = prof["decode"]
        # the drafter's steps of the real decode
        own = [s for s in out.steps if s.source == dec.source.name]
        dec_toks, dec_secs = dec_toks + len(out.tokens), dec_secs + out.wall_s
        dec_kept, dec_steps = dec_kept + sum(s.new_tokens for s in own), dec_steps + len(own)
        t = per_prompt[-1]
        log(
            f"prompt {i + 1}/{len(prompts)}: {prof['length'] - prof['prompt_len']} tokens, "
            f"{t[1][1]} drafter steps "
            f"at γ 1; τ " + " ".join(f"{g}:{k / max(n, 1):.2f}" for g, (k, n) in t.items())
        )
    gs = range(1, gmax + 1)
    tau = {
        g: sum(x[g][0] for x in per_prompt) / max(sum(x[g][1] for x in per_prompt), 1) for g in gs
    }
    by_prompt = {g: [x[g][0] / x[g][1] for x in per_prompt if x[g][1]] for g in gs}
    spread = {
        g: {"mean": statistics.mean(v), "std": statistics.pstdev(v), "min": min(v), "max": max(v)}
        for g, v in by_prompt.items()
        if v
    }
    budget = tree_budget(mono, flat)
    log(
        "verify(k)/forward(1): "
        + " ".join(f"{k}:{r:.2f}" for k, r in curve["ratio"].items())
        + f" → tree budget {budget}"
    )
    return {
        "sizes": sizes,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "verify_s": {g: f1 * mono[g + 1] for g in sizes},  # g drafts + the pending token
        "verify_s_all": {k - 1: f1 * r for k, r in mono.items() if k > 1},  # g drafts → s(g+1)
        "curve_noise": curve["noise"],
        "curve_reps": reps,
        "cost_curve_monotone": mono,
        "tau": tau,
        "tau_spread": spread,
        "drafter_steps": {g: sum(x[g][1] for x in per_prompt) for g in gs},
        "per_prompt": [{g: list(x[g]) for g in gs} for x in per_prompt],
        "draft_s_per_token": draft_s / max(drafted, 1),
        "drafted": drafted,
        # the real decodes at γ = max(sizes), for the record: their τ on drafter steps is what the
        # walk predicts
        "decode_gamma": gmax,
        "decode_tau": dec_kept / max(dec_steps, 1),
        "decode_tok_s": dec_toks / max(dec_secs, 1e-9),
        "cost_curve": curve["ratio"],
        "forward1_s": f1,
        "curve_context": curve["context"],
        "tree_budget": budget,
    }


def calibration_prompts(target, bundle, n: int, log=print) -> list[list[int]]:
    """``n`` prompts: the built-in seed instructions of the bundle's languages (from the fourth of
    each, languages in turn), then the instructions the target wrote itself in the bundle's run
    (``synth/<lang>/data.jsonl``, the human turn of ShareGPT ``conversations``); never the held-out
    or benchmark prompts the evaluation uses."""
    fmt = target.spec.prompt_format
    texts: list[str] = []
    langs = [get_language(code) for code in bundle.languages]
    for j in range(max(len(x.seeds) for x in langs)):
        texts += [x.seeds[(3 + j) % len(x.seeds)].instruction for x in langs if j < len(x.seeds)]
    if len(texts) < n:
        from polyspec.io import read_jsonl

        run = bundle.root.resolve().parent.parent
        for code in bundle.languages:
            f = run / "synth" / code / "data.jsonl"
            if f.is_file():
                texts += [
                    c[0]["value"]
                    for c in (r.get("conversations") for r in read_jsonl(f))
                    if c and c[0].get("from") == "human"
                ][:n]
    texts = list(dict.fromkeys(texts))
    if len(texts) < n:
        log(f"calibration: {len(texts)} distinct prompts available, not {n}")
    return [
        encode(
            fmt, target.tokenizer, render(fmt, target.tokenizer, [{"role": "user", "content": t}])
        )
        for t in texts[:n]
    ]
