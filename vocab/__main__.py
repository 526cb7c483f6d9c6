"""``python -m vocab`` — ranked per-language vocabularies, coverage/overlap analysis and language
masks.

    python -m vocab --langs vi,de,ja [--sources wordfreq] [--target gemma3-270m]
        [--run runs/default] [key=value ...]

``--sources`` items are ``name[@weight][:option=value ...][=path]`` separated by commas, e.g.
``fineweb2:max_tokens=50M,wikipedia@0.5:max_tokens=20M`` or
``files:text_field=body=/data/vi/*.jsonl``; names: fineweb2, wikipedia, wordfreq, files, synth.
Options are the fields of ``vocab.config.SourceConfig``: ``max_tokens`` / ``max_documents`` (counts
take K, M, G = 10^3, 10^6, 10^9), ``dataset``, ``text_field``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from polyspec.config import load_config
from polyspec.errors import PolyspecError, cli_entry
from polyspec.paths import configs_dir
from vocab.config import VocabConfig

_ITEM = re.compile(
    r"(?P<name>[\w-]+)(?:@(?P<weight>[^:=]+))?(?P<options>(?::\w+=[^:=]*)*)(?:=(?P<path>.+))?"
)
_COUNT_OPTIONS = {"max_tokens", "max_documents"}
_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9}


def parse_count(text: str) -> int:
    """``50M`` -> 50_000_000 (K, M, G: powers of 1000; plain integers as they are)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]?)", text.strip().upper())
    if not m:
        raise ValueError(text)
    return round(float(m.group(1)) * _SUFFIX[m.group(2)])


def parse_sources(spec: str) -> list[dict]:
    """``name[@weight][:option=value ...][=path]`` items, comma-separated -> SourceConfig dicts."""
    out = []
    for item in [x.strip() for x in spec.split(",") if x.strip()]:
        m = _ITEM.fullmatch(item)
        if not m:
            raise PolyspecError(
                f"source {item!r}: expected name[@weight][:option=value ...][=path]"
            )
        src: dict = {"name": m["name"]}
        if m["weight"]:
            try:
                src["weight"] = float(m["weight"])
            except ValueError:
                raise PolyspecError(
                    f"source {item!r}: weight {m['weight']!r} is not a number"
                ) from None
        for opt in filter(None, m["options"].split(":")):
            key, _, value = opt.partition("=")
            if key in ("name", "weight", "path"):
                raise PolyspecError(
                    f"source {item!r}: give {key} as name[@weight][=path], not as an option"
                )
            if key in _COUNT_OPTIONS:
                try:
                    value = parse_count(value)
                except ValueError:
                    raise PolyspecError(
                        f"source {item!r}: {key} {value!r} is not a count (e.g. 50000000 or 50M)"
                    ) from None
            src[key] = value  # other keys: SourceConfig validates them (unknown keys are errors)
        if m["path"]:
            src["path"] = m["path"]
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
    cfg = load_config(
        VocabConfig,
        args.config or configs_dir() / "vocab" / "default.yaml",
        [*flags, *args.overrides],
    )
    from vocab.build import run_vocab

    summary = run_vocab(cfg)
    print(
        json.dumps(
            {
                "languages": summary["languages"],
                "mask_sizes": summary["mask_sizes"],
                "k_for_coverage": summary["k_for_coverage"],
            },
            ensure_ascii=False,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
