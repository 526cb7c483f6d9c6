"""Interop exports: a bundle's drafters in the layouts other runtimes load.

- ``hf-assistant`` (small-LM drafters): one plain transformers model folder per language — standard
  architecture, safetensors weights, the target's tokenizer files, ``vocab_size`` = the target's — that
  works as ``target.generate(..., assistant_model=AutoModelForCausalLM.from_pretrained(folder))``.
- ``vllm-eagle3`` (EAGLE-3 drafters): one folder per language in the layout vLLM loads for
  ``speculative_config={"method": "eagle3", "model": folder}``: ``config.json`` with
  ``architectures: ["LlamaForCausalLMEagle3"]``, ``draft_vocab_size``, ``target_hidden_size`` and the
  Llama fields of the draft layer; ``model.safetensors`` with ``fc.weight``, ``midlayer.*``, ``norm.weight``,
  ``lm_head.weight`` [draft_vocab, H] and ``d2t`` (draft id → target id offset: target = draft + d2t[draft])
  / ``t2d`` (bool [|V|]: target id is in the draft vocabulary). Only drafters trained in the EAGLE-3 form
  (``eagle.arch: eagle3``) map onto it exactly; an EAGLE-1-form drafter is refused with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from polyspec.errors import PolyspecError
from polyspec.io import atomic_directory, atomic_write_json


def write_hf_assistant(bundle, target, out: str | Path) -> list[Path]:
    """Each small-LM drafter of ``bundle`` → ``out/<lang>/`` (transformers ``save_pretrained`` layout)."""
    from train.models import load_drafter

    if bundle.manifest["drafter_type"] != "small-lm":
        raise PolyspecError(f"--format hf-assistant needs small-LM drafters; bundle {bundle.root} holds "
                            f"{bundle.manifest['drafter_type']} drafters (train with drafter_type=small-lm)")
    out = Path(out)
    written = []
    for lang in bundle.languages:
        model, meta = load_drafter(bundle.drafter_dir(lang))
        if model.config.vocab_size != target.vocab_size:
            raise PolyspecError(f"drafter {lang}: vocab_size {model.config.vocab_size} ≠ target's {target.vocab_size}")
        with atomic_directory(out / lang, overwrite=True) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            target.tokenizer.save_pretrained(tmp)
            atomic_write_json(tmp / "polyspec.json", {"exported_from": str(bundle.root), "lang": lang,
                                                      "target": bundle.manifest["target"], "format": "hf-assistant"})
        written.append(out / lang)
    return written


def write_vllm_eagle3(bundle, target, out: str | Path, draft_vocab_size: int | None = None) -> list[Path]:
    """Each EAGLE-3-form drafter → ``out/<lang>/`` in vLLM's ``LlamaForCausalLMEagle3`` layout."""
    from safetensors.torch import save_file

    from train.models import load_drafter
    from vocab.files import load_ranked

    if bundle.manifest["drafter_type"] != "eagle":
        raise PolyspecError(f"--format vllm-eagle3 needs EAGLE drafters; bundle {bundle.root} holds "
                            f"{bundle.manifest['drafter_type']} drafters")
    out = Path(out)
    written = []
    for lang in bundle.languages:
        model, meta = load_drafter(bundle.drafter_dir(lang))
        if getattr(model, "arch_name", "eagle1") != "eagle3":
            raise PolyspecError(
                f"drafter {lang} is EAGLE-1 form (fc over [embedding ‖ last feature]); vLLM's eagle3 reads three "
                f"target layers and its own head — train with eagle.arch=eagle3 to export for vLLM")
        s = draft_vocab_size or model.draft_vocab_size
        ranked = torch.as_tensor(load_ranked(bundle.vocab_file(lang), tokenizer_sha256=target.tokenizer_sha256)
                                 .ranked_ids[:s]).long()
        state, config = model.vllm_eagle3_state(ranked, target)
        with atomic_directory(out / lang, overwrite=True) as tmp:
            save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"),
                      metadata={"format": "pt"})
            atomic_write_json(tmp / "config.json", config)
            target.tokenizer.save_pretrained(tmp)
        written.append(out / lang)
    return written


def check_vllm_eagle3(folder: str | Path, target_vocab_size: int) -> dict:
    """Structural check of a vllm-eagle3 folder (vLLM cannot run here): config fields, tensor names and
    shapes, and that d2t/t2d describe the same draft vocabulary. Returns the config."""
    from safetensors import safe_open

    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    problems = []
    if cfg.get("architectures") != ["LlamaForCausalLMEagle3"]:
        problems.append(f"architectures {cfg.get('architectures')}")
    for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "draft_vocab_size",
              "vocab_size", "rms_norm_eps", "target_hidden_size"):
        if k not in cfg:
            problems.append(f"config lacks {k}")
    if cfg.get("vocab_size") != target_vocab_size:
        problems.append(f"vocab_size {cfg.get('vocab_size')} ≠ target's {target_vocab_size}")
    if problems:
        raise PolyspecError(f"{folder}: " + "; ".join(problems))
    H, Ht, s = cfg["hidden_size"], cfg["target_hidden_size"], cfg["draft_vocab_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // heads
    inter = cfg["intermediate_size"]
    want = {
        "fc.weight": (H, 3 * Ht), "norm.weight": (H,), "lm_head.weight": (s, H), "d2t": (s,), "t2d": (target_vocab_size,),
        "midlayer.input_layernorm.weight": (H,), "midlayer.hidden_norm.weight": (H,),
        "midlayer.post_attention_layernorm.weight": (H,),
        "midlayer.self_attn.q_proj.weight": (heads * hd, 2 * H), "midlayer.self_attn.k_proj.weight": (kv * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": (kv * hd, 2 * H), "midlayer.self_attn.o_proj.weight": (H, heads * hd),
        "midlayer.mlp.gate_proj.weight": (inter, H), "midlayer.mlp.up_proj.weight": (inter, H),
        "midlayer.mlp.down_proj.weight": (H, inter),
    }
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        missing = sorted(set(want) - names)
        if missing:
            raise PolyspecError(f"{folder}: missing tensors {missing}")
        for k, shape in want.items():
            if tuple(f.get_slice(k).get_shape()) != shape:
                raise PolyspecError(f"{folder}: {k} has shape {tuple(f.get_slice(k).get_shape())}, expected {shape}")
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    targets = torch.arange(s) + d2t
    if targets.min() < 0 or targets.max() >= target_vocab_size or len(set(targets.tolist())) != s:
        raise PolyspecError(f"{folder}: d2t does not map the draft vocabulary onto distinct target ids")
    if t2d.dtype != torch.bool or int(t2d.sum()) != s or not bool(t2d[targets].all()):
        raise PolyspecError(f"{folder}: t2d does not mark exactly the draft vocabulary")
    return cfg
