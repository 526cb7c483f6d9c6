"""Collect what scripts/gpu/gpu-check.sh's steps left in its work folder into one JSON (rewritten
after every step, so a step that is cut off or fails loses none of the others' figures). Standard
library only.

    python scripts/gpu/gpu_check_summary.py --work /tmp/gpu-check --out $OUT/gpu-check.json
"""

from __future__ import annotations

import argparse
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path


def read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def pytest_results(xml: Path) -> dict | None:
    """Counts and the failing tests of a --junitxml report."""
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return None
    cases = root.iter("testcase")
    out = {"passed": 0, "failed": 0, "skipped": 0, "failures": {}}
    for c in cases:
        name = f"{c.get('classname', '').split('.')[-1]}::{c.get('name')}"
        bad = c.find("failure") if c.find("failure") is not None else c.find("error")
        if bad is not None:
            out["failed"] += 1
            out["failures"][name] = (bad.get("message") or "")[:400]
        elif c.find("skipped") is not None:
            out["skipped"] += 1
        else:
            out["passed"] += 1
    return out


def answer_stats(folder: Path) -> dict:
    """Per method: answers identical to ``ar``'s, and (spide-parallel) its drafting beside the
    verifications summed — hits, drops, seconds drafted beside and seconds of that hidden behind the
    target (decoder.bench.parallel_stats)."""
    out = {}
    for f in sorted(folder.glob("*.jsonl")):
        rows = [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines() if x.strip()]
        stats = {"answers": len(rows), "identical": sum(bool(r.get("identical")) for r in rows)}
        par = [r["parallel"] for r in rows if r.get("parallel")]
        if par:
            stats["parallel"] = {
                k: round(sum(p[k] for p in par), 6)
                for k in ("hits", "drops", "spec_s", "overlap_s")
            }
        out[f.stem] = stats
    return out


def smoke_results(run: Path) -> dict | None:
    if not run.is_dir():
        return None
    stages = {d["stage"]: d["seconds"] for d in map(read_json, sorted(run.rglob("DONE.json"))) if d}
    out: dict = {"stages_done": stages, "stage_seconds_total": round(sum(stages.values()), 1)}
    distill = read_json(run / "synth" / "en-distill" / "stats.json")
    if distill:  # self-distillation with EAGLE-3 feature capture
        out["distill"] = {
            k: distill.get(k) for k in ("tokens", "seconds", "tokens_per_second", "feature_bytes")
        }
    train = {}
    for stage, f in (
        ("pretrain", run / "train" / "en" / "pretrain" / "metrics.jsonl"),
        ("finetune", run / "train" / "en" / "finetune" / "metrics.jsonl"),
    ):
        rows = (
            [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines() if x.strip()]
            if f.is_file()
            else []
        )
        steps = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
        end = next((r for r in rows if r.get("event") == "end"), {})
        if rows:
            train[stage] = {
                "train_tokens_per_s": end.get("train_tokens_per_s"),
                "seconds": end.get("seconds"),
                "step_tokens_per_s": steps,
            }
    if train:
        out["train"] = train
    report = read_json(run / "eval" / "report.json")
    if report:
        out["eval"] = {
            "device": report.get("device"),
            "dtype": report.get("dtype"),
            "failed": report.get("failed"),
            "methods": {m: d["overall"] for m, d in report["methods"].items()},
            "answers": answer_stats(run / "eval" / "answers"),
        }
    calib = read_json(run / "export" / "bundle" / "calibration.json")
    if calib:
        out["calibration"] = {
            k: {f: v.get(f) for f in ("g_star", "tree_budget", "forward1_s", "cost_curve")}
            for k, v in calib.items()
        }
    engines = read_json(run / "export" / "engines" / "engines.json")
    if engines:
        spec = run / "export" / "engines" / "speculators"
        out["engines"] = {
            "drafters": {
                n: {k: d.get(k) for k in ("form", "draft_vocab_size", "aux_layers", "heldout_tau")}
                for n, d in engines.get("drafters", {}).items()
            },
            "speculators_configs": sorted(p.parent.name for p in spec.glob("*/config.json")),
        }
    scores = read_json(run / "export" / "engines" / "scores.json")
    if scores:
        out["engine_scores"] = scores
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    work = Path(args.work)
    steps = (
        [json.loads(x) for x in (work / "steps.jsonl").read_text().splitlines() if x.strip()]
        if (work / "steps.jsonl").is_file()
        else []
    )
    summary = {
        "steps": steps,
        "ok": bool(steps) and all(s["rc"] == 0 for s in steps),
        "environment": read_json(work / "environment.json"),
        "cuda_tests": pytest_results(work / "cuda-tests.xml"),
        "target": read_json(work / "target" / "polyspec_random_target.json"),
        "smoke": smoke_results(work / "smoke"),
        "figures": read_json(work / "figures.json"),
    }
    tmp = Path(args.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
