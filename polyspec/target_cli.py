"""``python -m polyspec.targets`` — inspect and prepare targets.

python -m polyspec.targets list
python -m polyspec.targets check gemma3-270m                 (validate a name; loads nothing)
python -m polyspec.targets info gemma3-270m [--rebuild] [--json]
python -m polyspec.targets generate gemma3-270m --langs vi,de,ja
"""

from __future__ import annotations

import argparse
import json
import time

from polyspec.errors import cli_entry
from polyspec.languages import parse_languages
from polyspec.prompts import encode, render, truncate_at_stop
from polyspec.target_registry import DEFAULT_TARGET, registry_names, resolve_target
from polyspec.targets import greedy_generate, load_target


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m polyspec.targets", description="Inspect and prepare targets."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="registry entries")
    info = sub.add_parser(
        "info", help="load a target (preparing its cache once) and print its facts"
    )
    info.add_argument("target", nargs="?", default=DEFAULT_TARGET)
    info.add_argument("--device", default="auto")
    info.add_argument("--dtype", default=None)
    info.add_argument("--rebuild", action="store_true", help="re-create the safetensors cache")
    info.add_argument("--json", action="store_true", help="print JSON")
    check = sub.add_parser("check", help="validate a target name without loading it")
    check.add_argument("target")
    gen = sub.add_parser("generate", help="greedy answers to one built-in instruction per language")
    gen.add_argument("target", nargs="?", default=DEFAULT_TARGET)
    gen.add_argument("--langs", default="vi,de,ja")
    gen.add_argument("--max-new-tokens", type=int, default=48)
    gen.add_argument("--device", default="auto")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for n in registry_names():
            s = resolve_target(n)
            print(f"{n:26s} {s.source:13s} {s.description}")
        return 0
    if args.cmd == "check":
        resolve_target(args.target)
        return 0
    if args.cmd == "generate":
        return generate(args.target, args.langs, args.max_new_tokens, args.device)
    t0 = time.time()
    target = load_target(args.target, device=args.device, dtype=args.dtype, rebuild=args.rebuild)
    facts = {**target.info(), "load_seconds": round(time.time() - t0, 2)}
    if args.json:
        print(json.dumps(facts, indent=2))
    else:
        for k, v in facts.items():
            print(f"{k:17s} {v}")
    return 0


def generate(target_name: str, langs: str, max_new_tokens: int, device: str = "auto") -> int:
    """The target's greedy answer to each language's first seed instruction, in its prompt
    format."""
    languages = parse_languages(langs)
    target = load_target(target_name, device=device)
    fmt = target.spec.prompt_format
    for lang in languages:
        seed = lang.seeds[0]
        messages = [
            {"role": "system", "content": lang.system_prompt},
            {"role": "user", "content": seed.instruction},
        ]
        ids = encode(fmt, target.tokenizer, render(fmt, target.tokenizer, messages))
        t0 = time.time()
        new = greedy_generate(target, ids, max_new_tokens)
        dt = time.time() - t0
        text, _ = truncate_at_stop(target.tokenizer.decode(new, skip_special_tokens=True), fmt.stop)
        print(
            f"[{lang.code}] {seed.instruction}\n  -> {text.strip()}\n  ({len(new)} tokens, "
            f"{len(new) / dt:.1f} tok/s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
