"""Compare training runs by held-out simulated acceptance, step by step (pretrain-finetune vs
finetune-only, the question of Yi et al. 2024, "Towards Fast Multilingual LLM Inference").

``python -m train.compare --lang vi pretrain-finetune=runs/x/pf finetune-only=runs/x/f
untrained=runs/x/u`` reads each run's ``train/<lang>/<stage>/metrics.jsonl`` evaluation rows (and
``eval_only.json``, written by ``eval_only=true``, as step 0) and prints one markdown table: mean
accepted drafts per step at every evaluated step, and the per-position acceptance α_i of each run's
last evaluation.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from polyspec.errors import PolyspecError, cli_entry
from polyspec.io import read_json_or_none, read_jsonl


def eval_rows(run: str | Path, lang: str, stage: str = "finetune") -> dict[int, dict]:
    """step → {"tau", "accept_len", "alpha", "steps", "tokens"} (train/score.py) for one run's
    stage."""
    out_dir = Path(run) / "train" / lang / stage
    rows: dict[int, dict] = {}
    only = out_dir / "eval_only.json"
    if only.is_file():
        rec = read_json_or_none(only)
        if not isinstance(rec, dict) or "eval" not in rec:
            raise PolyspecError(f"{only} is unreadable; rerun that run with eval_only=true")
        rows[0] = rec["eval"]
    metrics = out_dir / "metrics.jsonl"
    if metrics.is_file():
        for rec in read_jsonl(metrics):  # a killed run's torn last line is skipped (and counted)
            if "eval" in rec:  # a resumed run may evaluate a step twice: the last record wins
                rows[int(rec["step"])] = rec["eval"]
    if not rows:
        raise PolyspecError(f"{out_dir}: no evaluation records (metrics.jsonl or eval_only.json)")
    return rows


def table(runs: dict[str, dict[int, dict]]) -> str:
    steps = sorted({s for rows in runs.values() for s in rows})
    head = [
        "run",
        *[f"step {s}" for s in steps],
        "α_1..α_γ at the last step",
        "held-out answer tokens",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rows in runs.items():
        last = rows[max(rows)]
        cells = [
            f"{rows[s].get('tau', rows[s]['accept_len']):.3f}" if s in rows else "—" for s in steps
        ]
        alpha = " ".join(f"{a:.3f}" for a in last["alpha"]) or "—"
        lines.append(
            "| "
            + " | ".join([name, *cells, alpha, str(last.get("tokens", last.get("starts")))])
            + " |"
        )
    return "\n".join(lines)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m train.compare", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--lang", required=True)
    ap.add_argument("--stage", default="finetune", choices=["pretrain", "finetune"])
    ap.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR")
    args = ap.parse_args(argv)
    runs = {}
    for item in args.runs:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise PolyspecError(f"{item!r}: expected NAME=RUN_DIR")
        runs[name] = eval_rows(path, args.lang, args.stage)
    print(
        f"held-out score, {args.lang}/{args.stage}: τ of the decoder's greedy chain (answer "
        "tokens per target forward)"
    )
    print(table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
