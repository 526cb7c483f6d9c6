"""What "identical to ``ar``" means in a bench report (``decoder.bench``'s report.json: ``dtype``,
``exact`` and ``agreement``), as one phrase per method — read by the bench's own report and the
pipeline's (``pipelines.report``).

- shape-invariant forwards (``polyspec.exact``, any dtype): every greedy answer must equal AR's;
- fp32 without them: equal by the tests (rounding differences too small to flip a token there);
- bf16 without them: near-ties (an AR logit margin ≤ ``NEAR_TIE``) may flip a greedy token; the
  phrase says how far the worst divergence was from a tie.
"""

from __future__ import annotations

# an AR logit margin at a divergence up to this is a rounding-level near-tie (bf16: ≤ 0.25 measured)
NEAR_TIE = 0.5


def identity_mode(r: dict) -> str:
    """What identity with ``ar`` means in the mode the bench ran (its dtype, and whether forwards
    were shape-invariant: ``polyspec.exact``)."""
    if r.get("exact"):
        return f"{r['dtype']}, shape-invariant"
    return "fp32" if r["dtype"] == "float32" else f"{r['dtype']}, not shape-invariant"


def identity(r: dict, method: str, lang: str | None = None) -> str:
    """One phrase for a method's agreement with ``ar`` (all languages, or one): e.g. "24/24
    identical (bf16, shape-invariant)" or "22/24 identical (bf16, not shape-invariant; every
    divergence a near-tie ≤ 0.25)"."""
    ag = (r.get("agreement") or {}).get(method) or {}
    groups = list(ag.values()) if lang is None else [ag[lang]] if lang in ag else []
    if not groups:
        return "–"
    same, n = sum(g["identical"] for g in groups), sum(g["answers"] for g in groups)
    note = identity_mode(r)
    if same < n:
        worst = max(
            (g["margin_max"] for g in groups if g.get("margin_max") is not None), default=None
        )
        if worst is None:
            note += "; the divergences end early (EOS or a stop string)"
        elif worst <= NEAR_TIE:
            note += f"; every divergence a near-tie ≤ {worst:.2f}"
        else:
            note += f"; a divergence at margin {worst:.2f}: more than a near-tie"
    return f"{same}/{n} identical ({note})"
