"""export/: bundle writer and validator on a tiny target with trained drafters."""

import json
import shutil

import pytest
import torch

from conftest import export_train, export_vocab, prepare_run, run_cli
from polyspec.errors import PolyspecError
from polyspec.targets import load_target
from vocab.masks import load_masks


def export_cli(run_dir, target_dir, out, langs: str, sizes: str):
    """``python -m export`` of ``langs`` from ``run_dir`` into ``out`` with masks of ``sizes``."""
    args = ["--langs", langs, "--run", str(run_dir), "--target", str(target_dir), "--out", str(out)]
    return run_cli("-m", "export", *args, "--sizes", sizes)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_llama_dir):
    """A run with vi and de drafters (a few EAGLE steps each) and both vocabularies."""
    run_dir = tmp_path_factory.mktemp("run-export")
    for lang in ("vi", "de"):
        prepare_run(run_dir, tiny_llama_dir, lang)
        export_train(run_dir, tiny_llama_dir, f"lang={lang}", "stage=finetune", "finetune.steps=2")
    # vocab for both languages in one call (the masks need every ranked list)
    export_vocab(run_dir, tiny_llama_dir)
    return run_dir, load_target(str(tiny_llama_dir))


def test_write_and_load_bundle(tmp_path, trained):
    from export.bundle import load_bundle, write_bundle

    run_dir, target = trained
    b = write_bundle(tmp_path / "bundle", run_dir, ["vi", "de"], target.pin(), [64, 128])
    m = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert m["format_version"] == 1 and m["drafter_type"] == "eagle"
    assert m["languages"] == ["vi", "de"] and m["vocab_sizes"] == [64, 128]
    assert m["target"]["tokenizer_sha256"] == target.tokenizer_sha256
    assert set(m["adaptive"]) == {"window", "step", "offset"}
    for rel in (
        "drafters/vi/model.safetensors",
        "drafters/de/config.json",
        "vocab/vi.safetensors",
        "language_masks.safetensors",
        "README.md",
    ):
        assert rel in m["files"] and len(m["files"][rel]) == 64
    mask, langs, sizes = load_masks(b.masks_file())
    assert mask.shape == (4, target.vocab_size) and mask.dtype == torch.bool
    assert load_bundle(tmp_path / "bundle", target_pin=target.pin()).languages == ["vi", "de"]
    card = (tmp_path / "bundle" / "README.md").read_text()
    assert "tiny-llama" in card and "## Drafters" in card
    # training data counts on the model card
    assert "| vi | eagle1 | finetune | 2 | vi/data.jsonl (" in card


def test_a_drafter_trained_elsewhere_goes_into_the_bundle(tmp_path, trained, tiny_llama_dir):
    run_dir, _ = trained
    point = tmp_path / "oc-140000" / "en" / "finetune" / "final"  # a learning curve's point
    shutil.copytree(run_dir / "train" / "de" / "final", point)
    out = tmp_path / "bundle"
    r = export_cli(run_dir, tiny_llama_dir, out, "vi,de", "64")
    assert r.returncode == 0, r.stderr
    default = (out / "drafters" / "vi" / "model.safetensors").read_bytes()
    r = run_cli(
        *[
            "-m",
            "export",
            "--langs",
            "vi,de",
            "--run",
            str(run_dir),
            "--target",
            str(tiny_llama_dir),
        ],
        *["--out", str(out), "--sizes", "64", "--drafter", f"vi={point}"],
    )
    assert r.returncode == 0, r.stderr
    got = (out / "drafters" / "vi" / "model.safetensors").read_bytes()
    assert got == (point / "model.safetensors").read_bytes() and got != default
    r = run_cli(
        *["-m", "export", "--langs", "vi", "--run", str(run_dir), "--target", str(tiny_llama_dir)],
        *["--out", str(tmp_path / "b2"), "--drafter", f"ja={point}"],
    )
    assert r.returncode != 0 and "expected LANG=DIR" in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "b2").exists()


@pytest.mark.parametrize("damage", ["corrupt", "missing", "dotdot", "absolute", "format"])
def test_damaged_bundle_is_refused_in_one_line(tmp_path, trained, damage):
    from export.bundle import load_bundle, write_bundle

    run_dir, target = trained
    root = tmp_path / "bundle"
    write_bundle(root, run_dir, ["vi", "de"], target.pin(), [64, 128])
    manifest = json.loads((root / "manifest.json").read_text())
    if damage == "corrupt":
        p = root / "drafters" / "vi" / "model.safetensors"
        data = bytearray(p.read_bytes())
        data[-1] ^= 0xFF
        p.write_bytes(bytes(data))
    elif damage == "missing":
        (root / "vocab" / "de.safetensors").unlink()
    elif damage in ("dotdot", "absolute"):
        manifest["files"]["../../etc/passwd" if damage == "dotdot" else "/etc/passwd"] = "0" * 64
    elif damage == "format":
        manifest["format_version"] = 99
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PolyspecError) as e:
        load_bundle(root, target_pin=target.pin())
    assert "\n" not in str(e.value)


