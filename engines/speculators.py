"""Load polyspec's speculators exports with vllm-project/speculators' own classes and compare their
draft logits with polyspec's drafter on the same inputs (``make check-speculators``).

    .venv-vllm/bin/python -m engines.speculators --exported <dir> --reference <dir> [--tol 1e-3]

Runs in the separate environment of the ``speculators`` package (it pins another transformers), so
it imports only speculators, torch, transformers and safetensors — never polyspec
(``engines/__init__.py`` imports nothing, so ``-m`` from the repository's root works there; run as a
file, ``python engines/speculators.py``, its folder would come first on ``sys.path`` and
``import speculators`` would find this file: that folder is taken off the path first).
``--reference`` holds one ``<lang>.safetensors`` per language written by ``python -m export --format
speculators --reference DIR`` (polyspec's side, in .venv): ``hidden_states`` [1, T, 3H] (the
target's aux layers), ``input_ids`` [1, T], ``position_ids`` [1, T], ``logits`` [1, T, s] and
``target_ids`` [1, T]. For each language:

1. ``SpeculatorModel.from_pretrained(<exported>/<lang>)`` with eager attention (CPU): the registry
   picks ``Eagle3DraftModel`` from ``speculators_model_type``; it reads the verifier's embedding
   from ``speculators_config.verifier.name_or_path`` (speculators 0.9.0 with transformers 5 may
   leave it as uninitialised memory: then it is reloaded with speculators' own loader, and the
   output says so).
2. Every tensor of the file is loaded unchanged into the model, and every weight the model owns
   comes from the file (only the verifier's embedding / norm / head are read from the verifier).
3. One forward (``ttt_steps=1``) on the reference inputs; the draft logits are read at ``lm_head``.
4. Max |Δ logit| ≤ ``--tol``, and the draft tokens speculators returns, mapped through its ``d2t``
   (target id = draft id + d2t[draft id]), equal polyspec's target ids wherever polyspec's top-1
   leads by more than 2·tol (a closer race may fall either way within the tolerance).

Exit status: 0 when every language passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# run as a file: this folder holds speculators.py, which would shadow the speculators package
if not __package__:
    sys.path[:] = [
        p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent
    ]

VERIFIER_OWNED = {"embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight"}


def check_language(folder: Path, ref_file: Path, tol: float) -> tuple[bool, str]:
    import torch
    from safetensors.torch import load_file
    from speculators import SpeculatorModel, SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.utils.loading import load_model_layers

    # 1. speculators' own loading path, eager attention on CPU
    config = SpeculatorModelConfig.from_pretrained(str(folder))
    # speculators reads it at init
    config.transformer_layer_config._attn_implementation = "eager"  # noqa: SLF001
    model = SpeculatorModel.from_pretrained(str(folder), config=config).eval()
    if not isinstance(model, Eagle3DraftModel):
        return False, f"loaded as {type(model).__name__}, not Eagle3DraftModel"
    # speculators 0.9.0 under transformers 5 leaves embed_tokens as uninitialised memory when the
    # checkpoint has none (its NaN "not loaded yet" sentinel is lost to meta-device init, so
    # load_verifier_weights skips it); vLLM shares the target's embedding instead. Reload it with
    # speculators' own loader, and say so.
    note = ""
    verifier = config.speculators_config.verifier.name_or_path
    embed = load_model_layers(["embed_tokens.weight"], verifier)["embed_tokens.weight"]
    if not torch.equal(
        model.embed_tokens.weight.detach(), embed.to(model.embed_tokens.weight.dtype)
    ):
        model._load_verifier_weights(overwrite_embed_tokens=True)  # noqa: SLF001
        note = "; embed_tokens reloaded from the verifier (speculators left it uninitialised)"
        if not torch.equal(
            model.embed_tokens.weight.detach(), embed.to(model.embed_tokens.weight.dtype)
        ):
            return (
                False,
                "embed_tokens differs from the verifier's embedding even after reloading it",
            )
    # 2. the file's tensors are the model's weights, unchanged
    file_state = load_file(str(folder / "model.safetensors"))
    model_state = model.state_dict()
    unexpected = sorted(set(file_state) - set(model_state))
    missing = sorted(set(model_state) - set(file_state) - VERIFIER_OWNED)
    if unexpected or missing:
        return (
            False,
            f"weights do not match Eagle3DraftModel: missing {missing[:4]}, unexpected "
            f"{unexpected[:4]}",
        )
    changed = [k for k, v in file_state.items() if not torch.equal(model_state[k].to(v.dtype), v)]
    if changed:
        return False, f"tensors changed on load: {changed[:4]}"
    if any(torch.isnan(p).any() for p in model.parameters()):
        return False, "some weights are NaN after loading (never loaded)"
    # 3. one forward on the reference inputs, logits read where speculators computes them
    ref = load_file(str(ref_file))
    seen = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: seen.append(out.detach()))
    ids = ref["input_ids"]
    with torch.no_grad():
        draft_tokens = model(
            hidden_states=ref["hidden_states"],
            input_ids=ids,
            document_ids=torch.zeros_like(ids),
            position_ids=ref["position_ids"],
            ttt_steps=1,
        )
    hook.remove()
    logits = seen[0].float()
    if logits.shape != ref["logits"].shape:
        return (
            False,
            f"logits shape {tuple(logits.shape)} ≠ polyspec's {tuple(ref['logits'].shape)}",
        )
    diff = (logits - ref["logits"]).abs().max().item()
    # 4. draft tokens → target ids through speculators' d2t
    draft = draft_tokens[0]
    target_ids = draft + model.d2t[draft] if model.d2t is not None else draft
    top2 = ref["logits"].topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * tol
    agree = int((target_ids == ref["target_ids"])[clear].sum())
    ok = diff <= tol and agree == int(clear.sum())
    T, s = logits.shape[1], logits.shape[2]
    # the embedding-scale convention (Gemma-3: engines feed the unscaled rows)
    if "logits_polyspec" in ref:
        own = ref["logits_polyspec"]
        same_top = int((own.argmax(-1) == logits.argmax(-1)).sum())
        note += (
            "; vs polyspec's own embedding scaling: max |Δlogit| "
            f"{(logits - own).abs().max().item():.3e}, "
            f"top-1 {same_top}/{T}"
        )
    return ok, (
        f"max |Δlogit| = {diff:.3e} (tol {tol:g}) over {T} positions × {s} draft ids; "
        f"top-1 target ids equal {agree}/{int(clear.sum())} clear positions{note}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Compare speculators' Eagle3DraftModel with polyspec's drafter."
    )
    ap.add_argument(
        "--exported", required=True, help="python -m export --format speculators --out DIR"
    )
    ap.add_argument(
        "--reference", required=True, help="python -m export --format speculators --reference DIR"
    )
    ap.add_argument(
        "--tol", type=float, default=1e-3, help="max allowed |Δ logit| (float32 on CPU)"
    )
    args = ap.parse_args(argv)
    from importlib.metadata import version

    import torch

    refs = sorted(Path(args.reference).glob("*.safetensors"))
    langs = sorted(p.name for p in Path(args.exported).iterdir() if (p / "config.json").is_file())
    if not refs or [r.stem for r in refs] != langs:
        print(
            f"error: reference languages {[r.stem for r in refs]} ≠ exported {langs}",
            file=sys.stderr,
        )
        return 1
    print(
        f"speculators {version('speculators')}, transformers {version('transformers')}, torch "
        f"{torch.__version__}, "
        "eager attention on CPU"
    )
    failed = []
    for ref in refs:
        try:
            ok, msg = check_language(Path(args.exported) / ref.stem, ref, args.tol)
        except Exception as e:  # noqa: BLE001 - report which language could not be loaded, and why
            ok, msg = False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(f"{ref.stem}: {'ok' if ok else 'FAIL'} — {msg}")
        if not ok:
            failed.append(ref.stem)
    if failed:
        print(
            f"check-speculators: {len(failed)} of {len(refs)} languages failed: "
            f"{', '.join(failed)}",
            file=sys.stderr,
        )
        return 1
    print(
        f"check-speculators: {len(refs)} languages load in speculators and match polyspec's logits"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
