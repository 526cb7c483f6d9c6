"""The draft length an engine should run a drafter at (UNISPEC's calibration, applied to the engine): from the engine's
own verify-cost curve t(k)/t(1), what a drafting step costs there beyond the verification, and the drafter's
per-position acceptance on held-out prompts, the length k that maximises the predicted speedup over plain decoding.

A chain step with draft length k verifies k + 1 tokens and keeps 1 + (accepted drafts) of them; with α_i the share
of steps that accept at least i drafts (polyspec's held-out score, ``train.score``), the expected tokens per step are
E(k) = 1 + α_1 + … + α_k. In forwards of plain decoding, the step costs t(k + 1)/t(1) + a + c·k: ``a`` the fixed cost
of a speculative step in the engine (sampling, bookkeeping, the drafter's first call) and ``c`` what one drafted token
costs. Both are fitted from runs of the engine at a few draft lengths (:func:`fit_step_cost`), so the prediction
S(k) = E(k) / (t(k + 1)/t(1) + a + c·k) needs no other constant (:func:`choose`).
"""

from __future__ import annotations

import bisect

import numpy as np

# Predictions closer than this count as equal; the shortest such k is chosen (cheaper, and as fast within the noise of
# a 2-core CPU), as decoder.calibrate's TOLERANCE does for γ.
TOLERANCE = 0.02


def ratio(curve: dict[int, float], k: float) -> float:
    """t(k)/t(1) from a curve {k: seconds} (or ratios), linear between measured k, the last slope past the end."""
    ks = sorted(curve)
    if 1 not in curve:
        raise ValueError("the cost curve needs t(1)")
    if k in curve:
        return curve[k] / curve[1]
    i = min(max(bisect.bisect_left(ks, k), 1), len(ks) - 1)
    lo, hi = ks[i - 1], ks[i]
    t = curve[lo] + (curve[hi] - curve[lo]) * (k - lo) / (hi - lo)
    return max(t, 0.0) / curve[1]


def fit_step_cost(runs: dict[int, dict], plain_s_per_token: float, curve: dict[int, float]) -> dict:
    """``runs``: {draft length: {"decode_s", "steps", "mean_draft"}} measured in the engine; → {"a", "c", "points"}:
    the least-squares a, c of step cost − t(1 + mean draft)/t(1) = a + c · mean draft, in plain forwards. With one
    run (or one mean draft) c is taken as 0."""
    pts = []
    for k, r in sorted(runs.items()):
        if not r.get("steps") or r.get("decode_s") is None or r.get("mean_draft") is None:
            continue
        step = r["decode_s"] / r["steps"] / plain_s_per_token
        pts.append({"k": k, "mean_draft": r["mean_draft"], "step_forwards": step,
                    "extra": step - ratio(curve, 1 + r["mean_draft"])})
    if not pts:
        raise ValueError("no run with steps to fit the step cost from")
    md = np.array([p["mean_draft"] for p in pts])
    extra = np.array([p["extra"] for p in pts])
    if len(pts) > 1 and np.ptp(md) > 1e-6:
        c, a = np.polyfit(md, extra, 1)
    else:
        c, a = 0.0, float(extra.mean())
    return {"a": float(a), "c": float(c), "points": pts}


def expected_tokens(alpha: list[float], k: int) -> float:
    """E(k) = 1 + α_1 + … + α_k; past the measured positions the last ratio α_i/α_{i−1} continues (geometric)."""
    a = list(alpha)
    while len(a) < k:
        q = a[-1] / a[-2] if len(a) > 1 and a[-2] > 0 else (a[-1] if a else 0.0)
        a.append(a[-1] * min(q, 1.0))
    return 1.0 + sum(a[:k])


def choose(alpha: list[float], curve: dict[int, float], a: float, c: float, k_max: int = 8,
           measured: dict[int, float] | None = None, tolerance: float = TOLERANCE) -> dict:
    """The draft length with the best predicted speedup over 1..k_max (the shortest within ``tolerance`` of the best),
    overruled by ``measured`` speedups {k: ×} when the predicted pick measured > 5 % slower than the best measured."""
    predicted = {k: expected_tokens(alpha, k) / max(ratio(curve, k + 1) + a + c * k, 1e-9) for k in range(1, k_max + 1)}
    best = max(predicted.values())
    k_pred = min(k for k, s in predicted.items() if s >= (1 - tolerance) * best)
    k, why = k_pred, "predicted"
    if measured:
        top = max(measured, key=measured.get)
        if k_pred in measured and measured[k_pred] < 0.95 * measured[top]:
            k, why = top, "measured (the predicted length ran > 5 % slower than the best measured)"
    return {"draft_n": int(k), "predicted_draft_n": int(k_pred), "chosen_by": why,
            "predicted_speedup": {k: round(s, 4) for k, s in predicted.items()},
            "measured_speedup": {k: round(s, 4) for k, s in (measured or {}).items()}}
