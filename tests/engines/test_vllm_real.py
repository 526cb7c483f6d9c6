"""vLLM itself (its CPU build, the engines environment ``make setup-vllm``; ``.ci/run`` builds it)
running polyspec's exports and synthesis. The target is ``polyspec.testing.build_engine_target`` (a
4-layer Llama with head_dim 64, which vLLM's CPU attention takes) and the drafter ``oracle_eagle3``,
whose first draft vLLM keeps only if it reads polyspec's export as polyspec wrote it. Every engine
runs eagerly (``enforce_eager``: ~30 s to start on 2 cores instead of ~2 min of torch.compile).
Measured on the 2-core Xeon: the bench ~2.5 min, synthesis ~1.5 min, the refused target ~40 s."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import run_cli
from polyspec.errors import PolyspecError
from polyspec.vllm_process import vllm_python

pytestmark = pytest.mark.slow

try:
    VLLM_PYTHON = vllm_python()
except PolyspecError as e:
    pytest.skip(f"vLLM environment absent ({e})", allow_module_level=True)


@pytest.fixture(scope="module")
def engine_target(tmp_path_factory):
    from export.interop import write_speculators_folder
    from polyspec.targets import load_target
    from polyspec.testing import build_engine_target, oracle_eagle3

    root = tmp_path_factory.mktemp("vllm")
    path = build_engine_target(root / "target")
    target = load_target(str(path), device="cpu", dtype="float32")
    # a draft vocabulary smaller than the target's: d2t / t2d are read too
    draft_ids = torch.arange(target.vocab_size).flip(0)[:600]
    write_speculators_folder(
        oracle_eagle3(target, draft_ids), target, root / "speculators" / "en", 3, {"lang": "en"}
    )
    return root, path


def test_vllm_serves_polyspecs_eagle3_export_losslessly_with_drafts_kept(engine_target):
    """check-vllm on the tiny target: plain, ngram and the exported EAGLE-3 drafter at draft lengths
    1 and 2, batch 1 and 2, fp32 — every output equal to vLLM's plain output, the first drafts kept
    (the oracle is right there), and the chosen draft length written into engines.json."""
    root, path = engine_target
    engines = root / "engines.json"
    engines.write_text(
        json.dumps(
            {
                "drafters": {"en": {}},
                "engines": {
                    "vllm": {
                        "command": (
                            'vllm serve x --speculative-config \'{"method": "eagle3", '
                            '"num_speculative_tokens": 3}\''
                        )
                    }
                },
            }
        )
    )
    out = root / "bench"
    r = run_cli(
        "-m",
        "engines.vllm",
        "--target",
        str(path),
        "--drafters",
        str(root / "speculators"),
        "--out",
        str(out),
        "--prompts",
        "3",
        "--n",
        "24",
        "--sweep",
        "1,2",
        "--batch",
        "1,2",
        "--eager",
        "--engines",
        str(engines),
        env={"POLYSPEC_VLLM_PYTHON": VLLM_PYTHON},
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    rep = json.loads((out / "vllm.json").read_text())
    modes = {(m["mode"], m["drafter"]): m["by_batch"] for m in rep["modes"]}
    # the plugin's hybrid, calibrated in the run (its m: the report's; the step cost it reads is
    # timed, so m may land past n_max: then no n-gram row is worth it and the hybrid does not run)
    h = rep["hybrid"]["en"]
    assert h["drafter_tokens"] == rep["draft_length"]["en"]["draft_n"]
    ran = h["ngram_min"] <= h["ngram_max"]
    hybrid = {(f"hybrid-m{h['ngram_min']}@{h['drafter_tokens']}", "en")} if ran else set()
    assert set(modes) == {("ngram", None), ("eagle3@1", "en"), ("eagle3@2", "en")} | hybrid
    for by in modes.values():
        assert all(b["identical"] == b["prompts"] == 3 for b in by.values())
    for k in (1, 2):
        b1 = modes[(f"eagle3@{k}", "en")]["1"]
        # the first draft: kept
        assert b1["drafts"] > 0 and b1["accepted"] >= 0.9 * b1["drafts"], b1
        assert b1["alpha"][0] >= 0.9 and len(b1["alpha"]) == k
    # the oracle's second draft reads its own state: wrong
    assert modes[("eagle3@2", "en")]["1"]["alpha"][1] <= 0.2
    d = rep["draft_length"]["en"]
    assert d["draft_n"] in (1, 2) and set(d["measured_speedup"]) == {"1", "2"}
    rec = json.loads(engines.read_text())
    assert rec["drafters"]["en"]["draft_n"]["vllm"] == d["draft_n"]
    assert '"num_speculative_tokens": <draft_n>' in rec["engines"]["vllm"]["command"]
    assert "make check-vllm" in rec["engines"]["vllm"]["tested_here"]
    assert "| eagle3@2 | en |" in (out / "vllm.md").read_text()


def test_vllm_synthesis_equals_the_transformers_engine_in_fp32(engine_target, tmp_path):
    """engine.name=vllm for on-policy distillation, with captured features: greedy answers equal the
    transformers engine's, and the features are the target's prefill in the capture layout train
    reads."""
    from polyspec.features import FeatureReader
    from polyspec.io import read_jsonl
    from polyspec.targets import load_target

    _, path = engine_target
    common = [
        "--lang",
        "en",
        "--target",
        str(path),
        "--prompts",
        "heldout",
        "--temperatures",
        "0",
        "capture_features=true",
        "feature_layers=eagle3",
        "limit=4",
        "sampling.max_new_tokens=16",
        "engine.dtype=float32",
        "engine.device=cpu",
    ]
    got = {}
    for engine in ("transformers", "vllm"):
        r = run_cli(
            "-m",
            "synth",
            "distill",
            "--run",
            str(tmp_path / engine),
            "--out-name",
            "d",
            *common,
            f"engine.name={engine}",
            *(["engine.enforce_eager=true"] if engine == "vllm" else []),
            env={"POLYSPEC_VLLM_PYTHON": VLLM_PYTHON},
        )
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        got[engine] = list(read_jsonl(tmp_path / engine / "synth" / "en-d" / "data.jsonl"))
        stats = json.loads((tmp_path / engine / "synth" / "en-d" / "stats.json").read_text())
        # the report says which ran
        assert stats["engine"] == engine and stats["engine_seconds_this_session"] > 0
        assert (
            (engine == "vllm")
            == bool(stats.get("engine_version"))
            == bool(stats.get("capture_seconds_this_session"))
        )
    assert len(got["vllm"]) == len(got["transformers"]) == 4
    for a, b in zip(got["transformers"], got["vllm"]):
        assert (
            a["conversations"][-1]["value"] == b["conversations"][-1]["value"]
            and a["id"] == b["id"]
        )
        assert b["conversations"][-1]["nll"] == pytest.approx(
            a["conversations"][-1]["nll"], abs=1e-3
        )
    target = load_target(str(path), device="cpu", dtype="float32", with_model=False)
    reader = {e: FeatureReader(target.spec.name, target.tokenizer_sha256) for e in got}
    for a, b in zip(got["transformers"], got["vllm"]):
        fa = str(tmp_path / "transformers" / "synth" / "en-d" / a["features_file"])
        fb = str(tmp_path / "vllm" / "synth" / "en-d" / b["features_file"])
        assert reader["transformers"].ids(fa, a["id"]) == reader["vllm"].ids(fb, b["id"])
        for name in ("f", "aux"):  # bf16 on disk: the two computations agree to its rounding
            assert torch.allclose(
                reader["transformers"].get(fa, a["id"], name).float(),
                reader["vllm"].get(fb, b["id"], name).float(),
                atol=0.05,
                rtol=0.02,
            )


def test_a_target_vllm_cannot_load_is_one_error_line_and_nothing_written(tiny_llama_dir, tmp_path):
    """The standard tiny target has head_dim 16, which vLLM's CPU attention lacks: one line with
    vLLM's own reason."""
    out = tmp_path / "bench"
    r = run_cli(
        "-m",
        "engines.vllm",
        "--target",
        str(tiny_llama_dir),
        "--out",
        str(out),
        "--prompts",
        "1",
        "--n",
        "4",
        "--sweep",
        "1",
        "--batch",
        "1",
        "--eager",
        env={"POLYSPEC_VLLM_PYTHON": VLLM_PYTHON},
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-3000:]
    assert r.stderr.startswith(
        "error: vLLM failed: RuntimeError: Unsupported CPU attention configuration: head_dim=16"
    )
    assert not (out / "vllm.json").exists()
