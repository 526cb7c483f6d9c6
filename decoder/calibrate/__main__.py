"""``python -m decoder.calibrate`` — UNISPEC device-aware calibration of the draft length γ.

    python -m decoder.calibrate --bundle runs/default/export/bundle [--sizes 1,2,3,4,6]
        [--prompts 8]

The command line only: what is measured, how g* and the tree budget are chosen and where they are
stored is ``decoder.calibrate.run``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from decoder.calibrate.file import device_key, save
from decoder.calibrate.run import calibration_prompts, choose, measure, stability
from decoder.methods import METHODS
from export.bundle import load_bundle
from polyspec.draft_length import TOLERANCE
from polyspec.errors import PolyspecError, cli_entry
from polyspec.exact import add_exact_argument
from polyspec.targets import load_target


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m decoder.calibrate", description="UNISPEC draft-size calibration."
    )
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--sizes", default="1,2,3,4,6,8", help="draft lengths searched: 1..max(sizes)")
    ap.add_argument(
        "--max-k",
        type=int,
        default=None,
        help="verification cost curve up to this many tokens (default: 16 on CPU, 64 on CUDA)",
    )
    ap.add_argument(
        "--prompts",
        type=int,
        default=8,
        help="calibration prompts (built-in seeds of the bundle's languages, then the run's own "
        "instructions)",
    )
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None)
    add_exact_argument(ap)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)

    target = load_target(args.target, device=args.device, dtype=args.dtype, exact=args.exact)
    bundle = load_bundle(args.bundle, target_pin=target.pin())
    try:
        sizes = sorted({int(x) for x in args.sizes.split(",") if x.strip()})
    except ValueError:
        raise PolyspecError(f"--sizes {args.sizes!r} must be comma-separated integers") from None
    if not sizes or min(sizes) < 1:
        raise PolyspecError("--sizes must be positive")
    if args.prompts < 1:
        raise PolyspecError("--prompts must be ≥ 1")
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    t0 = time.perf_counter()
    prompts = calibration_prompts(target, bundle, args.prompts, log)
    m = measure(target, bundle, prompts, sizes, args.max_new_tokens, log=log, max_k=args.max_k)
    grid = list(range(1, max(sizes) + 1))
    # the whole cost curve, τ at every g; predictions within the tolerance of the best count as
    # equal (the smallest wins). τ(g) is exact, the costs are not: predictions closer than the cost
    # curve's own pass-to-pass noise cannot be told apart (below it the pick flipped from run to run
    # on a flat optimum), so the tolerance is at least that noise
    # (evidence: docs/experiments.md#the-hybrid-beside-prompt-lookup-on-held-out-prompts--mixed-the-xeons-16-row-cliff-calibration-that-picks-the-same-γ-2026-11-26-bf16-host-code-4539a98--this-sections-commits)  # noqa: E501
    tol = max(TOLERANCE, m["curve_noise"])
    pick = choose(grid, m["verify_s_all"], m["tau"], m["draft_s_per_token"], tolerance=tol)
    per_prompt = [{g: tuple(x[g]) for g in grid} for x in m["per_prompt"]]
    stable = stability(
        per_prompt, m["verify_s_all"], m["draft_s_per_token"], pick["g_star"], tolerance=tol
    )
    result = {
        **m,
        **pick,
        "stability": stable,
        "tolerance": tol,
        "seconds": round(time.perf_counter() - t0, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    path = save(bundle.root, device_key(target.device, target.dtype), result)
    sp = m["tau_spread"].get(pick["g_star"], {})
    log(
        f"g* = {pick['g_star']}: τ {m['tau'][pick['g_star']]:.2f} (over prompts "
        f"{sp.get('min', 0):.2f}–"
        f"{sp.get('max', 0):.2f}, sd {sp.get('std', 0):.2f}); over bootstrap resamples of the "
        f"{len(prompts)} prompts "
        f"chosen again by {stable['same']:.0%}, {stable['loss_p95']:.1%} below a resample's best "
        "in 95 % of them; "
        f"{result['seconds']:.0f} s"
    )
    print(
        json.dumps(
            {
                "device": device_key(target.device, target.dtype),
                "g_star": pick["g_star"],
                "chosen_by": pick["chosen_by"],
                "stability": stable,
                "tree_budget": m["tree_budget"],
                "dtype": str(target.dtype).replace("torch.", ""),
                "tau": m["tau"],
                "predicted_tok_s": pick["predicted_tok_s"],
                "prompts": len(prompts),
                "seconds": result["seconds"],
                "file": str(path),
                "used_by": {
                    k: [x.name for x in METHODS.values() if k in x.calibration]
                    for k in ("g_star", "tree_budget")
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
