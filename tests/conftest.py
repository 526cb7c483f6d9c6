"""Shared fixtures: tiny random-weight targets (Gemma3 and Llama families, in-process tokenizer) and an
isolated polyspec cache. Nothing here downloads anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from polyspec.testing import build_tiny_target

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the hub
os.environ.setdefault("WANDB_MODE", "offline")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return build_tiny_target(tmp_path_factory.mktemp("targets") / "tiny-llama", family="llama")


@pytest.fixture(scope="session")
def tiny_gemma_dir(tmp_path_factory) -> Path:
    return build_tiny_target(tmp_path_factory.mktemp("targets") / "tiny-gemma3", family="gemma3")


@pytest.fixture(params=["llama", "gemma3"])
def tiny_target_dir(request, tiny_llama_dir, tiny_gemma_dir) -> Path:
    return {"llama": tiny_llama_dir, "gemma3": tiny_gemma_dir}[request.param]


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch) -> Path:
    """A private POLYSPEC_CACHE for tests that create or break caches."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("POLYSPEC_CACHE", str(cache))
    return cache


def prepare_run(run_dir: Path, target_dir: Path, lang: str = "vi") -> Path:
    """synth (finetune data), distill --continuation (pretrain text) and vocab for a tiny target."""
    from polyspec.config import apply_overrides, validate
    from synth.config import DistillConfig, SynthConfig
    from synth.distill import run_distill
    from synth.selfsynth import run_selfsynth
    from vocab.build import run_vocab
    from vocab.config import VocabConfig

    if (run_dir / "vocab" / f"{lang}.safetensors").is_file():
        return run_dir
    tiny = ["instruction.max_new_tokens=12", "response.max_new_tokens=24", "filters.keep_unfinished_instructions=true",
            "filters.min_response_chars=1", "filters.min_instruction_chars=1", "filters.require_language=false"]
    run_selfsynth(validate(SynthConfig, apply_overrides({}, [f"lang={lang}", "n=24", f"run={run_dir}", f"target={target_dir}",
                                                             "engine.batch_size=8", *tiny])), log=lambda *_: None)
    run_distill(validate(DistillConfig, {"lang": lang, "run": str(run_dir), "target": str(target_dir), "continuation": True,
                                         "out_name": "pretrain", "temperatures": [0.7, 1.0], "sampling": {"max_new_tokens": 24},
                                         "engine": {"batch_size": 16}}))
    run_vocab(validate(VocabConfig, {"langs": [lang], "target": str(target_dir), "run": str(run_dir), "mask_sizes": [128],
                                     "sources": [{"name": "synth"}, {"name": "wordfreq", "weight": 0.5}], "heldout": "seeds"}),
              log=lambda *_: None)
    return run_dir


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run ``python <args>`` (or ``make`` when args[0] == 'make') and capture its output."""
    full_env = {**os.environ, **(env or {})}
    cmd = list(args) if args[0] == "make" else [sys.executable, *args]
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=600)
