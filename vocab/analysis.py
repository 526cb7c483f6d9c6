"""Coverage and overlap of ranked vocabularies (ADASPEC Fig. 5), as JSON and PNG.

- coverage(k): share of held-out tokens whose id is among the top-k ranked ids (Fig. 5a); on
  held-out answers also with each answer's prompt ids among the k (what the decoder's reduced head
  keeps for a request);
- smallest k reaching 90/95/99 % coverage;
- overlap: |top-k(a) ∩ top-k(b)| / k for every pair of languages (Fig. 5b).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from polyspec.io import atomic_write_json


def coverage_curve(ranked_ids: np.ndarray, heldout: np.ndarray, ks: list[int]) -> dict[str, float]:
    total = heldout.sum()
    if total == 0:
        return {str(k): float("nan") for k in ks}
    cum = np.cumsum(heldout[ranked_ids.astype(np.int64)])
    return {str(k): float(cum[min(k, len(cum)) - 1] / total) for k in ks}


def prompt_coverage_curve(
    ranked_ids: np.ndarray, docs: list[tuple[list[int], list[int]]], ks: list[int]
) -> dict[str, float]:
    """coverage(k) when each answer's head also keeps its prompt's ids, as the decoder builds it for
    a request (:func:`vocab.files.with_prompt_ids`: still k ids). ``docs``: (answer ids, prompt ids)
    per answer."""
    from vocab.files import with_prompt_ids

    total = sum(len(a) for a, _ in docs)
    if total == 0:
        return {str(k): float("nan") for k in ks}
    out = {}
    for k in ks:
        covered = sum(
            int(np.isin(np.asarray(a, dtype=np.int64), with_prompt_ids(ranked_ids, k, p)[0]).sum())
            for a, p in docs
        )
        out[str(k)] = covered / total
    return out


def k_for_coverage(
    ranked_ids: np.ndarray, heldout: np.ndarray, targets=(0.90, 0.95, 0.99)
) -> dict[str, int | None]:
    """Smallest k whose top-k covers each share of held-out tokens (None: not reached by the ranked
    list)."""
    total = heldout.sum()
    cum = np.cumsum(heldout[ranked_ids.astype(np.int64)]) / max(total, 1)
    out = {}
    for t in targets:
        hit = np.nonzero(cum >= t)[0]
        out[f"{round(t * 100)}%"] = int(hit[0]) + 1 if len(hit) else None
    return out


def overlap_matrix(ranked: dict[str, np.ndarray], k: int) -> dict[str, dict[str, float]]:
    tops = {lang: set(ids[:k].tolist()) for lang, ids in ranked.items()}
    return {a: {b: len(tops[a] & tops[b]) / k for b in tops} for a in tops}


def write_coverage(
    out_dir: Path,
    curves: dict[str, dict[str, float]],
    ks_needed: dict,
    heldout_info: dict,
    with_prompt: dict[str, dict[str, float]] | None = None,
) -> None:
    """``with_prompt``: the curves of :func:`prompt_coverage_curve` (languages measured on held-out
    answers)."""
    atomic_write_json(
        out_dir / "coverage.json",
        {
            "coverage": curves,
            "coverage_with_prompt_ids": with_prompt or {},
            "k_for_coverage": ks_needed,
            "heldout": heldout_info,
        },
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for lang, curve in curves.items():
        ks = [int(k) for k in curve]
        ax.plot(ks, [100 * v for v in curve.values()], marker="o", label=lang)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("top-k ranked tokens")
    ax.set_ylabel("held-out tokens covered (%)")
    ax.set_title("Vocabulary coverage per language")
    ax.grid(alpha=0.3)
    ax.legend(ncol=2)
    fig.tight_layout()
    fig.savefig(out_dir / "coverage.png", dpi=120)
    plt.close(fig)


def write_overlap(out_dir: Path, matrix: dict[str, dict[str, float]], k: int) -> None:
    atomic_write_json(out_dir / "overlap.json", {"k": k, "overlap": matrix})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    langs = list(matrix)
    data = np.array([[matrix[a][b] for b in langs] for a in langs])
    fig, ax = plt.subplots(figsize=(1.0 + 0.7 * len(langs), 0.6 + 0.7 * len(langs)))
    im = ax.imshow(data, vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(langs)), langs)
    ax.set_yticks(range(len(langs)), langs)
    for i in range(len(langs)):
        for j in range(len(langs)):
            ax.text(
                j,
                i,
                f"{data[i, j]:.2f}",
                ha="center",
                va="center",
                color="w" if data[i, j] < 0.6 else "k",
                fontsize=8,
            )
    ax.set_title(f"Overlap of top-{k // 1024}K vocabularies")
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(out_dir / "overlap.png", dpi=120)
    plt.close(fig)
