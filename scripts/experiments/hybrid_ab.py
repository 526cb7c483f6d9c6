"""A/B of the hybrid's arm sets beside ``pld`` on the same prompts, interleaved prompt by prompt
(greedy, the target's default dtype), per language: the harness behind the arm choices in
``decoder.drafts.hybrid``.

    python scripts/experiments/hybrid_ab.py --bundle runs/demo/export/bundle \
        --variants pld,hybrid,hybrid:plain4:nolid,hybrid:only-spectra

A variant is ``pld`` or ``hybrid`` with ``:``-separated changes: ``only-ARM`` (that one no-match
arm, e.g. ``only-spectra``), ``plain4`` (the four no-match arms before 2026-11-26: plain, spectra,
drafter, drafter+spectra), ``nolid`` (no request-language key: arms measured per drafter language, a
one-step prior across requests), ``noblank`` (no ``blank`` step kind: steps with neither a lookup
match nor a SPECTRA guess count as no-match steps, as before 5c964f3), ``noweak`` (no ``weak`` step
kind: a 1-gram lookup match is a match like any other), ``nodes=N`` (SPECTRA's and the merged tree's
node budget), ``grow=N`` (prompt lookup's loop-aware chain grows to N tokens, not 20), ``plain``
(the plain forward as a no-match arm beside SPECTRA's, ``plain_arm``), ``warmup=N`` (each arm's
measured steps before the fastest one runs, not 3), ``gmax=N`` (the drafter's chain at most N deep).
Any other method of ``decoder.methods`` is a variant too, with ``gamma=N`` for a drafter method's γ
(e.g. ``adaspec:gamma=2``; default: the bundle's calibration). Prints tokens/s, τ, the answers
identical to ``pld``'s, each language's ratio to ``pld`` in tokens/s (wall time after the prefill)
and in τ, how many steps each hybrid variant ran per step kind and arm, and per language the share
of ``pld``'s step time spent on steps where prompt lookup had no match (one plain forward, one
token) with the bound it sets (Amdahl): if every such step kept 2 tokens at 1.2 forwards and every
other step ran as fast as ``pld``'s, the hybrid would run 1 / (1 − f + f · 0.6) × ``pld``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import decoder.drafts.hybrid as H  # noqa: E402
from decoder.bench.questions import read_question_files, select_questions  # noqa: E402
from decoder.core import Decoder  # noqa: E402
from export.bundle import load_bundle  # noqa: E402
from polyspec.prompts import encode, render  # noqa: E402
from polyspec.targets import load_target  # noqa: E402

DEFAULT_ARMS = H.NO_MATCH_ARMS


def build(variant: str, target, bundle):
    """→ (decoder, the no-match arms it runs with)."""
    method, *changes = variant.split(":")
    gamma = [int(c.removeprefix("gamma=")) for c in changes if c.startswith("gamma=")]
    dec = Decoder(target, bundle, method=method, gamma=gamma[-1] if gamma else None)
    arms = DEFAULT_ARMS
    for c in changes:
        # the drafter methods' γ instead of the bundle's calibrated one (``--gamma``)
        if c.startswith("gamma="):
            continue
        # the hybrid's drafter chain at most N deep (``gamma_max``, default 8)
        if c.startswith("gmax="):
            dec.source.gamma_max = int(c.removeprefix("gmax="))
        elif c.startswith("only-"):
            arms = (c.removeprefix("only-"),)
        elif c == "plain4":
            arms = ("plain", "spectra", "drafter", "drafter+spectra")
        elif c == "plain":  # the plain forward as a no-match arm beside SPECTRA's (``plain_arm``)
            dec.source.plain_arm = True
        elif c == "nolid":
            dec.source.lang_of = None
        elif c == "noblank":
            dec.source.split_blank = False
        elif c == "noweak":
            dec.source.split_weak = False
        # SPECTRA's and the merged tree's node budget (default: calibrated, ≥ 10)
        elif c.startswith("nodes="):
            dec.source.nodes = dec.source.ngram[1].nodes = int(c.removeprefix("nodes="))
        # measured steps each arm of a step kind gets before the fastest runs (default 3)
        elif c.startswith("warmup="):
            dec.source.warmup = int(c.removeprefix("warmup="))
        # how deep prompt lookup's loop-aware chain may grow (default 20)
        elif c.startswith("grow="):
            dec.source.ngram[0].grow_to = int(c.removeprefix("grow="))
        else:
            raise SystemExit(f"unknown change {c!r} in {variant!r}")
    return dec, arms


def compare(
    target,
    bundle,
    prompts: list[tuple[str, list[int]]],
    variants: list[str],
    max_new_tokens: int,
    arms_out: dict | None = None,
    no_match_out: dict | None = None,
):
    """Decode every (language, prompt ids) with every variant, interleaved prompt by prompt (the
    order reversed every other prompt). → ({variant: {language or "all": [seconds after the prefill,
    tokens, steps]}}, {variant: [tokens per prompt]}); ``arms_out`` gets {variant: {"kind:arm":
    steps it ran}} of the hybrid variants, ``no_match_out`` {variant: {language or "all": [seconds
    of steps that drafted nothing, seconds of all steps]}} (drafting + verification,
    ``StepStat``)."""
    decs = {v: build(v, target, bundle) for v in variants}
    agg: dict[str, dict[str, list]] = {v: {} for v in decs}
    outputs: dict[str, list[list[int]]] = {v: [] for v in decs}
    try:
        for dec, arms in decs.values():  # warm-up
            H.NO_MATCH_ARMS = arms
            dec.generate(prompts[0][1][:20], 8, stop=[])
        for i, (lang, p) in enumerate(prompts):
            for v, (dec, arms) in (
                list(decs.items()) if i % 2 == 0 else reversed(list(decs.items()))
            ):
                H.NO_MATCH_ARMS = arms
                out = dec.generate(p, max_new_tokens, stop=[])
                outputs[v].append(out.tokens)
                undrafted = sum(st.draft_s + st.verify_s for st in out.steps if st.drafted == 0)
                every = sum(st.draft_s + st.verify_s for st in out.steps)
                for key in (lang, "all"):
                    s = agg[v].setdefault(key, [0.0, 0, 0])
                    s[0] += out.wall_s - out.prefill_s
                    s[1] += len(out.tokens)
                    s[2] += len(out.steps)
                    if no_match_out is not None:
                        nm = no_match_out.setdefault(v, {}).setdefault(key, [0.0, 0.0])
                        nm[0] += undrafted
                        nm[1] += every
    finally:
        H.NO_MATCH_ARMS = DEFAULT_ARMS
    if arms_out is not None:
        arms_out.update(
            {v: dict(getattr(dec.source, "by_kind", {})) for v, (dec, _) in decs.items()}
        )
    return agg, outputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument(
        "--questions", default="synth/data/heldout.jsonl,decoder/data/heldout_mixed.jsonl"
    )
    ap.add_argument("--langs", default="en,de,fr,es,zh,ja,vi")
    ap.add_argument("--variants", default="pld,hybrid,hybrid:plain4:nolid,hybrid:only-spectra")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    a = ap.parse_args()
    variants = a.variants.split(",")
    if variants[0] != "pld":
        raise SystemExit("the first variant must be pld (the ratios' base)")
    target = load_target(a.target)
    bundle = load_bundle(a.bundle, target_pin=target.pin())
    qs = select_questions(read_question_files(a.questions), a.langs.split(","), 1)
    fmt = target.spec.prompt_format
    prompts = [
        (
            "mixed" if q["category"] == "mixed" else q["language"],
            encode(
                fmt,
                target.tokenizer,
                render(fmt, target.tokenizer, [{"role": "user", "content": q["turns"][0]}]),
            ),
        )
        for q in qs
    ]
    chosen, no_match = {}, {}
    agg, outputs = compare(target, bundle, prompts, variants, a.max_new_tokens, chosen, no_match)
    print(f"{len(prompts)} prompts, {a.max_new_tokens} tokens, bundle {a.bundle}")
    keys = ["all"] + sorted(k for k in agg["pld"] if k != "all")
    for v in variants:
        w, tok, st = agg[v]["all"]
        same = sum(o == r for o, r in zip(outputs[v], outputs["pld"]))
        ratios = "  ".join(
            f"{k} {agg[v][k][1] / agg[v][k][0] / (agg['pld'][k][1] / agg['pld'][k][0]):.2f}"
            for k in keys
        )
        print(
            f"{v:28s} tok/s {tok / w:6.1f}  τ {tok / st:.2f}  same as pld {same}/{len(prompts)} | "
            f"÷pld {ratios}"
        )
    for v in variants[1:]:
        print(
            f"{v:28s} τ ÷ pld's  "
            + "  ".join(
                f"{k} {agg[v][k][1] / agg[v][k][2] / (agg['pld'][k][1] / agg['pld'][k][2]):.2f}"
                for k in keys
            )
        )
    print(
        "pld's no-match steps (one plain forward): share f of its step time, and the bound 1 / (1 "
        "− f + 0.6 f)"
    )
    for k in keys:
        f = no_match["pld"][k][0] / max(no_match["pld"][k][1], 1e-9)
        print(f"  {k:6s} f {f:.2f}  bound {1 / (1 - f + 0.6 * f):.2f}")
    for v in variants:
        if chosen.get(v):
            print(
                f"{v:28s} steps per arm: "
                + ", ".join(f"{a} {n}" for a, n in sorted(chosen[v].items()))
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
