"""Drafters engines load: the EAGLE-3 track (multilingual pretrain with one interleaved draft
vocabulary, per-language finetunes that re-head it), ``python -m export engines``, and every profile
shipping an engine-loadable drafter."""

import json

import numpy as np
import pytest
import torch

from conftest import export_train, export_vocab, prepare_run
from polyspec.errors import PolyspecError
from polyspec.targets import load_target


def test_interleave_ranked_keeps_every_languages_top_ids():
    from vocab.files import interleave_ranked

    a, b = np.array([1, 2, 3, 4, 5, 6]), np.array([2, 7, 8, 1, 9, 10])
    got = interleave_ranked([a, b], 6)
    assert got.tolist() == [1, 2, 7, 3, 8, 4]  # rank by rank, first occurrence kept
    assert set(a[:3]) <= set(got) and set(b[:3]) <= set(got)
    assert interleave_ranked([a], 4).tolist() == [1, 2, 3, 4]  # one language: its own list
    with pytest.raises(PolyspecError):
        interleave_ranked([a[:2], b[:1]], 5)


def test_rehead_moves_shared_rows_and_takes_new_ones_from_the_target():
    from transformers import LlamaConfig

    from polyspec.drafter_models import Eagle3Drafter

    cfg = LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=50,
    )
    m = Eagle3Drafter(cfg, 16, [1, 2, 3], 5)
    with torch.no_grad():
        m.draft_ids.copy_(torch.tensor([3, 4, 5, 6, 7]))
        m.lm_head.weight.copy_(torch.arange(5.0)[:, None].repeat(1, 16))
    head = -torch.arange(50.0)[:, None].repeat(1, 16)
    kept = m.rehead(torch.tensor([7, 3, 10, 11]), head)
    assert kept == 2 and m.draft_ids.tolist() == [7, 3, 10, 11] and m.draft_vocab_size == 4
    assert m.lm_head.weight[:, 0].tolist() == [4.0, 0.0, -10.0, -11.0]
    assert "draft_ids" in dict(m.named_buffers())  # still saved with the weights


@pytest.fixture(scope="module")
def eagle3_run(tmp_path_factory, tiny_llama_dir):
    """vi + de: an EAGLE-3 multilingual pretrain (interleaved draft vocabulary) and two finetunes
    from it, written under train-eagle3/ as a profile's engine track does."""
    run_dir = tmp_path_factory.mktemp("run-engines")
    for lang in ("vi", "de"):
        prepare_run(run_dir, tiny_llama_dir, lang)
    export_vocab(run_dir, tiny_llama_dir)
    common = ["train_dir=train-eagle3", "eagle.arch=eagle3", "eagle.ttt_steps=2"]
    pre = [
        f"data.pretrain=[{run_dir}/synth/vi/data.jsonl,{run_dir}/synth/de/data.jsonl]",
        "eagle.vocab_langs=[vi,de]",
    ]
    export_train(
        run_dir, tiny_llama_dir, *common, *pre, "lang=vi", "stage=pretrain", "pretrain.steps=2"
    )
    for lang in ("vi", "de"):
        export_train(
            run_dir,
            tiny_llama_dir,
            *common,
            f"lang={lang}",
            "stage=finetune",
            "finetune.steps=2",
            f"init_from={run_dir}/train-eagle3/vi/pretrain/final",
        )
    return run_dir, load_target(str(tiny_llama_dir))


@pytest.mark.slow
def test_engine_track_trains_a_multilingual_pretrain_and_reheaded_finetunes(eagle3_run):
    from polyspec.drafter_models import load_drafter
    from vocab.files import interleave_ranked, load_ranked

    run_dir, _ = eagle3_run
    assert not (run_dir / "train").exists()  # the track writes its own folder only
    multi, meta = load_drafter(run_dir / "train-eagle3" / "vi" / "pretrain" / "final")
    ranked = {
        lang: load_ranked(run_dir / "vocab" / f"{lang}.safetensors").top(128)
        for lang in ("vi", "de")
    }
    assert multi.draft_ids.tolist() == interleave_ranked([ranked["vi"], ranked["de"]], 128).tolist()
    assert meta["vocab"]["langs"] == ["vi", "de"]
    for lang in ("vi", "de"):
        own, _ = load_drafter(run_dir / "train-eagle3" / lang / "final")
        assert own.arch_name == "eagle3" and own.draft_ids.tolist() == ranked[lang].tolist()


