"""Does the training score predict the decoder? One run, the same held-out prompts, both measured.

    python -m pipelines.score_check --run runs/demo [--langs vi,de,ja] [--gamma 4]
        [--target gemma3-270m]
    python -m pipelines.score_check --run R --drafter R/oc-140000/en/finetune/final [--lang en]
        [--heldout R/synth/en-heldout-chat/data.jsonl] [--out FILE]

For each language: the score that picked ``best/`` (train/score.py: the decoder's greedy chain
replayed on the target's captured held-out answers) recomputed for the bundle's drafter, and the
decoder's own τ and α₁..α_γ (decoder/core.py, method ``chain``, γ, greedy, the bundle's language
and the drafter's vocabulary size, default dtype) on the same held-out prompts with the same token
budget and stop strings. Prints both and their ratio; the ratio must stay within 10 % (issue 14),
and α₁ beside the score's is the train/decode check of issue 68.

``--drafter``: one trained drafter folder (a learning curve's point) instead of the run's export: a
bundle of it and ``<run>/vocab/<lang>.safetensors`` is written by ``export.bundle.write_bundle``
into a temporary folder, checked on the held-out answers of ``--heldout`` (default
``<run>/synth/<lang>-heldout/data.jsonl``), and the result written atomically beside the drafter:
``<drafter>/../score_check-<set>.json`` (set: the held-out folder's name less ``<lang>-``, e.g.
``heldout``, ``heldout-chat``), which ``pipelines.onpolicy_curve``'s table reads.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from decoder.core import Decoder
from export.bundle import load_bundle, write_bundle
from polyspec.drafter_kind import DrafterKind
from polyspec.drafter_models import load_drafter
from polyspec.errors import PolyspecError, cli_entry
from polyspec.features import FeatureReader
from polyspec.io import atomic_write_json, read_jsonl
from polyspec.targets import load_target
from train.score import score_eagle, summarize
from vocab.files import load_ranked

# α_i, decoder and score alike (train.score.summarize): the share of all steps that kept ≥ i
# drafts — α₁ = P(draft 1 kept), α_i = P(drafts 1..i all kept), not conditional on draft i−1;
# every step counts, a step whose chain was cut to fit before the answer's end too, and the
# answer's last token is always the target's own (a step kept min(accepted, new tokens − 1)).
ALPHA_RULE = (
    "alpha_i = share of all steps that kept >= i drafts (not conditional); every step counts, "
    "those cut short by the answer's end too; the answer's last token is the target's own"
)


def kept_drafts(out) -> list[int]:
    """Drafts kept per step of a decoder's answer (``GenerationResult``), as the score counts them:
    the stopping rules may end the answer on an accepted draft, which the score (whose drafts stop
    before the answer's last token, train/score.py ``walk``) counts as the target's own token."""
    return [max(0, min(s.accepted, s.new_tokens - 1)) for s in out.steps]


def decoder_tau(
    target, bundle, lang: str, records: list[dict], reader, gamma: int, size: int
) -> dict:
    """The decoder's chain γ on each record's prompt, as many new tokens as the captured answer
    holds → τ (its tokens over its target forwards), α₁..α_γ (``ALPHA_RULE``), steps, and how many
    answers equal the captured ones."""
    dec = Decoder(target, bundle, method="chain", gamma=gamma, size=size, lang=lang)
    tokens = forwards = same = 0
    per_seq = []
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
        per_seq.append((len(out.tokens), kept_drafts(out)))
    acc = summarize(per_seq, gamma)
    return {
        "tau": round(tokens / max(1, forwards), 4),
        "alpha": acc["alpha"],
        "steps": acc["steps"],
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


def heldout_records(run: Path, lang: str, path: Path | None = None) -> list[dict]:
    """The captured held-out answers of ``path`` (default ``<run>/synth/<lang>-heldout/data.jsonl``)
    that have features."""
    path = Path(path) if path else run / "synth" / f"{lang}-heldout" / "data.jsonl"
    if not path.is_file():
        raise PolyspecError(
            f"{path}: no captured held-out answers (python -m synth distill --prompts heldout …)"
        )
    records = [
        {**r, "_path": str(path.parent / r["features_file"])}
        for r in read_jsonl(path)
        if r.get("features_file")
    ]
    if not records:
        raise PolyspecError(f"{path}: no record has captured features (capture_features=true)")
    return records


def check(
    target, bundle, lang: str, records: list[dict], reader, gamma: int, size: int, drafter_dir
) -> dict:
    """One language's row: the training score and the decoder on the same held-out answers."""
    with torch.inference_mode():
        dec = decoder_tau(target, bundle, lang, records, reader, gamma, size)
    with torch.no_grad():
        sc = score_tau(target, drafter_dir, records, reader, gamma)
    return {
        "lang": lang,
        "score_tau": sc["tau"],
        "decoder_tau": dec["tau"],
        "ratio": round(sc["tau"] / dec["tau"], 4) if dec["tau"] else None,
        "score_alpha": sc["alpha"],
        "decoder_alpha": dec["alpha"],
        "top1_teacher_forced": sc.get("top1_teacher_forced"),
        "score_steps": sc["steps"],
        "decoder_steps": dec["steps"],
        **{k: v for k, v in dec.items() if k not in ("tau", "alpha", "steps")},
    }


def print_rows(rows: list[dict], gamma: int, dtype, what: str) -> None:
    dtype = str(dtype).removeprefix("torch.")
    print(f"training score vs decoder, chain γ={gamma}, greedy, dtype {dtype}, {what}")
    print(
        "| lang | score τ | decoder τ | score/decoder | α₁..α_γ (score) | α₁..α_γ (decoder) | "
        "teacher-forced top-1 | decoder answers = captured |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        top1 = r["top1_teacher_forced"]
        print(
            f"| {r['lang']} | {r['score_tau']:.3f} | {r['decoder_tau']:.3f} | {r['ratio']} | "
            f"{' '.join(f'{a:.3f}' for a in r['score_alpha'])} | "
            f"{' '.join(f'{a:.3f}' for a in r['decoder_alpha'])} | "
            f"{'–' if top1 is None else f'{top1:.3f}'} | {r['answers_identical_to_captured']} |"
        )


def vocab_size(drafter: Path) -> int:
    """The vocabulary size a drafter was trained and scored with (an EAGLE-3 drafter's own head:
    its draft vocabulary)."""
    cfg = json.loads((drafter / "config.json").read_text(encoding="utf-8"))
    size = (cfg.get("vocab") or {}).get("size") or cfg.get("draft_vocab_size")
    if not size:
        raise PolyspecError(f"{drafter}: its config records no vocabulary size")
    return int(size)


def drafter_check(
    run: Path,
    drafter: Path,
    lang: str | None,
    heldout: Path | None,
    target_name: str | None,
    gamma: int,
    dtype: str,
    out: Path | None,
) -> tuple[dict, Path]:
    """``--drafter``: one trained drafter folder checked through a temporary bundle (the export's
    own writer) → (the result, the file it was written to)."""
    if not (drafter / "config.json").is_file():
        raise PolyspecError(f"{drafter}: not a drafter folder (no config.json)")
    cfg = json.loads((drafter / "config.json").read_text(encoding="utf-8"))
    lang = lang or cfg.get("lang")
    if not lang:
        raise PolyspecError(f"{drafter}: its config names no language; give --lang")
    size = vocab_size(drafter)
    target = load_target(target_name or cfg["target"]["name"], dtype=dtype)
    heldout = Path(heldout) if heldout else run / "synth" / f"{lang}-heldout" / "data.jsonl"
    records = heldout_records(run, lang, heldout)
    reader = FeatureReader(target.spec.name, target.tokenizer_sha256)
    with tempfile.TemporaryDirectory(prefix="score-check-") as tmp:
        bundle = write_bundle(
            Path(tmp) / "bundle", run, [lang], target.pin(), [size], drafters={lang: drafter}
        )
        row = check(target, bundle, lang, records, reader, gamma, size, drafter)
    name = heldout.parent.name
    name = name[len(lang) + 1 :] if name.startswith(f"{lang}-") else name
    out = out or drafter.parent / f"score_check-{name}.json"
    result = {
        "drafter": str(drafter),
        "heldout": str(heldout),
        "prompts": len(records),
        "target": target.spec.name,
        "dtype": str(target.dtype).removeprefix("torch."),
        "gamma": gamma,
        "alpha_rule": ALPHA_RULE,
        **row,
    }
    atomic_write_json(out, result)
    return result, out


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
    ap.add_argument(
        "--drafter",
        type=Path,
        help="check this trained drafter folder (…/finetune/final) instead of the run's bundle; "
        "the result goes beside it (score_check-<set>.json)",
    )
    ap.add_argument("--lang", help="--drafter: its language (default: the one its config records)")
    ap.add_argument(
        "--heldout",
        type=Path,
        help="--drafter: the captured held-out answers (default "
        "<run>/synth/<lang>-heldout/data.jsonl; the chat set: <run>/synth/<lang>-heldout-chat/"
        "data.jsonl)",
    )
    ap.add_argument("--out", type=Path, help="--drafter: the result file")
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
    if args.drafter and (args.bundle or args.langs or args.engines):
        ap.error("--drafter checks one drafter folder: not with --bundle, --langs or --engines")
    if not args.drafter and (args.lang or args.heldout or args.out):
        ap.error("--lang, --heldout and --out go with --drafter")
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
    if args.drafter:
        result, out = drafter_check(
            run,
            args.drafter,
            args.lang,
            args.heldout,
            args.target,
            args.gamma,
            args.dtype,
            args.out,
        )
        print_rows([result], args.gamma, result["dtype"], f"{result['prompts']} held-out answers")
        print(f"→ {out}")
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
        size = vocab_size(bundle.drafter_dir(lang))  # as trained
        if size not in bundle.vocab_sizes:
            raise PolyspecError(
                f"the bundle has vocabulary sizes {bundle.vocab_sizes}, the {lang} drafter was "
                f"scored with {size}"
            )
        rows.append(
            check(target, bundle, lang, records, reader, args.gamma, size, bundle.drafter_dir(lang))
        )
    print_rows(rows, args.gamma, target.dtype, f"{len(langs)} languages")
    atomic_write_json(run / "score_check.json", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
