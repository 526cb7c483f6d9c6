"""The draft length an engine should run a drafter at (UNISPEC's calibration, applied to the
engine): from the engine's own verify-cost curve t(k)/t(1), what a drafting step costs there beyond
the verification, and the drafter's per-position acceptance on held-out prompts, the length k that
maximises the predicted speedup over plain decoding.

A chain step with draft length k verifies k + 1 tokens and keeps 1 + (accepted drafts) of them; with
α_i the share of steps that accept at least i drafts (polyspec's held-out score, ``train.score``),
the expected tokens per step are E(k) = 1 + α_1 + … + α_k. In forwards of plain decoding, the step
costs t(k + 1)/t(1) + a + c·k: ``a`` the fixed cost of a speculative step in the engine (sampling,
bookkeeping, the drafter's first call) and ``c`` what one drafted token costs. Both are fitted from
runs of the engine at a few draft lengths (:func:`fit_step_cost`), so the prediction S(k) = E(k) /
(t(k + 1)/t(1) + a + c·k) needs no other constant (:func:`choose`).

For the GPU engines (vLLM's ``num_speculative_tokens``, SGLang's ``--speculative-num-steps``), which
cannot run here, the cost curve is polyspec's own measured on the GPU (``python -m
decoder.calibrate.costs --out costs.json`` there: verify(k) / forward(1) and an EAGLE-3 drafter's
milliseconds a drafted token), with a = 0: the engines' fixed cost of a speculative step is not
measured, so the choice is an upper bound's (:func:`choose_from_costs`).

    python -m engines.draft_length --costs costs.json --engines <export>/engines/engines.json
        [--engine vllm,sglang]
"""

from __future__ import annotations

import argparse
import bisect
import re
from pathlib import Path

import numpy as np

from polyspec.draft_length import TOLERANCE, choose_length
from polyspec.errors import PolyspecError, cli_entry
from polyspec.io import atomic_write_json, read_json_or_none


def ratio(curve: dict[int, float], k: float) -> float:
    """t(k)/t(1) from a curve {k: seconds} (or ratios), linear between measured k, the last slope
    past the end."""
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
    """``runs``: {draft length: {"decode_s", "steps", "mean_draft"}} measured in the engine; → {"a",
    "c", "points"}: the least-squares a, c of step cost − t(1 + mean draft)/t(1) = a + c · mean
    draft, in plain forwards. With one run (or one mean draft) c is taken as 0, and so is a negative
    slope (a longer draft never makes a step cheaper: the slope is noise there, and extrapolated it
    would make every longer length look faster)."""
    pts = []
    for k, r in sorted(runs.items()):
        if not r.get("steps") or r.get("decode_s") is None or r.get("mean_draft") is None:
            continue
        step = r["decode_s"] / r["steps"] / plain_s_per_token
        pts.append(
            {
                "k": k,
                "mean_draft": r["mean_draft"],
                "step_forwards": step,
                "extra": step - ratio(curve, 1 + r["mean_draft"]),
            }
        )
    if not pts:
        raise ValueError("no run with steps to fit the step cost from")
    md = np.array([p["mean_draft"] for p in pts])
    extra = np.array([p["extra"] for p in pts])
    c, a = 0.0, float(extra.mean())
    if len(pts) > 1 and np.ptp(md) > 1e-6:
        slope, intercept = np.polyfit(md, extra, 1)
        if slope > 0:
            c, a = slope, intercept
    return {"a": float(a), "c": float(c), "points": pts}


def expected_tokens(alpha: list[float], k: int) -> float:
    """E(k) = 1 + α_1 + … + α_k; past the measured positions the last ratio α_i/α_{i−1} continues
    (geometric)."""
    a = list(alpha)
    while len(a) < k:
        q = a[-1] / a[-2] if len(a) > 1 and a[-2] > 0 else (a[-1] if a else 0.0)
        a.append(a[-1] * min(q, 1.0))
    return 1.0 + sum(a[:k])


def choose(
    alpha: list[float],
    curve: dict[int, float],
    a: float,
    c: float,
    k_max: int = 8,
    measured: dict[int, float] | None = None,
    tolerance: float = TOLERANCE,
) -> dict:
    """The draft length with the best predicted speedup over 1..k_max (the shortest within
    ``tolerance`` of the best), overruled by ``measured`` speedups {k: ×} when the predicted pick
    measured > 5 % slower than the best measured."""
    predicted = {
        k: expected_tokens(alpha, k) / max(ratio(curve, k + 1) + a + c * k, 1e-9)
        for k in range(1, k_max + 1)
    }
    # the rule decoder.calibrate's choice of γ uses too
    pick = choose_length(predicted, tolerance, measured)
    why = (
        "measured (the predicted length ran > 5 % slower than the best measured)"
        if pick.overruled
        else "predicted"
    )
    return {
        "draft_n": int(pick.length),
        "predicted_draft_n": int(pick.predicted),
        "chosen_by": why,
        "predicted_speedup": {k: round(s, 4) for k, s in predicted.items()},
        "measured_speedup": {k: round(s, 4) for k, s in (measured or {}).items()},
    }


def from_costs(costs: dict, kind: str = "eagle3") -> tuple[dict[int, float], float]:
    """A ``decoder.calibrate.costs`` result → (its verify curve {k: verify(k)/forward(1)}, c: one
    drafted token of a ``kind`` drafter in forwards(1))."""
    try:
        curve = {int(k): float(v) for k, v in costs["ratio"].items()}
        c = float(costs["draft_s_per_token"][kind]) / float(costs["forward1_s"])
    except KeyError as e:
        raise PolyspecError(
            f"not a decoder.calibrate.costs result with a {kind} drafter: no {e}"
        ) from None
    if 1 not in curve or len(curve) < 3:
        raise PolyspecError("the cost curve needs verify(k) from k = 1 on, at 3 lengths at least")
    return curve, c


