"""``python -m synth`` — ADASPEC Alg. 1 self-synthesis (default) and ``distill`` (Yi et al. 2024's
self-distillation).

    python -m synth --lang vi --n 64 [--target gemma3-270m] [--run runs/default] [--engine vllm]
        [key=value ...]
    python -m synth distill --lang vi [--prompts seeds|file.jsonl|org/dataset]
        [--temperatures 0,0.3,0.7,1]
    python -m synth pack --run R R/synth/<folder> R/vocab … --out DIR   # text + ids, no features
    python -m synth unpack DIR/*.tar.xz --run R                # back, features by prefill

Trailing ``key.path=value`` arguments override the YAML config (``instruction.max_new_tokens=64``).
Exit status: 0 when N pairs are kept, 3 when the attempt budget ran out first (what was kept stays).
"""

from __future__ import annotations

import argparse
import json
import sys

from polyspec.config import load_config
from polyspec.errors import cli_entry
from polyspec.paths import configs_dir
from synth.config import DistillConfig, SynthConfig


def _common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--config", default=None, help="YAML config (default: configs/synth/default.yaml)"
    )
    ap.add_argument("--lang")
    ap.add_argument("--target")
    ap.add_argument("--run")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--engine", choices=["transformers", "vllm"])
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--device")
    ap.add_argument("overrides", nargs="*", help="key.path=value")


def _overrides(args: argparse.Namespace, extra: dict[str, str]) -> list[str]:
    flags = {
        "lang": args.lang,
        "target": args.target,
        "run": args.run,
        "seed": args.seed,
        "engine.name": args.engine,
        "engine.batch_size": args.batch_size,
        "engine.device": args.device,
        **extra,
    }
    return [f"{k}={v}" for k, v in flags.items() if v is not None] + list(args.overrides)


def _packs(argv: list[str]) -> int:
    """``pack`` / ``unpack`` (synth/pack.py)."""
    from synth import pack

    ap = argparse.ArgumentParser(
        prog=f"python -m synth {argv[0]}", description=pack.__doc__.splitlines()[0]
    )
    if argv[0] == "pack":
        ap.add_argument("folders", nargs="+", help="folders inside the run (<run>/synth/en)")
        ap.add_argument("--run", required=True)
        ap.add_argument("--out", required=True, help="folder of the packs")
        a = ap.parse_args(argv[1:])
        for f in a.folders:
            p = pack.pack(f, a.run, a.out)
            print(f"{p}: {p.stat().st_size / 2**20:.1f} MiB")
        return 0
    ap.add_argument("packs", nargs="+", help="<folder>.tar.xz")
    ap.add_argument("--run", required=True)
    ap.add_argument("--target", help="default: the one named in the packed shards")
    ap.add_argument("--device", default="auto")
    ap.add_argument(
        "--dtype", default=None, help="the target's dtype (default: its registry entry's)"
    )
    a = ap.parse_args(argv[1:])
    folders = [pack.unpack(p, a.run) for p in a.packs]
    todo = [f for f in folders if pack.ids_only_shards(f)]
    if not todo:
        print(f"synth unpack: {len(folders)} folders under {a.run}, every feature there")
        return 0
    from polyspec.targets import load_target

    target = load_target(a.target or pack.target_of(todo[0]), device=a.device, dtype=a.dtype)
    for f in todo:
        print(json.dumps(pack.refill(f, target)))
    return 0


@cli_entry
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["distill"]:
        ap = argparse.ArgumentParser(
            prog="python -m synth distill", description=DistillConfig.__doc__
        )
        _common(ap)
        ap.add_argument("--prompts")
        ap.add_argument("--temperatures", help="comma-separated, e.g. 0,0.3,0.7,1.0")
        ap.add_argument("--limit", type=int)
        ap.add_argument(
            "--continuation", action="store_true", help="free-text continuation (pretraining text)"
        )
        ap.add_argument("--out-name")
        args = ap.parse_intermixed_args(argv[1:])  # key=value overrides before or after flags
        extra = {
            "prompts": args.prompts,
            "limit": args.limit,
            "out_name": args.out_name,
            "temperatures": f"[{args.temperatures}]" if args.temperatures else None,
            "continuation": "true" if args.continuation else None,
        }
        path = args.config or configs_dir() / "synth" / "distill.yaml"
        cfg = load_config(DistillConfig, path, _overrides(args, extra))
        from synth.distill import run_distill

        stats = run_distill(cfg)
        print(json.dumps(stats, indent=2, ensure_ascii=False))
        return 0
    if argv[:1] == ["prompts"]:
        from synth.prompt_set import build_prompt_set

        ap = argparse.ArgumentParser(
            prog="python -m synth prompts",
            description="The on-policy prompt set at scale (synth/prompt_set.py): Alg. 1's "
            "instructions + the pool + corpus prompts, guarded, near-duplicates removed, shuffled.",
        )
        ap.add_argument("--lang", required=True)
        ap.add_argument("--run", required=True)
        ap.add_argument("--corpus", type=int, default=0, help="prompts about corpus paragraphs")
        ap.add_argument("--near-duplicate", type=float, default=0.7, help="Jaccard threshold")
        ap.add_argument("--seed", type=int, default=0)
        ap.add_argument("--out-name", default="prompts", help="<run>/synth/<lang>-<out-name>/")
        ap.add_argument(
            "--exclude",
            action="append",
            default=[],
            help="an earlier set's prompts.jsonl: its prompts and near-copies stay out; repeatable",
        )
        a = ap.parse_args(argv[1:])
        report = build_prompt_set(
            a.lang, a.run, a.corpus, a.near_duplicate, a.seed, a.out_name, a.exclude
        )
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return 0
    if argv[:1] in (["pack"], ["unpack"]):
        return _packs(argv)
    ap = argparse.ArgumentParser(prog="python -m synth", description=SynthConfig.__doc__)
    _common(ap)
    ap.add_argument("--n", type=int)
    ap.add_argument("--max-attempts", type=int)
    args = ap.parse_intermixed_args(argv)
    path = args.config or configs_dir() / "synth" / "default.yaml"
    cfg = load_config(
        SynthConfig, path, _overrides(args, {"n": args.n, "max_attempts": args.max_attempts})
    )
    from synth.selfsynth import run_selfsynth

    stats = run_selfsynth(cfg)
    print(json.dumps(stats, indent=2, ensure_ascii=False))
    if not stats["complete"]:
        print(
            f"synth: attempt budget spent ({stats['attempted']} attempts): kept "
            f"{stats['accepted']} of {cfg.n} "
            f"pairs in {cfg.run}/synth/{stats['lang']}/; raise max_attempts or rerun to continue",
            file=sys.stderr,
        )
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