def test_bundle_for_another_target_is_refused(tmp_path, trained, tiny_gemma_dir):
    from export.bundle import load_bundle, write_bundle

    run_dir, target = trained
    write_bundle(tmp_path / "b", run_dir, ["vi"], target.pin(), [64])
    other = load_target(str(tiny_gemma_dir)).pin()
    with pytest.raises(PolyspecError, match="another tokenizer"):
        load_bundle(tmp_path / "b", target_pin=other)
    with pytest.raises(PolyspecError, match="another target tokenizer"):
        write_bundle(tmp_path / "c", run_dir, ["vi"], other, [64])


def test_a_drafter_trained_with_another_conversion_of_the_same_ids_exports_with_a_warning(
    tmp_path, trained, capsys
):
    """A run trained where another transformers converted the target's tokenizer (the H200 image's,
    for the chat target's GGUF: other special-token rules, the same id table) exports here with one
    warning; its vocabulary is pinned to this tokenizer (recording where it was ranked), so the
    bundle loads for this target."""
    from export.bundle import load_bundle, write_bundle

    run_dir, target = trained
    pin = target.pin()
    elsewhere = {
        **pin,
        "tokenizer_sha256": "f" * 64,
        "special_token_ids": {**(pin.get("special_token_ids") or {}), "eos": -1},
    }
    moved = tmp_path / "run"
    shutil.copytree(run_dir, moved)
    for lang in ("vi", "de"):
        cfg_path = moved / "train" / lang / "final" / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg_path.write_text(
            json.dumps({**cfg, "target": {**cfg["target"], "tokenizer_sha256": "f" * 64}})
        )
        meta_path = moved / "vocab" / f"{lang}.json"
        meta_path.write_text(
            json.dumps({**json.loads(meta_path.read_text()), "tokenizer_sha256": "f" * 64})
        )
    assert elsewhere["vocab_sha256"] == pin["vocab_sha256"]
    write_bundle(tmp_path / "b", moved, ["vi", "de"], pin, [64])
    assert "another conversion of the tokenizer" in capsys.readouterr().err
    bundle = load_bundle(tmp_path / "b", target_pin=pin)
    assert bundle.ranked("vi").meta["built_with_tokenizer_sha256"] == "f" * 64
    assert bundle.ranked("vi").meta["tokenizer_sha256"] == pin["tokenizer_sha256"]
    other_ids = {**pin, "vocab_sha256": "0" * 64}
    # another id table stays refused
    with pytest.raises(PolyspecError, match="another target tokenizer"):
        write_bundle(tmp_path / "c", moved, ["vi", "de"], other_ids, [64])


def test_interrupted_export_leaves_no_half_bundle(tmp_path, trained):
    from export.bundle import write_bundle

    run_dir, target = trained
    broken = tmp_path / "run"
    shutil.copytree(run_dir, broken)
    shutil.rmtree(broken / "train" / "de" / "final")  # the second language fails mid-export
    with pytest.raises(PolyspecError, match="drafter of 'de'"):
        write_bundle(tmp_path / "bundle", broken, ["vi", "de"], target.pin(), [64])
    assert not (tmp_path / "bundle").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bundle")]


def test_cli_writes_and_checks(tmp_path, trained, tiny_llama_dir):
    run_dir, _ = trained
    out = tmp_path / "bundle"
    proc = export_cli(run_dir, tiny_llama_dir, out, "vi,de", "64,128")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["languages"] == ["vi", "de"]
    ok = run_cli("-m", "export", "--check", str(out), "--target", str(tiny_llama_dir))
    assert ok.returncode == 0 and ok.stdout.startswith("ok:")
    (out / "README.md").write_text("edited")
    bad = run_cli("-m", "export", "--check", str(out), "--target", str(tiny_llama_dir))
    assert bad.returncode == 2 and "checksum" in bad.stderr and bad.stderr.count("\n") == 1


# ------------------------------------------------------------------------------------------ interop