def choose_from_costs(
    alpha: list[float], costs: dict, kind: str = "eagle3", k_max: int = 8
) -> dict:
    """The draft length from a device's polyspec cost curve (a = 0: an engine's fixed step cost
    unknown)."""
    curve, c = from_costs(costs, kind)
    pick = choose(alpha, curve, 0.0, c, k_max=min(k_max, max(curve) - 1))
    return {
        **pick,
        "alpha": alpha,
        "draft_cost_forwards": round(c, 4),
        "curve_context": costs.get("context"),
    }


# Where each engine's serve command (export.engines.engine_table) names the draft length.
COMMAND_LENGTH = {
    "llama.cpp": [(r"--spec-draft-n-max \d+", "--spec-draft-n-max <draft_n>")],
    "vllm": [(r'"num_speculative_tokens": \d+', '"num_speculative_tokens": <draft_n>')],
    "sglang": [
        (r"--speculative-num-steps \d+", "--speculative-num-steps <draft_n>"),
        (r"--speculative-num-draft-tokens \d+", "--speculative-num-draft-tokens <draft_n + 1>"),
    ],
}


def drafter_alpha(name: str, engines_json: Path | None) -> tuple[list[float] | None, str]:
    """Drafter ``name``'s held-out per-position acceptance (α_1…α_γ) from an export's
    ``engines.json`` file (:func:`drafter_alpha_from`); None when the file or the record is
    missing."""
    rec = read_json_or_none(engines_json) if engines_json else None
    return drafter_alpha_from(rec, name, str(engines_json))


def drafter_alpha_from(rec: dict | None, name: str, where: str) -> tuple[list[float] | None, str]:
    """Drafter ``name``'s held-out α from a loaded ``engines.json`` record: scored on every held-out
    answer (``heldout_alpha_by_lang``, pipelines.score_check), else the training's best evaluation
    (``heldout_alpha``); None when neither is recorded. ``where`` names the record in the returned
    source."""
    entry = (rec or {}).get("drafters", {}).get(name) or {}
    by_lang = (entry.get("heldout_alpha_by_lang") or {}).get(name)
    if by_lang:  # pipelines.score_check: every captured held-out answer
        return [float(x) for x in by_lang], f"{where} (heldout_alpha_by_lang)"
    if entry.get("heldout_alpha"):  # the training's best evaluation
        return [float(x) for x in entry["heldout_alpha"]], f"{where} (heldout_alpha)"
    return None, "none recorded"


def update_engines(engines_json: Path, lengths: dict, engine: str = "llama.cpp") -> None:
    """Write each drafter's chosen ``draft_n`` for ``engine`` into an export's ``engines.json`` file
    (:func:`set_draft_lengths`)."""
    rec = read_json_or_none(engines_json)
    if rec is None:
        raise PolyspecError(f"{engines_json} not found: --engines names an export's engines.json")
    set_draft_lengths(rec, lengths, engine)
    atomic_write_json(engines_json, rec)


def set_draft_lengths(rec: dict, lengths: dict, engine: str) -> None:
    """Each drafter's chosen ``draft_n`` for ``engine`` into a loaded ``engines.json`` record, and
    the engine's command there (``python -m export engines`` wrote it with the export's default)."""
    for name, pick in lengths.items():
        if name in rec.get("drafters", {}):
            rec["drafters"][name].setdefault("draft_n", {})[engine] = pick["draft_n"]
    table = rec.get("engines", {}).get(engine)
    if table is not None:
        table["draft_n"] = {n: p["draft_n"] for n, p in lengths.items()}
        # an export made without a llama.cpp build has no GGUF and no command (its "why")
        if "command" in table:
            for pattern, repl in COMMAND_LENGTH.get(engine, []):
                table["command"] = re.sub(pattern, repl, table["command"])


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m engines.draft_length",
        description="draft_n for the GPU engines from a device's decoder.calibrate.costs curve",
    )
    ap.add_argument(
        "--costs",
        required=True,
        type=Path,
        help="python -m decoder.calibrate.costs --out … (run on the GPU)",
    )
    ap.add_argument(
        "--engines",
        required=True,
        type=Path,
        help="an export's engines.json (draft_n is written into it)",
    )
    ap.add_argument(
        "--engine", default="vllm,sglang", help="engines whose draft_n this curve stands for"
    )
    ap.add_argument("--k-max", type=int, default=8)
    a = ap.parse_args(argv)
    costs = read_json_or_none(a.costs)
    if costs is None:
        raise PolyspecError(f"{a.costs} not found or not JSON")
    rec = read_json_or_none(a.engines)
    if rec is None:
        raise PolyspecError(f"{a.engines} not found: --engines names an export's engines.json")
    picks = {}
    for name in sorted(rec.get("drafters", {})):
        alpha, source = drafter_alpha_from(rec, name, str(a.engines))
        if alpha is None:
            print(f"{name}: no held-out α recorded, skipped")
            continue
        picks[name] = choose_from_costs(alpha, costs, k_max=a.k_max)
        p = picks[name]
        print(
            f"{name}: draft_n {p['draft_n']} (predicted "
            f"{p['predicted_speedup'][p['draft_n']]:.2f}× plain at a = 0; "
            f"a drafted token {p['draft_cost_forwards']:.3f} forwards; α from {source})"
        )
    for engine in [e.strip() for e in a.engine.split(",") if e.strip()]:
        set_draft_lengths(rec, picks, engine)
    atomic_write_json(a.engines, rec)
    print(f"draft_n written into {a.engines} for {a.engine}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
