"""Which target a name means: the registry ``configs/targets/<name>.yaml``, a local model folder or
a hub id.

Nothing here loads a model (``polyspec.targets.load_target`` does); resolving a name is cheap, so
the CLIs and dry runs validate targets with it before any heavy work.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

from pydantic import Field

from polyspec.config import StrictModel, read_yaml, validate
from polyspec.errors import PolyspecError
from polyspec.paths import configs_dir
from polyspec.prompts import BASE_STOP, PromptFormat

DEFAULT_TARGET = "gemma3-270m"
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


class TargetSpec(StrictModel):
    """One entry of ``configs/targets/<name>.yaml``."""

    name: str
    description: str = ""
    source: Literal["hf", "gguf-package"]
    model_id: str | None = Field(None, description="hf: hub id or local directory")
    revision: str | None = Field(None, description="hf: git revision to pin")
    package: str | None = Field(None, description="gguf-package: distribution name on PyPI")
    gguf_glob: str = Field(
        "*.gguf", description="gguf-package: file pattern inside the installed package"
    )
    assemble: str | None = Field(
        None,
        description="gguf-package: 'module:function' that writes the GGUF to a given path "
        "(chunked packages)",
    )
    dtype: str = Field(
        "auto",
        description="auto (bf16 on CUDA and on CPUs with native bf16, else fp32) | float32 | "
        "bfloat16 | float16",
    )
    prompt_format: PromptFormat = Field(default_factory=PromptFormat)
    trust_remote_code: bool = Field(False, description="only when you trust the model repository")
    gpu_only: bool = Field(False, description="preset meant for GPU users (large model)")


def registry_names() -> list[str]:
    return sorted(p.stem for p in (configs_dir() / "targets").glob("*.yaml"))


def resolve_target(name: str | None = None) -> TargetSpec:
    """Registry name, local directory or hub id -> :class:`TargetSpec` (one-line error
    otherwise)."""
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
            raise PolyspecError(
                f"{local} is a directory but has no config.json (not a transformers model folder)"
            )
        fmt = (
            PromptFormat()
            if _has_chat_template(local)
            else PromptFormat(kind="completion", stop=list(BASE_STOP))
        )
        return TargetSpec(
            name=local.resolve().name,
            source="hf",
            model_id=str(local.resolve()),
            dtype="auto",
            prompt_format=fmt,
        )
    if _HF_ID.match(name):
        return TargetSpec(name=name, source="hf", model_id=name, dtype="auto")
    raise PolyspecError(
        f"unknown target {name!r}; choose one of {', '.join(registry_names())}, "
        "a Hugging Face id (org/name) or a local model directory"
    )


def _has_chat_template(model_dir: Path) -> bool:
    """A local folder is a chat model when its tokenizer carries a chat template (else: base
    model)."""
    if (model_dir / "chat_template.jinja").is_file() or (
        model_dir / "chat_template.json"
    ).is_file():
        return True
    try:
        return bool(
            json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8")).get(
                "chat_template"
            )
        )
    except (OSError, json.JSONDecodeError):
        return False
