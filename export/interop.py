"""Interop exports: a bundle's drafters in the layouts other runtimes load.

- ``hf-assistant`` (small-LM drafters): one plain transformers model folder per language — standard
  architecture, safetensors weights, the target's tokenizer files, ``vocab_size`` = the target's —
  that works as ``target.generate(...,
  assistant_model=AutoModelForCausalLM.from_pretrained(folder))``.
- ``speculators`` (EAGLE-3 drafters; ``vllm-eagle3`` is the same format): one folder per language in
  the layout of vllm-project/speculators' ``Eagle3DraftModel``, which vLLM loads for
  ``speculative_config={"method": "eagle3", "model": folder}``: ``config.json``
  (``speculators_model_type: eagle3``, ``draft_vocab_size``, ``norm_before_residual``,
  ``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids``, ``transformer_layer_config`` = the
  Llama config of the draft layer, ``speculators_config`` {algorithm, proposal methods, verifier =
  the target's local folder}); ``model.safetensors`` with ``fc``, ``layers.0.*``, ``norm``,
  ``lm_head`` [draft vocab, H], ``d2t`` (target id = draft id + d2t[draft id]) and ``t2d`` (bool
  [|V|]). A drafter of ``eagle.num_layers`` = n > 1 carries n in ``transformer_layer_config``'s
  ``num_hidden_layers`` and its later layers as ``layers.1.*`` … (ordinary Llama decoder layers, H
  input, no ``hidden_norm``), as speculators' ``Eagle3DraftModel`` and vLLM's multi-layer eagle3
  build them. Only drafters trained in the EAGLE-3 form (``eagle.arch: eagle3``) map onto it
  exactly; an EAGLE-1-form drafter is refused with the reason. ``write_speculators_reference``
  writes polyspec's own logits on real target features, which ``engines/speculators.py`` (run in a
  separate environment with the speculators package: ``make check-speculators``) compares with
  speculators' forward.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save, save_file

from polyspec.drafter_kind import DrafterKind
from polyspec.drafter_models import load_drafter
from polyspec.errors import PolyspecError
from polyspec.io import atomic_directory, atomic_write_bytes, atomic_write_json
from polyspec.languages import get_language
from polyspec.targets import model_path


def write_hf_assistant(bundle, target, out: str | Path) -> list[Path]:
    """Each small-LM drafter of ``bundle`` → ``out/<lang>/`` (transformers ``save_pretrained``
    layout)."""

    if bundle.manifest["drafter_type"] != "small-lm":
        raise PolyspecError(
            f"--format hf-assistant needs small-LM drafters; bundle {bundle.root} holds "
            f"{bundle.manifest['drafter_type']} drafters (train with drafter_type=small-lm)"
        )
    out = Path(out)
    written = []
    for lang in bundle.languages:
        model, meta = load_drafter(bundle.drafter_dir(lang))
        if model.config.vocab_size != target.vocab_size:
            raise PolyspecError(
                f"drafter {lang}: vocab_size {model.config.vocab_size} ≠ target's "
                f"{target.vocab_size}"
            )
        with atomic_directory(out / lang, overwrite=True) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            target.tokenizer.save_pretrained(tmp)
            atomic_write_json(
                tmp / "polyspec.json",
                {
                    "exported_from": str(bundle.root),
                    "lang": lang,
                    "target": bundle.manifest["target"],
                    "format": "hf-assistant",
                },
            )
        written.append(out / lang)
    return written


# ------------------------------------------------------------------------------ speculators (vLLM)

SPECULATORS_VERSION = "0.9.0"  # the release `make check-speculators` loads the export with
_LAYER_MODULES = (
    "input_layernorm.",
    "hidden_norm.",
    "self_attn.",
    "post_attention_layernorm.",
    "mlp.",
)
_VERIFIER_OWNED = ("embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight")


def speculators_tensors(model, target_vocab_size: int) -> dict[str, torch.Tensor]:
    """An :class:`~polyspec.drafter_models.Eagle3Drafter`'s weights in speculators'
    ``Eagle3DraftModel`` names (the same modules, renamed: its first decoder layer is ``layers.0``;
    later ones are already ``layers.1``, …),
    plus the vocabulary maps: ``d2t`` int64 [s] (draft row j is target id j + d2t[j]) and ``t2d``
    bool [|V|] (target id is in the draft vocabulary). A draft vocabulary as large as the target's
    has no maps: its head rows are put in target-id order."""
    state = {}
    for k, v in model.state_dict().items():
        if k != "draft_ids":  # becomes d2t / t2d
            state[f"layers.0.{k}" if k.startswith(_LAYER_MODULES) else k] = (
                v.detach().cpu().contiguous()
            )
    ids = model.draft_ids.detach().cpu().long()
    s = len(ids)
    if s == target_vocab_size:
        state["lm_head.weight"] = state["lm_head.weight"][torch.argsort(ids)].contiguous()
    else:
        state["d2t"] = ids - torch.arange(s)
        t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
        t2d[ids] = True
        state["t2d"] = t2d
    return state


def speculators_config(model, target, speculative_tokens: int = 3) -> dict:
    """``config.json`` of speculators' ``Eagle3SpeculatorConfig`` (what vLLM reads for
    ``method: eagle3``)."""

    layer = {
        k: v
        for k, v in model.layer_config.to_dict().items()
        if not k.startswith("_attn_implementation")
    }
    # speculators builds its rotary embedding from a copy with hidden_size doubled: head_dim must be
    # explicit
    layer.update(
        head_dim=model.self_attn.head_dim,
        vocab_size=target.vocab_size,
        num_hidden_layers=model.num_layers,  # the first layer (2H input), then ordinary ones
        architectures=["LlamaForCausalLM"],
        model_type="llama",
    )
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": model.draft_vocab_size,
        # Eagle3Drafter.forward: residual = fc output g itself (h = g + attn), hidden_norm(g) only
        # feeds the attention; vLLM takes a missing flag as true, which would be another model
        "norm_before_residual": False,
        "norm_output": False,  # unrolled steps feed back the pre-norm output
        "target_hidden_size": model.target_hidden_size,
        # entries of the target's output_hidden_states
        "eagle_aux_hidden_state_layer_ids": list(model.aux_layers),
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "verifier": {
                "name_or_path": model_path(target.spec),
                "architectures": list(getattr(target.config, "architectures", None) or []),
            },
        },
        "torch_dtype": "float32",
    }


def _eagle3_drafters(bundle, fmt: str):
    """(lang, drafter) for every language of an EAGLE-3-form bundle; anything else is a one-line
    refusal."""

    if bundle.manifest["drafter_type"] != "eagle":
        raise PolyspecError(
            f"--format {fmt} needs EAGLE-3 drafters; bundle {bundle.root} holds "
            f"{bundle.manifest['drafter_type']} drafters"
        )
    for lang in bundle.languages:
        model, _ = load_drafter(bundle.drafter_dir(lang))
        if DrafterKind.of(model) is not DrafterKind.EAGLE3:
            raise PolyspecError(
                f"drafter {lang} is EAGLE-1 form (fc over [embedding ‖ last feature]); "
                "speculators/vLLM eagle3 reads "
                "three target layers and its own head — train with eagle.arch=eagle3 to export "
                "for vLLM"
            )
        yield lang, model


def write_speculators(bundle, target, out: str | Path, speculative_tokens: int = 3) -> list[Path]:
    """Each EAGLE-3-form drafter → ``out/<lang>/`` (``config.json``, ``model.safetensors``, the
    target's tokenizer, ``polyspec.json`` provenance): loadable with speculators'
    ``SpeculatorModel.from_pretrained`` and by vLLM
    (``"method": "eagle3", "model": "<out>/<lang>"``)."""

    out = Path(out)
    written = []
    for lang, model in _eagle3_drafters(bundle, "speculators"):
        ranked = torch.as_tensor(bundle.ranked(lang).ranked_ids[: model.draft_vocab_size]).long()
        if not torch.equal(ranked, model.draft_ids.cpu()):
            raise PolyspecError(
                f"drafter {lang}: its draft vocabulary differs from the bundle's ranked list"
            )
        written.append(
            write_speculators_folder(
                model,
                target,
                out / lang,
                speculative_tokens,
                {
                    "exported_from": str(bundle.root),
                    "lang": lang,
                    "target": bundle.manifest["target"],
                },
            )
        )
    return written


def write_speculators_folder(
    model, target, folder: str | Path, speculative_tokens: int = 3, provenance: dict | None = None
) -> Path:
    """One EAGLE-3-form drafter → ``folder`` (speculators' layout; see
    :func:`write_speculators`)."""

    folder = Path(folder)
    name = folder.name
    if model.target_hidden_size != target.hidden_size:
        raise PolyspecError(
            f"drafter {name}: target_hidden_size {model.target_hidden_size} ≠ target's "
            f"{target.hidden_size}"
        )
    aux, n = list(model.aux_layers), target.num_layers
    # speculators' own rule (vLLM: distinct too)
    if len(set(aux)) != len(aux) or min(aux) < 0 or max(aux) > n:
        raise PolyspecError(
            f"drafter {name} reads target layers {aux}: speculators and vLLM need distinct ids "
            f"in [0, {n}] for this {n}-layer target"
        )
    with atomic_directory(folder, overwrite=True) as tmp:
        save_file(
            speculators_tensors(model, target.vocab_size),
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        atomic_write_json(
            tmp / "config.json", speculators_config(model, target, speculative_tokens)
        )
        target.tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / "polyspec.json", {**(provenance or {}), "format": "speculators"})
    return folder


def check_speculators(folder: str | Path, target_vocab_size: int) -> dict:
    """Structural check of a speculators export without the speculators package: config fields,
    tensor names and shapes, and that d2t/t2d describe the same draft vocabulary. Returns the
    config. (The check with speculators' own classes is ``make check-speculators``.)"""

    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    layer = cfg.get("transformer_layer_config") or {}
    problems = [
        f"config lacks {k}"
        for k in (
            "speculators_version",
            "draft_vocab_size",
            "norm_before_residual",
            "target_hidden_size",
            "eagle_aux_hidden_state_layer_ids",
        )
        if k not in cfg
    ]
    if cfg.get("speculators_model_type") != "eagle3":
        problems.append(f"speculators_model_type {cfg.get('speculators_model_type')!r}")
    problems += [
        f"transformer_layer_config lacks {k}"
        for k in (
            "model_type",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "rms_norm_eps",
            "vocab_size",
        )
        if k not in layer
    ]
    spec = cfg.get("speculators_config") or {}
    methods = [m.get("proposal_type") for m in spec.get("proposal_methods") or []]
    if spec.get("algorithm") != "eagle3" or spec.get("default_proposal_method") not in methods:
        problems.append(
            "speculators_config needs algorithm eagle3 and a default_proposal_method among "
            "proposal_methods"
        )
    if not (spec.get("verifier") or {}).get("name_or_path"):
        problems.append("speculators_config.verifier.name_or_path is missing")
    if layer.get("vocab_size") != target_vocab_size:
        problems.append(
            f"transformer_layer_config.vocab_size {layer.get('vocab_size')} ≠ target's "
            f"{target_vocab_size}"
        )
    if problems:
        raise PolyspecError(f"{folder}: " + "; ".join(problems))
    H, Ht, s = layer["hidden_size"], cfg["target_hidden_size"], cfg["draft_vocab_size"]
    heads, kv, hd, inter = (
        layer[k]
        for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")
    )
    n_aux = len(cfg["eagle_aux_hidden_state_layer_ids"])
    n_layers = layer.get("num_hidden_layers", 1)
    if not isinstance(n_layers, int) or n_layers < 1:
        raise PolyspecError(f"{folder}: transformer_layer_config.num_hidden_layers {n_layers!r}")
    want = {
        "fc.weight": (H, n_aux * Ht),
        "norm.weight": (H,),
        "lm_head.weight": (s, H),
        "layers.0.input_layernorm.weight": (H,),
        "layers.0.hidden_norm.weight": (H,),
        "layers.0.post_attention_layernorm.weight": (H,),
        "layers.0.self_attn.q_proj.weight": (heads * hd, 2 * H),
        "layers.0.self_attn.k_proj.weight": (kv * hd, 2 * H),
        "layers.0.self_attn.v_proj.weight": (kv * hd, 2 * H),
        "layers.0.self_attn.o_proj.weight": (H, heads * hd),
        "layers.0.mlp.gate_proj.weight": (inter, H),
        "layers.0.mlp.up_proj.weight": (inter, H),
        "layers.0.mlp.down_proj.weight": (H, inter),
    }
    for i in range(1, n_layers):  # the later layers: ordinary decoder layers on the hidden state
        want |= {
            f"layers.{i}.input_layernorm.weight": (H,),
            f"layers.{i}.post_attention_layernorm.weight": (H,),
            f"layers.{i}.self_attn.q_proj.weight": (heads * hd, H),
            f"layers.{i}.self_attn.k_proj.weight": (kv * hd, H),
            f"layers.{i}.self_attn.v_proj.weight": (kv * hd, H),
            f"layers.{i}.self_attn.o_proj.weight": (H, heads * hd),
            f"layers.{i}.mlp.gate_proj.weight": (inter, H),
            f"layers.{i}.mlp.up_proj.weight": (inter, H),
            f"layers.{i}.mlp.down_proj.weight": (H, inter),
        }
    maps = s != target_vocab_size
    if maps:
        want |= {"d2t": (s,), "t2d": (target_vocab_size,)}
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        if sorted(set(want) - names) or sorted(names - set(want)):
            raise PolyspecError(
                f"{folder}: tensors missing {sorted(set(want) - names)}, unexpected "
                f"{sorted(names - set(want))}"
            )
        for k, shape in want.items():
            if tuple(f.get_slice(k).get_shape()) != shape:
                raise PolyspecError(
                    f"{folder}: {k} has shape {tuple(f.get_slice(k).get_shape())}, expected {shape}"
                )
        if maps:
            d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    if maps:
        targets = torch.arange(s) + d2t
        if (
            d2t.dtype != torch.int64
            or targets.min() < 0
            or targets.max() >= target_vocab_size
            or len(set(targets.tolist())) != s
        ):
            raise PolyspecError(
                f"{folder}: d2t does not map the draft vocabulary onto distinct target ids (int64)"
            )
        if t2d.dtype != torch.bool or int(t2d.sum()) != s or not bool(t2d[targets].all()):
            raise PolyspecError(f"{folder}: t2d does not mark exactly the draft vocabulary")
    return cfg


def write_speculators_reference(
    bundle, target, out: str | Path, tokens: int = 32, extra: dict | None = None
) -> list[Path]:
    """polyspec's side of ``make check-speculators``: per language, the target's real features on a
    seed text of the language and the logits polyspec's drafter computes from them →
    ``out/<lang>.safetensors`` {``hidden_states`` [1, T, 3H] (the aux layers at tokens 0..T-1),
    ``input_ids`` [1, T] (tokens 1..T), ``position_ids`` [1, T], ``logits`` [1, T, s] (draft rows,
    from the embedding matrix's rows as engines feed them), ``target_ids`` [1, T] (argmax as target
    ids), ``logits_polyspec`` (from the target's embedding module, as polyspec's decoder feeds them:
    equal unless the module scales, Gemma-3)}:
    the EAGLE pairing [embed(x_{t+1}) ‖ g_t] at position t+1, as in training."""
    out = Path(out)
    written = []
    drafters = [(lang, lang, model) for lang, model in _eagle3_drafters(bundle, "speculators")]
    drafters += [(name, text_lang, model) for name, (model, text_lang) in (extra or {}).items()]
    for name, lang, model in drafters:  # extra: name → (drafter, the language of its test text)
        try:
            seed = get_language(lang, target.spec.name).seeds[0]
        except PolyspecError:
            seed = get_language("en").seeds[0]
        text = f"{seed.instruction}\n{seed.response}"
        ids = target.tokenizer(text, return_tensors="pt")["input_ids"][:, : tokens + 1].to(
            target.device
        )
        model = model.to(target.device)
        with torch.no_grad():
            hs = target.model.get_decoder()(
                input_ids=ids, output_hidden_states=True, use_cache=False
            ).hidden_states
            g = torch.cat([hs[i] for i in model.aux_layers], dim=-1)[:, :-1].float()
            x = ids[:, 1:]
            pos = torch.arange(1, ids.shape[1], device=ids.device).unsqueeze(0)
            # engines (speculators, vLLM, llama.cpp) feed the drafter the embedding matrix's rows;
            # polyspec feeds what the target's embedding module returns, which some families scale
            # (Gemma-3: × √H). The drafter reads it through an RMSNorm, so the two differ only
            # through the norm's ε: both are recorded
            module = target.model.get_input_embeddings()
            h, _ = model(module.weight[x].float(), g, position_ids=pos)
            logits = model.logits(h)
            h_own, _ = model(module(x).float(), g, position_ids=pos)
            logits_own = model.logits(h_own)
        ref = {
            "hidden_states": g,
            "input_ids": x,
            "position_ids": pos,
            "logits": logits,
            "target_ids": model.draft_ids[logits.argmax(-1)],
            "logits_polyspec": logits_own,
        }
        path = atomic_write_bytes(
            out / f"{name}.safetensors",
            save(
                {k: v.detach().cpu().contiguous() for k, v in ref.items()},
                metadata={"lang": lang, "text": text[:200]},
            ),
        )
        written.append(path)
    return written
