"""``python -m export`` — write and validate a bundle from a run's drafters and vocabularies.

    python -m export --langs vi,de,ja [--run runs/default] [--target gemma3-270m]
                     [--out <run>/export/bundle] [--sizes 8192,16384,32768]
                     [--window 10 --step 5 --offset 2]
    python -m export --check <bundle> [--target …]
                     (validate an existing bundle)
    python -m export --format hf-assistant|speculators [--bundle <run>/export/bundle]
                     [--out <run>/export/<format>] [--speculative-tokens 3] [--reference DIR]
                     (convert a bundle's drafters for transformers / vLLM)

``hf-assistant`` (small-LM drafters): ``target.generate(..., assistant_model=AutoModelForCausalLM
.from_pretrained("<out>/<lang>"))``. ``speculators`` (drafters trained with ``eagle.arch=eagle3``;
``vllm-eagle3`` is the same format under its old name): vllm-project/speculators' EAGLE-3 layout,
for ``vllm serve <target> --speculative-config '{"method": "eagle3", "model": "<out>/<lang>",
"num_speculative_tokens": 3}'``; ``--reference DIR`` also writes polyspec's logits on real target
features for ``make check-speculators``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from polyspec.errors import PolyspecError, cli_entry
from polyspec.languages import parse_languages


@cli_entry
def main(argv: list[str] | None = None) -> int:
    """Write a bundle, check one (``--check``), convert one (``--format``) or ``engines``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["engines"]:
        return engines_main(argv[1:])
    args = parse_args(argv)
    if args.format != "polyspec":
        return convert_bundle(args)
    from polyspec.targets import load_target

    # the pin needs tokenizer + config only
    target = load_target(args.target, device="cpu", with_model=False)
    if args.check:
        return check_bundle(args.check, target)
    return write_new_bundle(args, target)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``python -m export``'s command line (see the module docstring)."""
    ap = argparse.ArgumentParser(
        prog="python -m export", description="Write or check a polyspec bundle."
    )
    ap.add_argument("--langs", default="vi,de,ja")
    ap.add_argument("--run", default="runs/default")
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--sizes", default="8192,16384,32768", help="vocabulary sizes S of the language masks"
    )
    ap.add_argument("--window", type=int, default=10, help="ADASPEC Alg. 2 w")
    ap.add_argument("--step", type=int, default=5, help="ADASPEC Alg. 2 u")
    ap.add_argument("--offset", type=float, default=2, help="ADASPEC Alg. 2 z")
    ap.add_argument(
        "--format",
        default="polyspec",
        choices=["polyspec", "hf-assistant", "speculators", "vllm-eagle3"],
        help="vllm-eagle3 = speculators (the EAGLE-3 format vLLM loads)",
    )
    ap.add_argument(
        "--speculative-tokens",
        type=int,
        default=3,
        help="speculators: the greedy proposal's draft length",
    )
    ap.add_argument(
        "--reference",
        default=None,
        metavar="DIR",
        help="speculators: also write polyspec's logits on real target features to "
        "DIR/<lang>.safetensors",
    )
    ap.add_argument("--check", default=None, metavar="BUNDLE", help="only validate this bundle")
    ap.add_argument(
        "--drafter",
        action="append",
        default=[],
        metavar="LANG=DIR",
        help="the bundle takes this trained drafter folder for LANG (a learning curve's point) "
        "instead of <run>/train/LANG/final; repeatable",
    )
    ap.add_argument(
        "--bundle",
        default=None,
        help="interop formats: the bundle to convert (default <run>/export/bundle)",
    )
    return ap.parse_args(argv)


def convert_bundle(args: argparse.Namespace) -> int:
    """``--format``: the bundle's drafters converted and checked (+ ``--reference``'s logits)."""
    from export.bundle import load_bundle
    from export.interop import write_hf_assistant
    from polyspec.targets import load_target

    # the weights are needed: vocab_size of the head and, for hf-assistant, the tokenizer files;
    # the reference logits are computed in float32 (the precision speculators' check runs in)
    target = load_target(args.target, device="cpu", dtype="float32" if args.reference else None)
    b = load_bundle(args.bundle or Path(args.run) / "export" / "bundle", target_pin=target.pin())
    fmt = "speculators" if args.format == "vllm-eagle3" else args.format
    out = Path(args.out or Path(args.run) / "export" / fmt)
    if fmt == "hf-assistant":
        folders = write_hf_assistant(b, target, out)
    else:
        folders, multi = speculators_folders(b, target, out, args.speculative_tokens)
    report = {"format": fmt, "folders": [str(f) for f in folders]}
    if args.reference and fmt == "speculators":
        report["reference"] = reference_logits(b, target, args.reference, multi)
    print(json.dumps(report))
    return 0