@pytest.mark.slow
def test_export_engines_writes_speculators_folders_the_multilingual_drafter_and_engines_json(
    tmp_path, eagle3_run
):
    from export.bundle import load_bundle
    from export.engines import describe, write_engine_exports
    from export.interop import check_speculators

    run_dir, target = eagle3_run
    out = tmp_path / "engines"
    rec = write_engine_exports(
        run_dir, ["vi", "de"], target, out, train_dir="train-eagle3", sizes=[64, 128]
    )
    assert set(rec["drafters"]) == {"vi", "de", "multilingual"}
    for d in rec["drafters"].values():
        cfg = check_speculators(out / d["speculators"], target.vocab_size)
        assert (
            cfg["speculators_model_type"] == "eagle3"
            and d["aux_layers"] == cfg["eagle_aux_hidden_state_layer_ids"]
        )
        assert d["heldout_tau"] is not None and d["heldout_tau"] >= 1.0
    assert rec["drafters"]["multilingual"]["languages"] == ["vi", "de"]
    assert rec["drafters"]["multilingual"]["polyspec"] is None and rec["drafters"]["vi"]["polyspec"]
    assert rec["engines"]["vllm"]["loads"] == ["de", "multilingual", "vi"]
    assert rec["engines"]["llama.cpp"]["loads"] == [] and rec["engines"]["llama.cpp"]["why"]
    assert json.loads((out / "engines.json").read_text()) == rec
    b = load_bundle(out / "bundle", target_pin=target.pin())
    assert b.languages == ["vi", "de"]
    lines = describe(out)
    assert any(line.startswith("vllm: de, multilingual, vi") for line in lines)
    assert any(line.startswith("llama.cpp: nothing") for line in lines)


@pytest.mark.slow
def test_export_engines_runs_gguf_conversion_for_every_drafter(tmp_path, eagle3_run):
    from export.engines import write_engine_exports

    run_dir, target = eagle3_run
    seen = []

    # the converter's contract: one speculators folder → one GGUF file
    def fake_convert(folder, path):
        seen.append(folder.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"GGUF")

    rec = write_engine_exports(
        run_dir,
        ["vi", "de"],
        target,
        tmp_path / "e",
        train_dir="train-eagle3",
        sizes=[64, 128],
        gguf=fake_convert,
    )
    assert sorted(seen) == ["de", "multilingual", "vi"]
    assert rec["drafters"]["vi"]["gguf"] == "gguf/vi.gguf" and rec["engines"]["llama.cpp"]["loads"]


def test_export_engines_refuses_eagle1_drafters(tmp_path, tiny_llama_dir):
    from conftest import make_tiny_bundle
    from export.engines import write_engine_exports

    target = load_target(str(tiny_llama_dir))
    make_tiny_bundle(tmp_path / "b", target, langs=("vi",), drafter="eagle")
    with pytest.raises(PolyspecError, match="EAGLE-1"):
        write_engine_exports(tmp_path / "b-run", ["vi"], target, tmp_path / "e", sizes=[64, 256])


