"""Does the training score predict the decoder? One run, the same held-out prompts, both measured.

    python -m pipelines.score_check --run runs/demo [--langs vi,de,ja] [--gamma 4]
        [--target gemma3-270m]

For each language: the score that picked ``best/`` (train/score.py: the decoder's greedy chain
replayed on the target's captured held-out answers) recomputed for the bundle's drafter, and the
decoder's own τ (decoder/core.py, method ``chain``, γ, greedy, the bundle's language and largest
vocabulary, default dtype) on the same held-out prompts with the same token budget and stop strings.
Prints both and their ratio; the ratio must stay within 10 % (issue 14).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from decoder.core import Decoder
from export.bundle import load_bundle
from polyspec.drafter_kind import DrafterKind
from polyspec.drafter_models import load_drafter
from polyspec.errors import PolyspecError, cli_entry
from polyspec.features import FeatureReader
from polyspec.io import atomic_write_json, read_jsonl
from polyspec.targets import load_target
from train.score import score_eagle
from vocab.files import load_ranked


def decoder_tau(
    target, bundle, lang: str, records: list[dict], reader, gamma: int, size: int
) -> dict:
    dec = Decoder(target, bundle, method="chain", gamma=gamma, size=size, lang=lang)
    tokens = forwards = same = 0
    for rec in records:
        ids, start = reader.ids(rec["_path"], rec["id"])
        answer = ids[start:]
        out = dec.generate(
            ids[:start],
            max_new_tokens=max(1, len(answer)),
            stop=list(target.spec.prompt_format.stop),
        )
        tokens, forwards = tokens + len(out.tokens), forwards + out.target_forwards
        same += out.tokens[: len(answer)] == answer
    return {
        "tau": round(tokens / max(1, forwards), 4),
        "tokens": tokens,
        "forwards": forwards,
        "answers_identical_to_captured": f"{same}/{len(records)}",
    }


def score_tau(target, drafter_dir: Path, records: list[dict], reader, gamma: int) -> dict:
    dev = target.device  # everything beside the target (on CUDA too)
    model, meta = load_drafter(drafter_dir, device=dev)
    model.eval()
    if meta.get("drafter_type") != "eagle":
        raise PolyspecError(f"{drafter_dir}: score_check compares EAGLE drafters")
    if DrafterKind.of(model) is DrafterKind.EAGLE3:  # its own head: row j is target id draft_ids[j]
        ids_s = model.draft_ids.to(dev)
    else:
        ids_s = torch.as_tensor(
            load_ranked(meta["vocab"]["file"]).top(meta["vocab"]["size"]).astype("int64"),
            device=dev,
        )
    head_w = target.model.get_output_embeddings().weight[ids_s].detach().float()
    embed = target.model.get_input_embeddings()
    softcap = getattr(target.model.config, "final_logit_softcapping", None)
    aux_layers = getattr(model, "aux_layers", None)
    seqs = []
    for rec in records:  # the same captured held-out answers the training score reads
        ids, start = reader.ids(rec["_path"], rec["id"])
        seqs.append(
            {
                "seq": torch.tensor([ids], device=dev),
                "start": start,
                "f": reader.get(rec["_path"], rec["id"], "f")[None],
                "aux": reader.get(rec["_path"], rec["id"], "aux")[None] if aux_layers else None,
            }
        )
    return score_eagle(model, embed, head_w, ids_s, seqs, gamma, softcap)


def heldout_records(run: Path, lang: str) -> list[dict]:
    path = run / "synth" / f"{lang}-heldout" / "data.jsonl"
    if not path.is_file():
        raise PolyspecError(
            f"{path}: no captured held-out answers (python -m synth distill --prompts heldout …)"
        )
    return [
        {**r, "_path": str(path.parent / r["features_file"])}
        for r in read_jsonl(path)
        if r.get("features_file")
    ]


def engines_scores(run: Path, engines: Path, target, gamma: int) -> list[dict]:
    """Per language: the held-out score (chain γ) of its own EAGLE-3 drafter and of the multilingual
    one, on the same captured held-out answers — what serving one drafter for every language costs.
    Written into ``engines.json`` (``drafters.<name>.heldout_tau_by_lang``,
    ``heldout_alpha_by_lang``) and ``scores.json`` beside it."""
    rec = json.loads((engines / "engines.json").read_text(encoding="utf-8"))
    reader = FeatureReader(target.spec.name, target.tokenizer_sha256)
    drafters = rec["drafters"]
    multi = drafters.get("multilingual")
    rows = []
    for lang in [n for n in drafters if n != "multilingual"]:
        records = heldout_records(run, lang)
        row = {"lang": lang}
        for name, folder in (
            (lang, engines / drafters[lang]["source"]),
            ("multilingual", engines / multi["source"]) if multi else (None, None),
        ):
            if name is None:
                continue
            with torch.no_grad():
                sc = score_tau(target, folder, records, reader, gamma)
            key = "own" if name == lang else "multilingual"
            row[f"{key}_tau"], row[f"{key}_alpha"] = sc["tau"], sc["alpha"]
            drafters[name].setdefault("heldout_tau_by_lang", {})[lang] = sc["tau"]
            # an engine's draft_n reads it
            drafters[name].setdefault("heldout_alpha_by_lang", {})[lang] = sc["alpha"]
        rows.append(row)
    rec["scores"] = {
        "gamma": gamma,
        "what": "training score: the decoder's chain procedure replayed on the target's "
        "captured greedy answers to the held-out prompts (synth/data/heldout.jsonl)",
        "rows": rows,
    }
    atomic_write_json(engines / "engines.json", rec)
    atomic_write_json(engines / "scores.json", rec["scores"])
    return rows


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipelines.score_check", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--run", required=True)
    ap.add_argument("--bundle", help="default: <run>/export/bundle")
    ap.add_argument(
        "--target",
        help="the bundle's target (a name, or the local model directory the run used); "
        "default: the name the bundle records",
    )
    ap.add_argument("--langs", help="default: the bundle's languages")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument(
        "--engines",
        default=None,
        metavar="DIR",
        help="score the engines export's drafters instead (python -m export engines): each "
        "language's own "
        "EAGLE-3 drafter beside the multilingual one, on the same held-out answers",
    )
    args = ap.parse_args(argv)
    run = Path(args.run)
    if args.engines:
        rec = json.loads((Path(args.engines) / "engines.json").read_text(encoding="utf-8"))
        target = load_target(args.target or rec["target"]["name"], dtype=args.dtype)
        rows = engines_scores(run, Path(args.engines), target, args.gamma)
        print(f"engine drafters, held-out score τ (chain γ={args.gamma}), dtype {target.dtype}")
        print("| lang | own drafter τ | multilingual drafter τ | multilingual / own |")
        print("|---|---|---|---|")
        for r in rows:
            m, own = r.get("multilingual_tau"), r["own_tau"]
            ratio = f"{m / own:.3f}" if m and own else "–"
            print(f"| {r['lang']} | {own:.3f} | {'–' if m is None else f'{m:.3f}'} | {ratio} |")
        return 0
    # the name of its target
    bundle = load_bundle(args.bundle or run / "export" / "bundle", verify=False)
    target = load_target(args.target or bundle.manifest["target"]["name"], dtype=args.dtype)
    # --target must be the bundle's (tokenizer, shapes)
    bundle = load_bundle(bundle.root, target_pin=target.pin())
    reader = FeatureReader(target.spec.name, target.tokenizer_sha256)
    langs = args.langs.split(",") if args.langs else bundle.languages
    rows = []
    for lang in langs:
        records = heldout_records(run, lang)
        # as trained
        size = json.loads((bundle.drafter_dir(lang) / "config.json").read_text())["vocab"]["size"]
        if size not in bundle.vocab_sizes:
            raise PolyspecError(
                f"the bundle has vocabulary sizes {bundle.vocab_sizes}, the {lang} drafter was "
                f"scored with {size}"
            )
        with torch.inference_mode():
            dec = decoder_tau(target, bundle, lang, records, reader, args.gamma, size)
        with torch.no_grad():
            sc = score_tau(target, bundle.drafter_dir(lang), records, reader, args.gamma)
        rows.append(
            {
                "lang": lang,
                "score_tau": sc["tau"],
                "decoder_tau": dec["tau"],
                "ratio": round(sc["tau"] / dec["tau"], 4) if dec["tau"] else None,
                "alpha": sc["alpha"],
                **{k: v for k, v in dec.items() if k != "tau"},
            }
        )
    print(
        f"training score vs decoder, chain γ={args.gamma}, greedy, dtype {target.dtype}, "
        f"{len(langs)} languages"
    )
    print(
        "| lang | score τ | decoder τ | score/decoder | α₁..α_γ (score) | decoder answers = "
        "captured |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['lang']} | {r['score_tau']:.3f} | {r['decoder_tau']:.3f} | {r['ratio']} | "
            f"{' '.join(f'{a:.2f}' for a in r['alpha'])} | {r['answers_identical_to_captured']} |"
        )
    (run / "score_check.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