def test_hf_assistant_export_works_with_transformers_assisted_generation(tmp_path, trained):
    from transformers import AutoModelForCausalLM

    from conftest import make_tiny_bundle
    from export.interop import write_hf_assistant

    _, target = trained
    ids = torch.tensor([target.tokenizer("Xin chào, hôm nay")["input_ids"]])
    ref = target.model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=0)
    # what training writes (tied, 1 layer), and a near-copy of the target
    for kind in ("small-lm", "oracle"):
        bundle = make_tiny_bundle(tmp_path / f"b-{kind}", target, drafter=kind, noise=0.05)
        from export.bundle import load_bundle

        folders = write_hf_assistant(load_bundle(bundle), target, tmp_path / f"hf-{kind}")
        assert [f.name for f in folders] == ["vi", "de"]
        assert (folders[0] / "model.safetensors").is_file() and (
            folders[0] / "tokenizer.json"
        ).is_file()
        assistant = AutoModelForCausalLM.from_pretrained(folders[0])
        assert assistant.config.vocab_size == target.vocab_size
        out = target.model.generate(
            ids, max_new_tokens=24, do_sample=False, pad_token_id=0, assistant_model=assistant
        )
        assert out.tolist() == ref.tolist()


def test_hf_assistant_refuses_eagle_bundles(tmp_path, trained):
    from export.bundle import write_bundle
    from export.interop import write_hf_assistant

    run_dir, target = trained
    b = write_bundle(tmp_path / "b", run_dir, ["vi"], target.pin(), [64])
    with pytest.raises(PolyspecError, match="needs small-LM drafters"):
        write_hf_assistant(b, target, tmp_path / "out")


@pytest.fixture(scope="module")
def eagle3_bundle(tmp_path_factory, trained, tiny_llama_dir):
    from export.bundle import write_bundle

    run_dir, target = trained
    run3 = tmp_path_factory.mktemp("run-eagle3")
    shutil.copytree(run_dir / "synth", run3 / "synth")
    shutil.copytree(run_dir / "vocab", run3 / "vocab")
    export_train(
        run3, tiny_llama_dir, "lang=vi", "stage=finetune", "eagle.arch=eagle3", "finetune.steps=2"
    )
    return write_bundle(
        tmp_path_factory.mktemp("b3") / "bundle", run3, ["vi"], target.pin(), [64, 128]
    )


SPECULATORS_LAYER_KEYS = {
    f"layers.0.{k}.weight"
    for k in (
        "input_layernorm",
        "hidden_norm",
        "post_attention_layernorm",
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    )
}