def speculators_folders(b, target, out: Path, speculative_tokens: int) -> tuple[list, tuple | None]:
    """The speculators folders (an engines export's multilingual drafter too), each checked."""
    from export.engines import MULTILINGUAL, multilingual_drafter
    from export.interop import check_speculators, write_speculators, write_speculators_folder

    folders = write_speculators(b, target, out, speculative_tokens=speculative_tokens)
    # an engines export's bundle (python -m export engines): its multilingual drafter too
    multi = multilingual_drafter(b.root.parent)
    if multi is not None:
        folders.append(
            write_speculators_folder(
                multi[0],
                target,
                out / MULTILINGUAL,
                speculative_tokens,
                {"lang": MULTILINGUAL, "target": b.manifest["target"]},
            )
        )
    for f in folders:
        check_speculators(f, target.vocab_size)
    return folders, multi


def reference_logits(b, target, out: str, multi: tuple | None) -> list[str]:
    """``--reference DIR``: polyspec's logits on real target features, for the speculators check."""
    from export.engines import MULTILINGUAL
    from export.interop import write_speculators_reference

    return [
        str(r)
        for r in write_speculators_reference(
            b,
            target,
            out,
            extra={MULTILINGUAL: multi} if multi is not None else None,
        )
    ]


def check_bundle(path: str, target) -> int:
    """``--check``: the bundle checked against the target's pin; the engines export beside it."""
    from export.bundle import load_bundle
    from export.engines import describe

    b = load_bundle(path, target_pin=target.pin())
    print(
        f"ok: {b.root} — {b.manifest['drafter_type']} drafters for {', '.join(b.languages)}, "
        f"sizes {b.vocab_sizes}"
    )
    # which engine loads which drafter: the engines export beside the bundle (or the bundle
    # inside one)
    for where in (b.root.parent / "engines", b.root.parent):
        if lines := describe(where):
            print(f"engines ({where}):")
            print("\n".join(f"  {line}" for line in lines))
            break
    else:
        print("engines: no engines export beside this bundle (python -m export engines)")
    return 0


def write_new_bundle(args: argparse.Namespace, target) -> int:
    """The default: a bundle from the run's drafters and vocabularies, its summary as JSON."""
    from export.bundle import write_bundle

    langs = [lang.code for lang in parse_languages(args.langs)]
    sizes = parse_sizes(args.sizes)
    out = Path(args.out or Path(args.run) / "export" / "bundle")
    drafters = {}
    for item in args.drafter:
        lang, sep, folder = item.partition("=")
        if not sep or lang not in langs:
            raise PolyspecError(f"--drafter {item!r}: expected LANG=DIR with LANG one of {langs}")
        drafters[lang] = folder
    b = write_bundle(
        out,
        args.run,
        langs,
        target.pin(),
        sizes,
        adaptive={"window": args.window, "step": args.step, "offset": args.offset},
        drafters=drafters,
    )
    print(
        json.dumps(
            {
                "bundle": str(b.root),
                "languages": b.languages,
                "vocab_sizes": b.vocab_sizes,
                "files": len(b.manifest["files"]),
            }
        )
    )
    return 0


def parse_sizes(spec: str) -> list[int]:
    """``--sizes 8192,16384`` → [8192, 16384]; anything else is a one-line error."""
    try:
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise PolyspecError(f"--sizes {spec!r} must be comma-separated integers") from None


def engines_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m export engines",
        description="Export a run's EAGLE-3 drafters for vLLM, SGLang and llama.cpp.",
    )
    ap.add_argument("--langs", default="vi,de,ja")
    ap.add_argument("--run", default="runs/default")
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument(
        "--train-dir",
        default="train",
        help="where the EAGLE-3 drafters are: <run>/<train-dir>/<lang>/final",
    )
    ap.add_argument("--out", default=None, help="default: <run>/export/engines")
    ap.add_argument(
        "--sizes",
        default="8192,16384,32768",
        help="vocabulary sizes S of the engines bundle's masks",
    )
    ap.add_argument("--speculative-tokens", type=int, default=3)
    args = ap.parse_args(argv)
    from export.engines import write_engine_exports
    from export.gguf import gguf_converter
    from polyspec.targets import load_target

    target = load_target(args.target, device="cpu", dtype="float32")
    langs = [lang.code for lang in parse_languages(args.langs)]
    sizes = parse_sizes(args.sizes)
    out = Path(args.out or Path(args.run) / "export" / "engines")
    convert, why = gguf_converter(target)
    if convert is None:
        print(f"note: no GGUF: {why}", file=sys.stderr)
    rec = write_engine_exports(
        args.run,
        langs,
        target,
        out,
        train_dir=args.train_dir,
        sizes=sizes,
        speculative_tokens=args.speculative_tokens,
        gguf=convert,
        gguf_why=why,
    )
    print(
        json.dumps(
            {
                "engines": str(out),
                "drafters": {k: v["speculators"] for k, v in rec["drafters"].items()},
                "gguf": convert is not None,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
