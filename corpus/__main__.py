"""``python -m corpus`` — general text per language from Debian's translated documentation
(offline), and ``prefill``: the target's features on it for the drafters' pretrain.

    python -m corpus --langs en,de,vi [--config configs/corpus/default.yaml] [--target …] [--run …]
        [key=value ...]
    python -m corpus prefill --lang vi [--target …] [--run …] [--max-tokens N] [--seq-len 256]
        [--dtype auto]

Trailing ``key.path=value`` arguments override the YAML config (``max_tokens=2000000``,
``cache=/tmp/debs``).
"""

from __future__ import annotations

import argparse
import sys

from corpus.config import CorpusConfig
from polyspec.config import load_config
from polyspec.errors import cli_entry
from polyspec.paths import configs_dir


def _prefill(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m corpus prefill", description="the target's features on the corpus"
    )
    ap.add_argument("--lang", required=True)
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--run", default="runs/default")
    ap.add_argument(
        "--max-tokens", type=int, default=None, help="tokens to capture (default: the whole corpus)"
    )
    ap.add_argument("--seq-len", type=int, default=256, help="tokens per chunk, BOS included")
    ap.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per forward")
    ap.add_argument(
        "--feature-layers",
        choices=["eagle3", "last"],
        default="eagle3",
        help="eagle3: the last layer and the three an EAGLE-3 drafter reads; last: the last only",
    )
    ap.add_argument("--device", default="auto")
    ap.add_argument(
        "--dtype", default=None, help="the target's dtype (default: its registry entry's, auto)"
    )
    args = ap.parse_args(argv)
    from corpus.prefill import run_prefill
    from polyspec.languages import get_language
    from polyspec.targets import load_target

    get_language(args.lang)  # a wrong code fails before the weights load
    target = load_target(args.target, device=args.device, dtype=args.dtype)
    run_prefill(
        target,
        args.lang,
        args.run,
        seq_len=args.seq_len,
        max_tokens=args.max_tokens,
        batch_tokens=args.batch_tokens,
        feature_layers=args.feature_layers,
    )
    return 0


@cli_entry
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["prefill"]:
        return _prefill(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m corpus", description=CorpusConfig.__doc__)
    ap.add_argument(
        "--config", default=None, help="YAML config (default: configs/corpus/default.yaml)"
    )
    ap.add_argument("--langs", help="comma-separated language codes")
    ap.add_argument("--target")
    ap.add_argument("--run")
    ap.add_argument("overrides", nargs="*", help="key.path=value")
    args = ap.parse_args(argv)
    flags = {
        "langs": f"[{args.langs}]" if args.langs else None,
        "target": args.target,
        "run": args.run,
    }
    ov = [f"{k}={v}" for k, v in flags.items() if v is not None] + list(args.overrides)
    cfg = load_config(CorpusConfig, args.config or configs_dir() / "corpus" / "default.yaml", ov)
    from corpus.build import build_language
    from polyspec.languages import parse_languages
    from polyspec.targets import load_target

    langs = [lang.code for lang in parse_languages(cfg.langs)]
    tokenizer = load_target(cfg.target, with_model=False).tokenizer
    rows = [build_language(cfg, code, tokenizer) for code in langs]
    print(f"\n{'lang':<5} {'documents':>10} {'characters':>12} {'tokens':>11}  sources (missing)")
    for m in rows:
        miss = f" ({', '.join(m['missing'])})" if m["missing"] else ""
        print(
            f"{m['lang']:<5} {m['documents']:>10,} {m['chars']:>12,} {m['tokens']:>11,}  "
            f"{', '.join(m['sources'])}{miss}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
