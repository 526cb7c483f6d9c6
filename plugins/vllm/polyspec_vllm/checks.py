"""Start-up checks of a polyspec drafter folder (one with ``polyspec.json``: polyspec's export)
against the target vLLM serves, so that a drafter trained for another target or tokenizer stops
vLLM with one line instead of running with drafts nobody accepts.

Pure Python over the folders' JSON and tokenizers (transformers), no vLLM: the pipeline's tests call
it too."""

from __future__ import annotations

import json
from pathlib import Path


def drafter_problems(drafter: str | Path, target_config, target_tokenizer: str | None) -> list[str]:
    """What makes the EAGLE-3 drafter folder ``drafter`` unfit for the target: its vocabulary size,
    hidden width, aux layers and ``polyspec.json``'s target pin against ``target_config`` (the
    target's text config: vocab_size, hidden_size, num_hidden_layers, model_type), and its saved
    tokenizer's vocabulary against the target's
    (``target_tokenizer``: a folder or hub id; None skips that). [] where it fits or where the
    folder is no polyspec export."""
    folder = Path(drafter)
    if not (folder / "polyspec.json").is_file() or not (folder / "config.json").is_file():
        return []
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if "speculators_model_type" not in cfg:  # not an EAGLE-3 export (an hf-assistant model)
        return []
    layer = cfg.get("transformer_layer_config") or {}
    pin = json.loads((folder / "polyspec.json").read_text(encoding="utf-8")).get("target") or {}
    problems = []
    vocab, hidden = target_config.vocab_size, target_config.hidden_size
    n_layers = target_config.num_hidden_layers
    # the target it was trained on (polyspec's pin): the architecture and depth, which shapes alone
    # do not tell
    family = getattr(target_config, "model_type", None)
    if pin.get("architecture") and family and pin["architecture"] != family:
        problems.append(f"it was trained on a {pin['architecture']} model, the target is {family}")
    if pin.get("num_hidden_layers") not in (None, n_layers):
        problems.append(
            f"it was trained on a {pin['num_hidden_layers']}-layer target, this one has {n_layers}"
        )
    if layer.get("vocab_size") != vocab:
        problems.append(f"its vocabulary has {layer.get('vocab_size')} ids, the target's {vocab}")
    if cfg.get("target_hidden_size") not in (None, hidden):
        problems.append(
            f"it reads {cfg.get('target_hidden_size')}-wide target states, the target's are "
            f"{hidden}"
        )
    aux = cfg.get("eagle_aux_hidden_state_layer_ids") or []
    if aux and max(aux) > n_layers:
        problems.append(f"it reads target layers {aux}, the target has {n_layers}")
    saved_tokenizer = (folder / "tokenizer_config.json").is_file()
    if not problems and target_tokenizer is not None and saved_tokenizer:
        from transformers import AutoTokenizer

        mine = AutoTokenizer.from_pretrained(str(folder)).get_vocab()
        theirs = AutoTokenizer.from_pretrained(str(target_tokenizer)).get_vocab()
        if mine != theirs:
            differ = len(set(mine.items()) ^ set(theirs.items()))
            problems.append(f"its tokenizer differs from the target's ({differ} entries differ)")
    return problems


# the config entries that make two EAGLE-3 folders one shape (vLLM builds every language drafter
# from the multilingual drafter's config and loads only its weights from the language's folder)
_SHAPE = (
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids",
    "norm_before_residual",
)
_LAYER = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
)


def shape_problems(main: str | Path, other: str | Path) -> list[str]:
    """How the drafter folder ``other`` differs in shape from ``main`` ([] where it does not)."""
    a, b = (
        json.loads((Path(f) / "config.json").read_text(encoding="utf-8")) for f in (main, other)
    )
    problems = [
        f"{k} {b.get(k)} differs from the multilingual drafter's {a.get(k)}"
        for k in _SHAPE
        if a.get(k) != b.get(k)
    ]
    la, lb = a.get("transformer_layer_config") or {}, b.get("transformer_layer_config") or {}
    problems += [
        f"{k} {lb.get(k)} differs from the multilingual drafter's {la.get(k)}"
        for k in _LAYER
        if la.get(k) != lb.get(k)
    ]
    return problems
