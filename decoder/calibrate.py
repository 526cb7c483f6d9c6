"""``python -m decoder.calibrate`` — UNISPEC device-aware calibration of the draft length γ.

    python -m decoder.calibrate --bundle runs/default/export/bundle [--sizes 1,2,3,4,6,8] [--prompts 3]

On a few calibration prompts it measures the verification cost curve s(k) for k = 1…16 tokens (one target
forward of k tokens at a 200-token context, medians of 12, the smaller of two passes; ``decoder.costs``), and for every
draft size g, decoding with ``adaspec`` at γ = g, the acceptance τ(g) (tokens per target forward of the steps the
drafter drafted: adaspec's loop runs, ``lookup_runs``, do not depend on γ and are left out), the drafter's time
per draft token and the end-to-end throughput. It fits τ(g) = (1 − α^{g+1}) / (1 − α) (α by bounded scalar minimisation) and picks
g* = argmax τ(g) / (s(g+1) + d·g) over the integer sizes 1..max(sizes), s from the measured curve (not a
constant, not a line: in bf16 the curve is flat up to ~8 tokens on this CPU). The tree budget (nodes of
``hybrid``/``spectra`` trees) is the largest k whose s(k)/s(1) ≤ 1.15. If the
fitted pick was measured and its throughput is more than 5 % below the best measured size, the measured
best wins (the fit smooths noise; measurements overrule it). The result is stored in the bundle's
``calibration.json`` under this device's key (``decoder.calibration_file``); ``Decoder`` uses its g* when γ is not
given and its tree budget when the node budget is not, for the methods whose registry entry reads them
(``decoder.methods``: ``calibration``; printed as ``used_by``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from decoder.calibration_file import CALIBRATION, device_key, load_entry, load_g_star, save
from decoder.core import Decoder
from decoder.costs import calibration_context, stable_curve, tree_budget
from decoder.methods import METHODS
from decoder.ngram_sources import PromptLookup
from export.bundle import load_bundle
from polyspec.errors import PolyspecError, cli_entry
from polyspec.languages import get_language
from polyspec.prompts import encode, render
from polyspec.targets import load_target

__all__ = ["CALIBRATION", "choose", "device_key", "fit", "load_entry", "load_g_star", "measure", "save"]


def fit(sizes: list[int], verify_s: dict[int, float], tau: dict[int, float]) -> dict:
    """Linear verify cost and geometric acceptance, from measurements at ``sizes``."""
    from scipy.optimize import minimize_scalar  # start-up time: scipy (~1 s) loads only for the fit

    g = np.array(sizes, dtype=float)
    s = np.array([verify_s[x] for x in sizes])
    b, a = np.polyfit(g, s, 1) if len(sizes) > 1 else (0.0, float(s[0]))
    t = np.array([tau[x] for x in sizes])

    def curve(alpha, gg):
        return (1 - alpha ** (gg + 1)) / (1 - alpha)

    res = minimize_scalar(lambda al: float(((curve(al, g) - t) ** 2).sum()), bounds=(1e-4, 0.9999), method="bounded")
    return {"a": float(a), "b": float(b), "alpha": float(res.x)}


def choose(sizes: list[int], verify_s: dict[int, float], tau: dict[int, float], draft_s_per_token: float,
           measured_tok_s: dict[int, float] | None = None) -> dict:
    """g* over 1..max(sizes) by exact search of τ_fit(g) / (s(g) + d·g), overruled by measurements if >5 % worse.

    s(g) is the measured verification cost, interpolated between the measured g (bf16 on CPU and GPUs verify up
    to ~8–12 tokens for the price of one: a straight line through all sizes would hide that flat region); the
    linear fit a + b·g is kept for the record."""
    f = fit(sizes, verify_s, tau)
    al = f["alpha"]
    gs = sorted(verify_s)
    curve = np.array([verify_s[g] for g in gs])

    def predicted(g):
        s = float(np.interp(g, gs, curve))
        return ((1 - al ** (g + 1)) / (1 - al)) / max(s + draft_s_per_token * g, 1e-9)

    grid = range(1, max(sizes) + 1)
    g_fit = max(grid, key=predicted)
    g_star, why = g_fit, "fit"
    if measured_tok_s:
        best = max(measured_tok_s, key=measured_tok_s.get)
        if g_fit in measured_tok_s and measured_tok_s[g_fit] < 0.95 * measured_tok_s[best]:
            g_star, why = best, "measured (the fitted pick was >5% slower when measured)"
    return {"g_star": int(g_star), "g_fit": int(g_fit), "chosen_by": why, "fit": f,
            "predicted_tok_s": {g: predicted(g) for g in grid}}


def measure(target, bundle, prompts: list[list[int]], sizes: list[int], max_new_tokens: int = 48, reps: int = 12,
            log=print, max_k: int = 16, flat: float = 0.15, context: int = 200) -> dict:
    """Verification cost curve (k = 1…max(max_k, max(sizes)+1) tokens), acceptance τ, draft time and throughput
    per draft size on this device (τ and throughput over the drafter's steps: adaspec's loop runs left out); the
    flat-verify tree budget from the curve. The curve is measured as ``python -m decoder.costs`` measures it — at
    ``context`` tokens, medians of ``reps``, two passes with the smaller median kept
    (``decoder.costs.stable_curve``) — so that one noisy row cannot set the budget."""
    curve = stable_curve(target, calibration_context(target, context), list(range(1, max(max_k, max(sizes) + 1) + 1)),
                         reps=reps)
    verify_s = {g: curve["verify_s"][g + 1] for g in sizes}  # g drafts + the pending token
    tau, draft_tok, tok_s, tok_s_all, own_s, own_n = {}, {}, {}, {}, {}, {}
    for g in sizes:
        dec = Decoder(target, bundle, method="adaspec", gamma=g)
        dec.generate(prompts[0], 8, stop=[])  # warm-up
        toks = kept = steps = 0
        secs = d_s = drafted = step_s = 0.0
        for ids in prompts:
            out = dec.generate(ids, max_new_tokens, stop=[])
            toks += len(out.tokens)
            secs += out.wall_s
            own = [s for s in out.steps if s.source != PromptLookup.name]  # the drafter's steps, not adaspec's loop runs
            kept += sum(s.new_tokens for s in own)
            steps += len(own)
            d_s += sum(s.draft_s for s in own)
            step_s += sum(s.draft_s + s.verify_s for s in own)
            drafted += sum(s.drafted for s in own)
        # throughput on the steps γ governs: a loop run's tokens do not depend on γ, and how many of them a short
        # calibration decode happens to meet would otherwise decide g* (the whole decode's rate is kept as tok_s_all)
        tau[g], draft_tok[g], own_s[g], own_n[g] = kept / max(steps, 1), d_s / max(drafted, 1), step_s, steps
        tok_s[g], tok_s_all[g] = kept / max(step_s, 1e-9), toks / secs
        log(f"g={g}: verify {verify_s[g] * 1e3:.1f} ms, τ {tau[g]:.2f} on {steps} drafter steps, "
            f"{tok_s[g]:.1f} tok/s on them ({tok_s_all[g]:.1f} tok/s overall)")
    budget = tree_budget(curve["ratio"], flat)
    log("verify(k)/forward(1): " + " ".join(f"{k}:{r:.2f}" for k, r in curve["ratio"].items())
        + f" → tree budget {budget}")
    return {"sizes": sizes, "verify_s": verify_s, "tau": tau, "tok_s": tok_s, "tok_s_all": tok_s_all,
            "drafter_steps": own_n, "drafter_step_s": own_s,
            "verify_s_all": {k - 1: s for k, s in curve["verify_s"].items() if k > 1},  # g drafts → s(g+1)
            "draft_s_per_token": statistics.mean(draft_tok.values()), "cost_curve": curve["ratio"],
            "forward1_s": curve["forward1_s"], "curve_context": curve["context"], "tree_budget": budget}


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m decoder.calibrate", description="UNISPEC draft-size calibration.")
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--sizes", default="1,2,3,4,6,8")
    ap.add_argument("--max-k", type=int, default=16, help="verification cost curve up to this many tokens")
    ap.add_argument("--prompts", type=int, default=3, help="calibration prompts (built-in seeds of the bundle's languages)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)

    target = load_target(args.target, device=args.device, dtype=args.dtype)
    bundle = load_bundle(args.bundle, target_pin=target.pin())
    try:
        sizes = sorted({int(x) for x in args.sizes.split(",") if x.strip()})
    except ValueError:
        raise PolyspecError(f"--sizes {args.sizes!r} must be comma-separated integers") from None
    if not sizes or min(sizes) < 1:
        raise PolyspecError("--sizes must be positive")
    fmt = target.spec.prompt_format
    prompts = []
    for i in range(args.prompts):
        lang = get_language(bundle.languages[i % len(bundle.languages)])
        seed = lang.seeds[3 + i // len(bundle.languages)]
        prompts.append(encode(fmt, target.tokenizer, render(fmt, target.tokenizer, [{"role": "user", "content": seed.instruction}])))
    m = measure(target, bundle, prompts, sizes, args.max_new_tokens, log=lambda s: print(s, file=sys.stderr),
                max_k=args.max_k)
    pick = choose(sizes, m["verify_s_all"], m["tau"], m["draft_s_per_token"], m["tok_s"])  # the whole cost curve
    best = max(m["tok_s"].values())
    result = {**m, **pick, "within_5pct_of_best_measured": m["tok_s"].get(pick["g_star"], 0) >= 0.95 * best,
              "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    path = save(bundle.root, device_key(target.device, target.dtype), result)
    print(json.dumps({"device": device_key(target.device, target.dtype), "g_star": pick["g_star"], "chosen_by": pick["chosen_by"],
                      "tree_budget": m["tree_budget"], "dtype": str(target.dtype).replace("torch.", ""),
                      "fit": pick["fit"], "measured_tok_s": m["tok_s"], "file": str(path),
                      "used_by": {k: [x.name for x in METHODS.values() if k in x.calibration]
                                  for k in ("g_star", "tree_budget")}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
