"""Synthesis on both engines, same prompts: tok/s of each and how far their answers agree.

    python -m synth.compare_engines --target smollm2-135m-instruct --lang en
        --out runs/x/engines-compare [--prompts pool] [--limit 64] [--temperatures 0]
        [--dtype float32] [--batch-size 32] [--eager]

Runs ``synth distill`` (on-policy answers with captured features, as every profile's
``distill:<lang>``) into ``<out>/transformers/`` and ``<out>/vllm/`` on the same prompts and
settings, then compares:

- tok/s: generated tokens / seconds of each engine's own ``generate`` calls
  (``engine_seconds_this_session``), and with the feature capture (vLLM: the target's prefill over
  the answers) — the ``distill`` stage's whole batches;
- agreement of the greedy (T = 0) answers: identical token ids, or the first divergent position and
  the target's logit margin there (its own fp32 forward over the common prefix: the transformers
  engine's token's logit − vLLM's).

Writes ``<out>/compare.json`` and ``<out>/compare.md``. vLLM's start-up is reported apart (not in
tok/s).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from polyspec.config import validate
from polyspec.device import host_kind
from polyspec.errors import PolyspecError, cli_entry
from polyspec.features import FeatureReader
from polyspec.io import atomic_write_json, atomic_write_text, read_json_or_none, read_jsonl
from polyspec.targets import load_target
from polyspec.vllm_process import vllm_python
from synth.config import DistillConfig
from synth.distill import run_distill

ENGINES = ("transformers", "vllm")


def distill_with(engine: str, a: argparse.Namespace) -> Path:
    cfg = validate(
        DistillConfig,
        {
            "lang": a.lang,
            "target": a.target,
            "run": str(Path(a.out) / engine),
            "prompts": a.prompts,
            "limit": a.limit,
            "temperatures": a.temperatures,
            "out_name": "distill",
            "capture_features": True,
            "feature_layers": "eagle3",
            "sampling": {"max_new_tokens": a.max_new_tokens},
            "engine": {
                "name": engine,
                "dtype": a.dtype,
                "batch_size": a.batch_size,
                "enforce_eager": a.eager,
            },
        },
    )
    run_distill(cfg)
    return Path(cfg.run) / "synth" / f"{a.lang}-distill"


def answers(folder: Path, target) -> dict[str, list[int]]:
    """Greedy records' generated ids (the captured ids after the prompt) by record id."""
    reader = FeatureReader(target.spec.name, target.tokenizer_sha256)
    out = {}
    for rec in read_jsonl(folder / "data.jsonl"):
        if rec["temperature"] == 0 and rec.get("features_file"):
            ids, start = reader.ids(str(folder / rec["features_file"]), rec["id"])
            out[rec["id"]] = ids[start:]
    return out


@torch.inference_mode()
def margin(target, prompt_and_prefix: list[int], own: int, other: int) -> float:
    logits = target.model(input_ids=torch.tensor([prompt_and_prefix])).logits[0, -1].float()
    return round(float(logits[own] - logits[other]), 4)


def compare(folders: dict[str, Path], target) -> dict:
    got = {e: answers(f, target) for e, f in folders.items()}
    reader = FeatureReader(target.spec.name, target.tokenizer_sha256)
    recs = {r["id"]: r for r in read_jsonl(folders["transformers"] / "data.jsonl")}
    rows, same = [], 0
    for rid, a in got["transformers"].items():
        b = got["vllm"].get(rid)
        if b is None:
            continue
        if a == b:
            same += 1
            continue
        i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        row = {"id": rid, "at": i}
        if i < min(len(a), len(b)):
            ids, start = reader.ids(str(folders["transformers"] / recs[rid]["features_file"]), rid)
            row["margin"] = margin(target, ids[: start + i], a[i], b[i])
        rows.append(row)
    return {"greedy_answers": len(got["transformers"]), "identical": same, "divergences": rows}


def engine_stats(folder: Path) -> dict:
    st = read_json_or_none(folder / "stats.json") or {}
    eng = st.get("engine_seconds_this_session") or 0.0
    return {
        "tokens": st.get("tokens"),
        "engine_seconds": eng,
        "tok_s": round(st["tokens"] / eng, 1) if eng else None,
        "capture_seconds": st.get("capture_seconds_this_session"),
        "stage_seconds": st.get("seconds"),
        "stage_tok_s": st.get("tokens_per_second"),
        "records": st.get("accepted"),
        "version": st.get("engine_version"),
    }


def markdown(rep: dict) -> str:
    t, v = rep["engines"]["transformers"], rep["engines"]["vllm"]
    c = rep["agreement"]
    worst = max((abs(d["margin"]) for d in c["divergences"] if "margin" in d), default=None)
    return "\n".join(
        [
            f"# Synthesis engines — {rep['target']} ({rep['lang']}, {rep['dtype']}, {rep['host']})",
            "",
            f"{rep['prompts']} prompts × T {rep['temperatures']}, max {rep['max_new_tokens']} new "
            "tokens, batch "
            f"{rep['batch_size']}, features captured.",
            "",
            "| engine | tokens | generate tok/s | with capture (stage) tok/s |",
            "|---|---|---|---|",
            f"| transformers | {t['tokens']} | {t['tok_s']} | {t['stage_tok_s']} |",
            f"| vLLM {v.get('version') or ''} | {v['tokens']} | {v['tok_s']} | {v['stage_tok_s']} "
            f"(prefill {v['capture_seconds']} s) |",
            "",
            f"Greedy answers identical: {c['identical']}/{c['greedy_answers']}"
            + (
                f"; the largest logit margin at a divergence {worst:.3f}"
                if worst is not None
                else ""
            )
            + ".",
            "",
        ]
    )


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m synth.compare_engines", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--lang", default="en")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", default="pool")
    ap.add_argument("--limit", type=int, default=64)
    ap.add_argument(
        "--temperatures", default="0", help="comma-separated; agreement is read on T = 0"
    )
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--eager", action="store_true", help="vLLM enforce_eager")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    a.temperatures = [float(x) for x in a.temperatures.split(",") if x.strip()]
    if 0.0 not in a.temperatures:
        raise PolyspecError(
            "--temperatures must include 0: agreement is read on the greedy answers"
        )
    vllm_python()  # no vLLM: one line before the transformers run
    folders = {e: distill_with(e, a) for e in ENGINES}
    target = load_target(a.target, device="cpu", dtype="float32")
    rep = {
        "target": target.spec.name,
        "lang": a.lang,
        "dtype": a.dtype,
        "host": host_kind(),
        "prompts": a.limit,
        "temperatures": a.temperatures,
        "max_new_tokens": a.max_new_tokens,
        "batch_size": a.batch_size,
        "engines": {e: engine_stats(f) for e, f in folders.items()},
        "agreement": compare(folders, target),
    }
    out = Path(a.out)
    atomic_write_json(out / "compare.json", rep)
    atomic_write_text(out / "compare.md", markdown(rep))
    print(markdown(rep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
