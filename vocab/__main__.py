"""``python -m vocab`` — ranked per-language vocabularies, coverage/overlap analysis and language masks.

    python -m vocab --langs vi,de,ja [--sources wordfreq] [--target gemma3-270m] [--run runs/default] [key=value ...]

``--sources`` items are ``name[@weight][=path]`` separated by commas, e.g. ``fineweb2,wikipedia@0.5`` or
``files=/data/vi/*.txt``; names: fineweb2, wikipedia, wordfreq, files, synth.
"""

from __future__ import annotations

import argparse
import json
import sys

from polyspec.config import load_config
from polyspec.errors import PolyspecError, cli_entry
from polyspec.paths import configs_dir
from vocab.config import VocabConfig


def parse_sources(spec: str) -> list[dict]:
    out = []
    for item in [x.strip() for x in spec.split(",") if x.strip()]:
        head, _, path = item.partition("=")
        name, _, weight = head.partition("@")
        src: dict = {"name": name}
        if weight:
            try:
                src["weight"] = float(weight)
            except ValueError:
                raise PolyspecError(f"source {item!r}: weight {weight!r} is not a number") from None
        if path:
            src["path"] = path
        out.append(src)
    if not out:
        raise PolyspecError("--sources is empty")
    return out


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vocab", description=VocabConfig.__doc__)
    ap.add_argument("--config", default=None)
    ap.add_argument("--langs")
    ap.add_argument("--sources")
    ap.add_argument("--target")
    ap.add_argument("--run")
    ap.add_argument("overrides", nargs="*", help="key.path=value")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    flags = []
    if args.langs:
        flags.append(f"langs=[{args.langs}]")
    for k in ("target", "run"):
        if getattr(args, k):
            flags.append(f"{k}={getattr(args, k)}")
    if args.sources:
        flags.append("sources=" + json.dumps(parse_sources(args.sources)))
    cfg = load_config(VocabConfig, args.config or configs_dir() / "vocab" / "default.yaml", [*flags, *args.overrides])
    from vocab.build import run_vocab

    summary = run_vocab(cfg)
    print(json.dumps({"languages": summary["languages"], "mask_sizes": summary["mask_sizes"],
                      "k_for_coverage": summary["k_for_coverage"]}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