@pytest.mark.parametrize("profile", ["cpu-demo", "cpu-full", "cpu-chat", "gpu-paper"])
def test_every_profile_exports_a_drafter_engines_load(tmp_path, profile):
    from pipelines.__main__ import load_profile
    from pipelines.plan import build_plan, engine_drafters, is_eagle3, repo_path

    p = load_profile(profile)
    recipe = engine_drafters(p)
    assert recipe is not None and is_eagle3(repo_path(recipe))
    stages = {s.name: s for s in build_plan(p, p.langs[:2], p.target, tmp_path / "run")}
    eng = stages["export:engines"]
    assert eng.cmd[eng.cmd.index("-m") + 1 :][:2] == ["export", "engines"]
    tdir = eng.cmd[eng.cmd.index("--train-dir") + 1]
    # the EAGLE-3 track's pretrain and finetunes write where the export reads
    for dep in eng.deps[:-1]:
        cmd = stages[dep].cmd
        assert f"configs/train/{recipe.split('/')[-1]}" in cmd[cmd.index("--config") + 1]
        assert (f"train_dir={tdir}" in cmd) == (tdir != "train")
    pre = stages[eng.deps[0]].cmd
    # one draft vocabulary for every language
    assert f"eagle.vocab_langs=[{','.join(p.langs[:2])}]" in pre
    # the three layers EAGLE-3 reads are captured while distilling
    if p.distill.mode == "on-policy":
        assert "feature_layers=eagle3" in stages[f"distill:{p.langs[0]}"].cmd


def test_a_profile_without_engine_drafters_is_refused(tmp_path):
    from pipelines.__main__ import load_profile
    from pipelines.plan import build_plan, validate_plan

    p = load_profile("cpu-demo")
    p.train.engine = None  # the hinted EAGLE-1 drafters alone: no engine loads them
    stages = build_plan(p, ["vi"], p.target, tmp_path / "run")
    with pytest.raises(PolyspecError, match="no drafter an engine loads"):
        validate_plan(stages, p, p.target, ["vi"])


def test_gpu_paper_dry_run_shows_an_eagle3_recipe(tmp_path):
    from conftest import run_cli

    r = run_cli(
        "-m",
        "pipelines",
        "run",
        "--profile",
        "gpu-paper",
        "--langs",
        "vi,de",
        "--dry-run",
        "--run",
        str(tmp_path / "run"),
    )
    assert r.returncode == 0, r.stderr
    assert "engine drafters (EAGLE-3): configs/train/eagle-gpu.yaml" in r.stdout
    assert "train3:" not in r.stdout  # its own drafters are the engines' drafters


