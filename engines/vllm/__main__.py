"""``python -m engines.vllm`` (``make check-vllm``) — polyspec's drafters served by vLLM's offline
``LLM``.

    python -m engines.vllm --target T --drafters <run>/export/engines --out <run>/vllm [--langs en]
        [--prompts 24] [--n 128] [--sweep 1,2,3,4] [--batch 1,16] [--dtype float32|bfloat16]
        [--ngram-k 3] [--hybrid-min auto|2,3] [--hybrid-drafter 2] [--questions FILE[,FILE]]
        [--draft-models DIR] [--engines <run>/export/engines/engines.json] [--eager]

What runs and what is measured: :mod:`engines.vllm.run`; the draft length and the report:
:mod:`engines.vllm.report`. Writes ``<out>/vllm.json``, ``<out>/vllm.md`` and each engine's log
under ``<out>/logs/``; with ``--engines``, the chosen ``draft_n`` into that ``engines.json``. Exit
status 1 when, in float32, a mode's output differs from plain's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engines.common import (
    add_drafter_args,
    add_engines_arg,
    exit_status,
    parse_langs,
    print_draft_n,
    print_report,
)
from engines.vllm.report import markdown
from engines.vllm.run import Settings, bench
from polyspec.errors import PolyspecError, cli_entry


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        got = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise PolyspecError(f"--{what}: comma-separated whole numbers, got {text!r}") from None
    if not got or min(got) < 1:
        raise PolyspecError(f"--{what}: at least one number, each ≥ 1")
    return got


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m engines.vllm", description=__doc__.split("\n\n")[0]
    )
    add_drafter_args(
        ap,
        out="runs/default/vllm",
        drafters="an engines export's speculators/ folders, the folders, or a bundle",
    )
    ap.add_argument(
        "--draft-models",
        default=None,
        help="small-LM drafters as transformers folders (vLLM draft_model)",
    )
    ap.add_argument("--prompts", type=int, default=24, help="held-out prompts per language")
    ap.add_argument("--n", type=int, default=128, help="max new tokens")
    ap.add_argument("--sweep", default="1,2,3,4", help="EAGLE-3 / draft-model draft lengths")
    ap.add_argument("--batch", default="1,16", help="batch sizes (prompts in groups of each)")
    ap.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="float32: outputs must equal plain's; bfloat16: divergences are counted with their "
        "margin",
    )
    ap.add_argument("--ngram-k", type=int, default=3, help="vLLM ngram: num_speculative_tokens")
    ap.add_argument("--ngram-n", type=int, default=3, help="vLLM ngram: prompt_lookup_max (min 1)")
    ap.add_argument(
        "--hybrid-min",
        default="auto",
        help="polyspec's hybrid (the vLLM plugin): auto (calibrated from this run's curves, the "
        "drafter at its draft_n), or the shortest n-gram matches to try, comma-separated, each "
        "with every --hybrid-drafter length ('' for none)",
    )
    ap.add_argument(
        "--hybrid-drafter", default="2", help="the hybrid's drafter draft lengths, comma-separated"
    )
    ap.add_argument(
        "--questions",
        default=None,
        help="question files (the decoder bench's format: question_id, category, language, turns;"
        " comma-separated) instead of the held-out prompts: --prompts per language of --langs",
    )
    ap.add_argument(
        "--hybrid-for",
        default="",
        help="the drafters (comma-separated names) the calibrated hybrid runs for; default all",
    )
    ap.add_argument(
        "--mixed",
        action="store_true",
        help="batches of several prompts mix the languages (vi, de, ja, vi, …): per-request "
        "drafters (adaspec) as one server meets them; else one language a batch",
    )
    ap.add_argument(
        "--eager",
        action="store_true",
        help="vLLM enforce_eager (no torch.compile: quick start, slower)",
    )
    add_engines_arg(ap)
    return ap


@cli_entry
def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if a.prompts < 1 or a.n < 1 or a.ngram_k < 1 or a.ngram_n < 1:
        raise PolyspecError("--prompts, --n, --ngram-k and --ngram-n must be at least 1")
    s = Settings(
        n=a.n,
        prompts=a.prompts,
        sweep=_ints(a.sweep, "sweep"),
        batches=tuple(sorted(_ints(a.batch, "batch"))),
        dtype=a.dtype,
        ngram_k=a.ngram_k,
        ngram_n=a.ngram_n,
        eager=a.eager,
        hybrid_auto=a.hybrid_min.strip() == "auto",
        hybrid_min=_ints(a.hybrid_min, "hybrid-min")
        if a.hybrid_min.strip() not in ("", "auto")
        else (),
        hybrid_drafter=_ints(a.hybrid_drafter, "hybrid-drafter"),
        questions=a.questions,
        mixed=a.mixed,
        hybrid_for=tuple(x for x in a.hybrid_for.split(",") if x.strip()),
    )
    langs = parse_langs(a.langs)
    engines = Path(a.engines) if a.engines else None
    if engines and not engines.is_file():
        raise PolyspecError(f"--engines {engines}: not found (an export's engines.json)")
    report = bench(a.target, a.out, a.drafters, langs, s, engines, a.draft_models)
    print_report(markdown(report), Path(a.out) / "vllm.json", Path(a.out) / "vllm.md")
    if engines and report["draft_length"]:
        print_draft_n(engines, report["draft_length"], "vLLM")
    differ = (
        [
            f"{e['mode']}({e['drafter'] or '-'})@b{b}"
            for e in report["modes"]
            for b, r in e["by_batch"].items()
            if r["identical"] < r["prompts"]
        ]
        if s.dtype == "float32"
        else []
    )
    return exit_status("check-vllm", differ, "fp32 output differs from plain")


if __name__ == "__main__":
    raise SystemExit(main())
