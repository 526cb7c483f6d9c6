"""``python -m pipelines`` — one command from nothing to an evaluated multilingual bundle.

    python -m pipelines run --langs vi,de,ja [--target gemma3-270m] [--profile cpu-demo]
                            [--run runs/<id>] [--from train] [--force] [--dry-run]
    python -m pipelines report --run runs/<id>

``make all LANGS=… PROFILE=… [FROM=stage] [FORCE=1] [DRY_RUN=1]`` and ``make demo`` call ``run``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from polyspec.errors import PolyspecError, cli_entry


def load_profile(name: str):
    from pipelines.config import Profile
    from polyspec.config import load_config
    from polyspec.paths import configs_dir

    path = (
        Path(name)
        if name.endswith((".yaml", ".yml"))
        else configs_dir() / "pipelines" / f"{name}.yaml"
    )
    if not path.is_file():
        choices = sorted(p.stem for p in (configs_dir() / "pipelines").glob("*.yaml"))
        raise PolyspecError(
            f"pipeline profile {name!r} not found; choose one of {', '.join(choices)}"
        )
    return load_config(Profile, path)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines", description="polyspec end to end.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="synth → vocab → train → export → calibrate → eval → report")
    r.add_argument("--langs", default=None, help="default: the profile's languages")
    r.add_argument("--target", default=None, help="default: the profile's target")
    r.add_argument("--profile", default="cpu-demo")
    r.add_argument("--run", default=None, help="run directory (default runs/<profile>-<langs>)")
    r.add_argument(
        "--from",
        dest="from_stage",
        default=None,
        help="redo this stage (e.g. train, train:vi) and the rest",
    )
    r.add_argument("--force", action="store_true", help="redo every stage")
    r.add_argument(
        "--dry-run", action="store_true", help="print and validate the plan; run nothing"
    )
    rep = sub.add_parser("report", help="(re)build <run>/report/")
    rep.add_argument("--run", required=True)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)

    if args.cmd == "report":
        from pipelines.report import build_report

        path, summary = build_report(Path(args.run))
        print(f"report: {path}")
        return 0

    from pipelines.plan import build_plan, validate_plan
    from pipelines.run import read_done, run_plan
    from polyspec.languages import parse_languages

    profile = load_profile(args.profile)
    langs = [lang.code for lang in parse_languages(args.langs or ",".join(profile.langs))]
    target = args.target or profile.target
    run = Path(args.run or f"runs/{profile.name}-{'-'.join(langs)}")
    stages = build_plan(profile, langs, target, run)
    if args.dry_run:
        print(
            f"plan: profile {profile.name} ({profile.description}), target {target}, languages "
            f"{', '.join(langs)}, "
            f"run {run}"
        )
        for i, st in enumerate(stages, 1):
            state = "done" if read_done(st) else "to run"
            print(
                f"  {i:2d}. {st.name:16s} [{state}] needs {', '.join(st.deps) or '—'}\n      $ "
                f"python {' '.join(st.cmd[1:])}"
            )
        for line in validate_plan(stages, profile, target, langs):
            print(f"  ok: {line}")
        print(f"dry run: {len(stages)} stages validated, nothing was run")
        return 0
    # every config and the engine drafters, before any heavy work
    validate_plan(stages, profile, target, langs)
    if profile.gpu_only:
        import torch

        if not torch.cuda.is_available():
            raise PolyspecError(
                f"profile {profile.name} needs GPUs; check it here with DRY_RUN=1 (--dry-run)"
            )
    run_plan(stages, run, profile.eta_minutes, from_stage=args.from_stage, force=args.force)
    import json

    summary = json.loads((run / "report" / "summary.json").read_text(encoding="utf-8"))["summary"]
    print(f"report: {run / 'report' / 'report.md'}")
    for line in summary[:5]:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