@pytest.mark.parametrize("num_layers", [1, 2])
def test_training_time_test_sees_what_the_decoders_later_drafts_see(num_layers):
    """EAGLE-3's training-time test: step i's output at entry t equals the decoder's (i+1)-th draft
    after the verified prefix x[..t+1] — a cache of the true-feature entries 0..t, then the chain's
    own entries one at a time (``eagle.num_layers`` 2: every layer's cache alike)."""
    from transformers import DynamicCache, LlamaConfig

    from polyspec.drafter_models import Eagle3Drafter
    from train.objectives import ttt_mask

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        vocab_size=50,
    )
    m = Eagle3Drafter(cfg, 16, [1, 2, 3], 20, num_layers=num_layers).eval()
    T, B = 7, 2
    emb, g = torch.randn(B, T, 16), torch.randn(B, T - 1, 48)
    with torch.no_grad():
        cache, lengths, preds, inp = DynamicCache(), [], [], g
        for i in range(3):  # the loss's unrolled steps
            L = T - 1 - i
            mask = ttt_mask(lengths, L, B, emb.dtype, emb.device) if lengths else None
            pred, cache = m(
                emb[:, 1 + i :],
                inp[:, :L],
                position_ids=torch.arange(1 + i, T)[None].expand(B, -1),
                attention_mask=mask,
                past_key_values=cache,
                use_cache=True,
            )
            preds.append(pred)
            lengths.append(L)
            inp = pred
        for t in range(T - 3):  # the decoder: prefix entries, then draft after draft
            _, c = m(
                emb[:, 1 : t + 2],
                g[:, : t + 1],
                position_ids=torch.arange(1, t + 2)[None].expand(B, -1),
                use_cache=True,
            )
            h = preds[0][:, t : t + 1]
            for i in (1, 2):
                h, c = m(
                    emb[:, t + 1 + i : t + 2 + i],
                    h,
                    position_ids=torch.tensor([[t + 1 + i]]).expand(B, -1),
                    past_key_values=c,
                    use_cache=True,
                )
                assert torch.allclose(h[:, 0], preds[i][:, t], atol=1e-5), (t, i)


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("ttt_steps", [1, 2, 3])
def test_packed_steps_give_the_loss_and_gradients_of_running_every_entry(ttt_steps, num_layers):
    """EAGLE-3 training runs only the entries the loss reads (step 0's other entries give keys and
    values only): the loss, its metrics and every gradient equal those of running all entries
    (``packed=False``), on a batch with prompt rows, answers of different lengths and padding; and
    the packed run computes fewer rows (``eagle.num_layers`` 2: the last layer's MLP; the first
    layer runs every step-0 entry, whose outputs the second layer's keys read)."""
    from types import SimpleNamespace

    from transformers import LlamaConfig

    from polyspec.drafter_models import Eagle3Drafter
    from train.objectives import eagle_loss

    torch.manual_seed(0)
    H, s = 16, 20
    cfg = LlamaConfig(
        hidden_size=H,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        vocab_size=50,
    )
    m = Eagle3Drafter(cfg, H, [1, 2, 3], s, num_layers=num_layers)
    embed = torch.nn.Embedding(50, H)
    head_w = torch.randn(s, H)
    B, T = 3, 12
    ids = torch.randint(0, 50, (B, T))
    loss_mask = torch.zeros(B, T)
    loss_mask[0, 4:12] = 1  # prompt 0..3, answer to the end
    loss_mask[1, 7:10] = 1  # a short answer, then padding
    loss_mask[2, 2:6] = 1
    loss_mask[2, 8:11] = 0.5  # a second turn, weighted
    batch = {"input_ids": ids, "loss_mask": loss_mask}
    f, aux = torch.randn(B, T, H), torch.randn(B, T, 3 * H)
    ecfg = SimpleNamespace(
        ttt_steps=ttt_steps,
        feature_noise=0.0,
        ttt_decay=0.8,
        feature_loss_weight=1.0,
        token_loss_weight=0.1,
    )
    rows_run = []
    last = m.layers[str(num_layers - 1)] if num_layers > 1 else m
    hook = last.mlp.register_forward_hook(
        lambda mod, inp, out: rows_run.append(inp[0].shape[0] * inp[0].shape[1])
    )
    results = {}
    for packed in (False, True):
        m.zero_grad()
        rows_run.clear()
        loss, metrics = eagle_loss(m, embed, head_w, batch, f, ecfg, aux=aux, packed=packed)
        loss.backward()
        results[packed] = (
            loss.detach(),
            metrics,
            {n: p.grad.clone() for n, p in m.named_parameters()},
            sum(rows_run),
        )
    hook.remove()
    (l0, m0, g0, r0), (l1, m1, g1, r1) = results[False], results[True]
    assert l1.item() == pytest.approx(l0.item(), rel=1e-5) and l0.item() > 0
    assert m1 == pytest.approx(m0, rel=1e-5, abs=1e-6)
    for n in g0:
        assert torch.allclose(g1[n], g0[n], rtol=1e-4, atol=1e-6), n
    assert r1 < r0, (r1, r0)  # the MLP ran on fewer rows


def test_the_vllm_line_of_a_gemma3_target_names_the_plugin_it_needs(tmp_path):
    """vLLM 0.32 serves EAGLE-3 for Gemma-3 only through polyspec's plugin: the engines table says
    so (and still lists the drafters); a Llama target needs nothing."""
    from export.engines import PLUGIN_INSTALL, engine_table

    drafters = {"vi": {"polyspec": True}, "multilingual": {"polyspec": False}}
    gemma = engine_table(tmp_path, drafters, "/t", 3, gguf=False, architecture="Gemma3ForCausalLM")
    assert gemma["vllm"]["loads"] == ["multilingual", "vi"]
    assert gemma["vllm"]["needs"]["plugin"] == PLUGIN_INSTALL
    assert "SupportsEagle3" in gemma["vllm"]["needs"]["why"]
    llama = engine_table(tmp_path, drafters, "/t", 3, gguf=False, architecture="LlamaForCausalLM")
    assert "needs" not in llama["vllm"]