def test_speculators_export_file_contract_and_exact_mapping(
    tmp_path, trained, eagle3_bundle, tiny_llama_dir
):
    from safetensors.torch import load_file, save_file

    from export.interop import check_speculators, speculators_tensors, write_speculators
    from polyspec.drafter_models import Eagle3Drafter, load_drafter

    _, target = trained
    (folder,) = write_speculators(eagle3_bundle, target, tmp_path / "spec", speculative_tokens=4)
    cfg = check_speculators(folder, target.vocab_size)
    mine, _ = load_drafter(eagle3_bundle.drafter_dir("vi"))
    H, hd = mine.hidden_size, mine.self_attn.head_dim
    # config.json: the fields speculators' Eagle3SpeculatorConfig and vLLM read
    assert cfg["speculators_model_type"] == "eagle3" and cfg["speculators_version"] == "0.9.0"
    assert cfg["draft_vocab_size"] == 128 and cfg["target_hidden_size"] == target.hidden_size
    # residual = fc output before hidden_norm (vLLM's default is true)
    assert cfg["norm_before_residual"] is False
    assert cfg["eagle_aux_hidden_state_layer_ids"] == mine.aux_layers
    layer = cfg["transformer_layer_config"]
    assert (
        layer["model_type"] == "llama"
        and layer["vocab_size"] == target.vocab_size
        and layer["head_dim"] == hd
    )
    assert layer["num_hidden_layers"] == 1 and not any(
        k.startswith("_attn_implementation") for k in layer
    )
    spec = cfg["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"] == [
        {
            "proposal_type": "greedy",
            "speculative_tokens": 4,
            "verifier_accept_k": 1,
            "accept_tolerance": 0.0,
        }
    ]
    assert spec["verifier"] == {
        "name_or_path": str(tiny_llama_dir.resolve()),
        "architectures": ["LlamaForCausalLM"],
    }
    # model.safetensors: exactly speculators' Eagle3DraftModel names and shapes
    state = load_file(str(folder / "model.safetensors"))
    assert set(state) == {
        "fc.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
        *SPECULATORS_LAYER_KEYS,
    }
    assert state["fc.weight"].shape == (H, 3 * target.hidden_size) and state[
        "lm_head.weight"
    ].shape == (128, H)
    # attention reads [embed ‖ hidden]
    assert state["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * H
    # d2t/t2d: draft row j is target id j + d2t[j], the language's top-128 ranked ids, marked in t2d
    assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool
    assert torch.equal(torch.arange(128) + state["d2t"], mine.draft_ids)
    assert state["t2d"].shape == (target.vocab_size,)
    assert torch.equal(torch.nonzero(state["t2d"]).flatten(), mine.draft_ids.sort().values)
    # the exported tensors, renamed back, rebuild a drafter that computes the same logits
    back = Eagle3Drafter.from_arch(
        {
            "layer_config": mine.layer_config.to_dict(),
            "aux_layers": mine.aux_layers,
            "target_hidden_size": mine.target_hidden_size,
            "draft_vocab_size": 128,
        }
    )
    renamed = {k.removeprefix("layers.0."): v for k, v in state.items() if k not in ("d2t", "t2d")}
    back.load_state_dict({**renamed, "draft_ids": mine.draft_ids}, strict=True)
    emb, aux = torch.randn(1, 5, H), torch.randn(1, 5, 3 * H)
    with torch.no_grad():
        assert torch.allclose(
            back.logits(back(emb, aux)[0]), mine.logits(mine(emb, aux)[0]), atol=1e-6
        )
    # a draft vocabulary as large as the target's: no maps, head rows in target-id order
    full = Eagle3Drafter.for_target(target, torch.randperm(target.vocab_size))
    tensors = speculators_tensors(full, target.vocab_size)
    assert "d2t" not in tensors and "t2d" not in tensors
    assert torch.equal(tensors["lm_head.weight"][full.draft_ids], full.lm_head.weight)
    # a damaged export fails the structural check in one line
    save_file({k: v for k, v in state.items() if k != "d2t"}, str(folder / "model.safetensors"))
    with pytest.raises(PolyspecError, match="tensors missing"):
        check_speculators(folder, target.vocab_size)


@pytest.mark.parametrize("fmt", ["speculators", "vllm-eagle3"])
def test_speculators_refuses_eagle1_drafters_with_the_reason(
    tmp_path, trained, tiny_llama_dir, fmt
):
    run_dir, _ = trained
    out = tmp_path / "bundle"
    assert export_cli(run_dir, tiny_llama_dir, out, "vi", "64").returncode == 0
    r = run_cli(
        "-m",
        "export",
        "--format",
        fmt,
        "--bundle",
        str(out),
        "--target",
        str(tiny_llama_dir),
        "--out",
        str(tmp_path / "vllm"),
    )
    assert r.returncode == 2 and "EAGLE-1 form" in r.stderr and r.stderr.count("\n") == 1


def test_a_two_layer_eagle3_drafter_exports_its_layers_to_speculators_and_no_gguf(
    tmp_path, tiny_llama_dir
):
    """eagle.num_layers=2: the speculators folder carries the count (``num_hidden_layers``) and the
    second layer as speculators' ``Eagle3DraftModel`` and vLLM's multi-layer eagle3 name it
    (``layers.1.*``, an ordinary decoder layer: H input, no hidden_norm), which rename back into
    the same drafter; llama.cpp's eagle3 runs one layer, so its GGUF is refused in one line naming
    the option, and the engines export writes none and says why."""
    from safetensors.torch import load_file, save_file

    from conftest import make_tiny_bundle
    from export.bundle import load_bundle
    from export.engines import write_engine_exports
    from export.gguf import LlamaCpp, convert, eagle3_layers_unsupported
    from export.interop import check_speculators, write_speculators
    from polyspec.drafter_models import Eagle3Drafter, load_drafter

    target = load_target(str(tiny_llama_dir))
    root = make_tiny_bundle(
        tmp_path / "bundle", target, langs=("vi",), drafter="eagle3", sizes=(64,), num_layers=2
    )
    bundle = load_bundle(root, target_pin=target.pin())
    (folder,) = write_speculators(bundle, target, tmp_path / "spec")
    cfg = check_speculators(folder, target.vocab_size)
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 2
    mine, _ = load_drafter(bundle.drafter_dir("vi"))
    H = mine.hidden_size
    state = load_file(str(folder / "model.safetensors"))
    assert {k for k in state if k.startswith("layers.0.")} == SPECULATORS_LAYER_KEYS
    assert {k for k in state if k.startswith("layers.1.")} == {
        k.replace("layers.0.", "layers.1.")
        for k in SPECULATORS_LAYER_KEYS
        if "hidden_norm" not in k
    }
    assert state["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * H
    assert state["layers.1.self_attn.q_proj.weight"].shape[1] == H
    back = Eagle3Drafter.from_arch(
        {**mine.arch(), "num_layers": cfg["transformer_layer_config"]["num_hidden_layers"]}
    )
    renamed = {k.removeprefix("layers.0."): v for k, v in state.items() if k not in ("d2t", "t2d")}
    back.load_state_dict({**renamed, "draft_ids": mine.draft_ids}, strict=True)
    emb, aux = torch.randn(1, 5, H), torch.randn(1, 5, 3 * H)
    with torch.no_grad():
        assert torch.equal(back.logits(back(emb, aux)[0]), mine.logits(mine(emb, aux)[0]))
    # llama.cpp: one layer only (src/models/eagle3.cpp asserts n_layer == 1)
    why = eagle3_layers_unsupported(folder)
    assert "eagle.num_layers=2" in why and "\n" not in why
    with pytest.raises(PolyspecError, match="eagle.num_layers=2"):
        convert(
            LlamaCpp(tmp_path, tmp_path, tmp_path),
            folder,
            tmp_path / "d.gguf",
            "f32",
            tiny_llama_dir,
        )
    one = tmp_path / "one"
    one.mkdir()
    cfg["transformer_layer_config"]["num_hidden_layers"] = 1
    (one / "config.json").write_text(json.dumps(cfg))
    assert eagle3_layers_unsupported(one) is None
    record = write_engine_exports(
        tmp_path / "bundle-run",
        ["vi"],
        target,
        tmp_path / "engines",
        sizes=[64],
        gguf=lambda *a: pytest.fail("a two-layer drafter has no GGUF"),
    )
    assert record["drafters"]["vi"]["gguf"] is None
    assert record["engines"]["llama.cpp"]["loads"] == []
    assert "eagle.num_layers=2" in record["engines"]["llama.cpp"]["why"]
    assert record["engines"]["vllm"]["loads"] == ["vi"]
    # a second layer missing from the export fails the structural check
    save_file(
        {k: v for k, v in state.items() if k != "layers.1.mlp.up_proj.weight"},
        str(folder / "model.safetensors"),
    )
    with pytest.raises(PolyspecError, match="layers.1.mlp.up_proj"):
        check_speculators(folder, target.vocab_size)


@pytest.mark.integration
@pytest.mark.slow
def test_make_check_speculators_loads_exports_with_speculators_and_fails_on_a_wrong_one(
    tmp_path, tiny_llama_dir
):
    """`make check-speculators` on a tiny EAGLE-3 bundle: builds the engines environment .venv-vllm
    once unless .ci/run did (make setup-vllm, ~2 min), exports both languages, loads each with
    speculators' own Eagle3DraftModel and compares its logits with polyspec's drafter (measured
    ~40 s). Then the same check fails on an export whose norm_before_residual is flipped (vLLM's
    default when the flag is missing): the flag changes the model."""
    import re
    import subprocess

    from conftest import REPO, make_tiny_bundle, run_cli

    target = load_target(str(tiny_llama_dir), device="cpu")
    bundle = make_tiny_bundle(
        tmp_path / "bundle", target, langs=("vi", "de"), drafter="eagle3", sizes=(64, 256)
    )
    r = run_cli("make", "check-speculators", f"BUNDLE={bundle}", f"TARGET={tiny_llama_dir}")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    ok = [
        ln
        for ln in r.stdout.splitlines()
        if re.match(r"(vi|de): ok — max \|Δlogit\| = \S+ \(tol 0.001\)", ln)
    ]
    assert len(ok) == 2, r.stdout[-3000:]
    cfg_file = tmp_path / "speculators" / "vi" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["norm_before_residual"] = True
    cfg_file.write_text(json.dumps(cfg))
    r = subprocess.run(
        [
            str(REPO / ".venv-vllm" / "bin" / "python"),
            "-m",
            "engines.speculators",
            "--exported",
            str(tmp_path / "speculators"),
            "--reference",
            str(tmp_path / "speculators-reference"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 1 and re.search(r"^vi: FAIL — max \|Δlogit\|", r.stdout, re.M), r.stdout[
        -3000:
    ]
    assert re.search(r"^de: ok", r.stdout, re.M)
