"""train/: drafters on tiny targets — shapes, losses, online = offline features, resume after
kill -9, DDP on CPU, bad input."""

import json
import shutil
import signal
import time

import pytest
import torch

from conftest import REPO, drafter_argv, prepare_run, run_cli, tcfg
from polyspec.config import apply_overrides, validate
from polyspec.drafter_models import (
    EagleDrafter,
    eagle_layer_config,
    load_drafter,
    project_embedding,
)
from polyspec.errors import PolyspecError
from polyspec.targets import load_target
from train.config import TrainConfig
from train.drafter import DrafterRecipe, run
from train.objectives import target_features
from train.score import summarize, walk


@pytest.fixture(scope="module")
def gemma_run(tmp_path_factory, tiny_gemma_dir):
    return prepare_run(tmp_path_factory.mktemp("run-gemma"), tiny_gemma_dir)


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory, tiny_llama_dir):
    return prepare_run(tmp_path_factory.mktemp("run-llama"), tiny_llama_dir)


def finetune(run_dir, target_dir, *overrides: str) -> list[dict]:
    """``run`` of the tiny config's (``tcfg``) finetune stage with ``overrides``."""
    return run(tcfg(run_dir, target_dir, "stage=finetune", *overrides))


# a two-step finetune that checkpoints at its end and evaluates never
TWO_STEPS = ("finetune.steps=2", "checkpoint_every=2", "eval_every=100")


# ------------------------------------------------------------------------------------------ models


@pytest.mark.parametrize("family,layers", [("gemma3", 1), ("llama", 1), ("gemma3", 2)])
def test_eagle_layers_are_layers_of_the_target_family(
    family, layers, tiny_gemma_dir, tiny_llama_dir, tmp_path
):
    t = load_target(str(tiny_gemma_dir if family == "gemma3" else tiny_llama_dir))
    d = EagleDrafter(eagle_layer_config(t.model.config, layers))
    assert type(d.layer).__name__.startswith("Gemma3" if family == "gemma3" else "Llama")
    assert len(d.layer.layers) == layers and d.hidden_size == t.hidden_size
    assert set(getattr(d.layer_config, "layer_types", None) or ["full_attention"]) == {
        "full_attention"
    }
    x = torch.randn(2, 5, t.hidden_size)
    out, _ = d(x, x)
    assert out.shape == (2, 5, t.hidden_size)
    from polyspec.drafter_models import save_drafter

    save_drafter(tmp_path / "d", d, {"target": t.pin()})
    back, meta = load_drafter(tmp_path / "d")
    assert meta["drafter_type"] == "eagle"
    torch.testing.assert_close(back(x, x)[0], d.eval()(x, x)[0])
    # the frozen target embedding/head are not stored with the drafter
    from safetensors.torch import load_file

    assert all(
        v.numel() < t.vocab_size * t.hidden_size
        for v in load_file(tmp_path / "d" / "model.safetensors").values()
    )


def test_eagle_num_layers_is_refused_where_it_does_not_apply(tmp_path):
    assert tcfg(tmp_path, "t", "eagle.num_layers=2").eagle.num_layers == 2
    # EAGLE-3 stacks layers too (speculators' / vLLM's multi-layer eagle3)
    assert tcfg(tmp_path, "t", "eagle.num_layers=2", "eagle.arch=eagle3").eagle.num_layers == 2
    for arch in ("eagle1", "eagle3"):
        with pytest.raises(PolyspecError, match="copies one target layer"):
            tcfg(
                tmp_path, "t", "eagle.num_layers=2", "eagle.init_layer=target", f"eagle.arch={arch}"
            )
    with pytest.raises(PolyspecError, match="num_layers"):
        tcfg(tmp_path, "t", "eagle.num_layers=0", "eagle.arch=eagle3")
    assert tcfg(tmp_path, "t", "eagle.lookup_hint=true").eagle.lookup_hint
    with pytest.raises(PolyspecError, match="lookup_hint is an EAGLE-1 option"):
        tcfg(tmp_path, "t", "eagle.lookup_hint=true", "eagle.arch=eagle3")


@pytest.mark.parametrize("family", ["gemma3", "llama"])
def test_eagle_layer_copied_from_the_target_computes_its_layer(
    family, tiny_gemma_dir, tiny_llama_dir
):
    """eagle.init_layer=target: the drafter's layer + norm are the target's last full-attention
    layer + final norm, so on that layer's input they give exactly the target's own output there."""
    import copy

    from polyspec.drafter_models import copy_target_layer

    t = load_target(str(tiny_gemma_dir if family == "gemma3" else tiny_llama_dir))
    model = t.model
    # the tiny Gemma's layers are all sliding: the fallback is its last layer
    if family == "gemma3":
        assert set(model.config.layer_types) == {"sliding_attention"}
        assert (
            copy_target_layer(EagleDrafter(eagle_layer_config(model.config)), model)
            == len(model.config.layer_types) - 1
        )
        # Gemma-3-270m's pattern: sliding layers, then a full-attention one
        cfg = copy.deepcopy(model.config)
        cfg.layer_types = ["sliding_attention"] * (len(cfg.layer_types) - 1) + ["full_attention"]
        torch.manual_seed(0)
        model = type(model)(cfg).eval()
    d = EagleDrafter(eagle_layer_config(model.config)).eval()
    base = model.get_decoder()
    ids = torch.randint(0, t.vocab_size, (2, 7))
    with torch.no_grad():
        o = base(input_ids=ids, output_hidden_states=True)
        hs = o.hidden_states  # hs[i]: the input of layer i
        before = d.layer(inputs_embeds=hs[0]).last_hidden_state
        idx = copy_target_layer(d, model)
        out = d.layer(inputs_embeds=hs[idx]).last_hidden_state
        want = o.last_hidden_state if idx + 1 == len(base.layers) else base.norm(hs[idx + 1])
        after = d.layer(inputs_embeds=hs[0]).last_hidden_state
    assert idx == len(base.layers) - 1
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(after, before)  # the weights did change


def test_missing_weights_fail_loudly(tmp_path, tiny_llama_dir):
    t = load_target(str(tiny_llama_dir))
    from polyspec.drafter_models import save_drafter

    save_drafter(tmp_path / "d", EagleDrafter(eagle_layer_config(t.model.config)), {})
    from safetensors.torch import load_file, save_file

    state = load_file(tmp_path / "d" / "model.safetensors")
    state.pop("fc.bias")
    save_file(state, tmp_path / "d" / "model.safetensors")
    with pytest.raises(PolyspecError, match="missing"):
        load_drafter(tmp_path / "d")


def test_pca_projection_keeps_the_top_directions():
    torch.manual_seed(0)
    w = torch.randn(500, 3) @ torch.diag(torch.tensor([10.0, 1.0, 0.1]))
    p = project_embedding(w, 1, init_std=1.0)
    assert abs(torch.corrcoef(torch.stack([p[:, 0], w[:, 0]]))[0, 1]) > 0.99
    assert project_embedding(w, 5).shape == (500, 5)


def test_the_score_walks_the_decoders_chain_steps():
    # answer x[3..9] (n = 10, start = 3); the drafter proposes 3 tokens, right for the first
    # `right[p]` of them
    right = {3: 2, 6: 0, 7: 3}
    acc = walk(10, 3, 3, lambda p: [i < right[p] for i in range(3)])
    # p 3 → 6 (2 drafts + the target's token), 6 → 7, 7 → 9: only x[8] was left to accept
    assert acc == [2, 0, 1]
    m = summarize([(7, acc)], 3)
    # prefill + 3 verify forwards for 7 tokens
    assert m["tau"] == pytest.approx(7 / 4) and m["steps"] == 3
    assert m["accept_len"] == pytest.approx(1.0) and m["alpha"] == [0.6667, 0.3333, 0.0]


@torch.no_grad()
def _recomputed_drafts(drafter, embed, head_w, ids_s, prefix, g_all, gamma) -> list[int]:
    """γ greedy drafts after the verified prefix x[..p], its drafter context recomputed from scratch
    (entries 1..p read [embed(x_e) ‖ g_{e-1}], then each draft feeds the next): slow, obviously
    right."""
    from polyspec.lookup import hint_inputs, lookup_hint
    from train.objectives import draft_logits

    # each entry's prompt-lookup hint, one prefix at a time (lookup_hint: the plain scan)
    def hints(prefixes):
        if not getattr(drafter, "lookup_hint", False):
            return {}
        got = [lookup_hint(q) for q in prefixes]
        return {
            "hints": hint_inputs(
                embed, torch.tensor([[a for a, _ in got]]), torch.tensor([[b for _, b in got]])
            )
        }

    x = prefix[0].tolist()
    p = prefix.shape[1] - 1
    pred, past = drafter(
        embed(prefix[:, 1:]),
        g_all[:, :p],
        position_ids=torch.arange(1, p + 1)[None],
        use_cache=True,
        **hints([x[: e + 1] for e in range(1, p + 1)]),
    )
    h, out = pred[:, -1:], []
    for i in range(gamma):
        d = ids_s[draft_logits(drafter, h[0, -1], head_w).argmax(-1)]
        out.append(int(d))
        if i < gamma - 1:
            h, past = drafter(
                embed(d.view(1, 1)),
                h,
                position_ids=torch.tensor([[p + 1 + i]]),
                past_key_values=past,
                use_cache=True,
                **hints([x + out]),
            )
    return out


@pytest.mark.parametrize(
    "arch", ["eagle1", "eagle1-2layers", "eagle1-hint", "eagle3", "eagle3-2layers"]
)
def test_the_one_pass_score_equals_the_chain_recomputed_step_by_step(arch, tiny_llama_dir):
    """train/score.py drafts every step's first token from one teacher-forced pass and continues
    from a copy of that pass's cache cut back to the step's prefix. A random drafter whose attention
    matters, walked over an answer written from its own recomputed drafts (every step accepts γ) and
    then over the same answer corrupted at random places (steps stop early), accepts exactly what
    recomputing each step's context from scratch does. eagle1-hint: the prompt-lookup hints of the
    one pass (``lookup_hints``) and of the continuation drafts are the ones the plain scan gives
    each prefix, and they matter (random hint weights, scaled up)."""
    from polyspec.drafter_models import Eagle3Drafter
    from train.score import eagle_chain

    t = load_target(str(tiny_llama_dir))
    torch.manual_seed(0)
    H, s, n, start, gamma = t.hidden_size, 64, 60, 6, 4
    ids_s = torch.arange(s)
    embed = torch.nn.Embedding(s, H)
    if arch.startswith("eagle1"):
        layers = 2 if arch.endswith("2layers") else 1
        drafter = EagleDrafter(
            eagle_layer_config(t.model.config, layers), lookup_hint=arch.endswith("hint")
        ).eval()
        head_w, g = torch.randn(s, H), torch.randn(1, n, H)
        if drafter.lookup_hint:
            with torch.no_grad():
                drafter.hint_fc.weight.mul_(8.0)
                drafter.hint_strength.weight.normal_(0, 4.0)
                drafter.hint_gate.weight.normal_(0, 2.0)  # the copy path past the layer too
    else:
        drafter, head_w, g = (
            Eagle3Drafter.for_target(
                t, ids_s, num_layers=2 if arch.endswith("2layers") else 1
            ).eval(),
            None,
            torch.randn(1, n, 3 * H),
        )
    # attention that matters: a draft then depends on every cached entry it reads
    with torch.no_grad():
        for name, m in drafter.named_modules():
            if name.endswith("self_attn"):
                for proj, scale in (
                    ("q_proj", 4.0),
                    ("k_proj", 4.0),
                    ("v_proj", 8.0),
                    ("o_proj", 8.0),
                ):
                    getattr(m, proj).weight.mul_(scale)
    x, p = torch.randint(0, s, (start + 1,)).tolist(), start
    while len(x) < n:  # each step: γ drafts the reference accepts, then "the target's own token"
        x += _recomputed_drafts(drafter, embed, head_w, ids_s, torch.tensor([x[: p + 1]]), g, gamma)
        x.append(int(torch.randint(0, s, ())))
        p += gamma + 1
    seq = torch.tensor([x[:n]])

    def reference(seq):
        def propose(p):
            d = _recomputed_drafts(drafter, embed, head_w, ids_s, seq[:, : p + 1], g, gamma)
            hits = []
            for i in range(gamma):
                if p + 2 + i >= n:
                    break
                hits.append(d[i] == int(seq[0, p + 1 + i]))
                if not hits[-1]:
                    break
            return hits

        return walk(n, start, gamma, propose)

    got = eagle_chain(drafter, embed, head_w, ids_s, seq, start, g, gamma)
    assert got == reference(seq)
    # the continuation drafts ran and hit (the last step is cut short)
    assert got.count(gamma) >= len(got) - 1, got
    for i in torch.randint(
        start + 1, n, (10,), generator=torch.Generator().manual_seed(1)
    ).tolist():
        seq[0, i] = (seq[0, i] + 1) % s
    got = eagle_chain(drafter, embed, head_w, ids_s, seq, start, g, gamma)
    assert got == reference(seq)
    assert 0 in got and gamma in got, got
    # the teacher-forced first draft at every answer position: the reference's one draft there
    hits = []
    eagle_chain(drafter, embed, head_w, ids_s, seq, start, g, gamma, first_hits=hits)
    ref = [
        _recomputed_drafts(drafter, embed, head_w, ids_s, seq[:, : p + 1], g, 1)[0]
        == int(seq[0, p + 1])
        for p in range(start, n - 1)
    ]
    assert hits == ref and any(hits) and not all(hits)


def test_length_grouped_batches_pad_less_see_every_example_and_resume_exactly():
    """data.group_by_length: each micro-batch pads to about its own length, yet every epoch still
    shows every example once, batch membership changes between epochs, and a resumed stream
    continues exactly."""
    import itertools
    import random

    from train.data import step_indices

    rng = random.Random(0)
    n, micro, accum, epochs = 401, 8, 2, 6  # n not a multiple of the step: steps straddle epochs
    lengths = [rng.randint(10, 300) for _ in range(n)]
    per_step = micro * accum
    steps = epochs * n // per_step

    def stream(grouped: bool, start: int = 0):
        return list(
            itertools.islice(
                step_indices(n, per_step, 0, start, lengths if grouped else None, micro),
                steps - start,
            )
        )

    def padded(stream_) -> int:
        micros = [s[i : i + micro] for s in stream_ for i in range(0, per_step, micro)]
        return sum(micro * max(lengths[i] for i in m) for m in micros)

    grouped, plain = stream(True), stream(False)
    flat = [i for s in grouped for i in s]
    for e in range(epochs - 1):  # every full epoch of the stream is a permutation
        assert sorted(flat[e * n : (e + 1) * n]) == list(range(n))
    assert padded(grouped) < 0.8 * padded(plain), (padded(grouped), padded(plain))
    micros = [frozenset(s[i : i + micro]) for s in grouped for i in range(0, per_step, micro)]
    per_epoch = n // micro
    same = set(micros[:per_epoch]) & set(micros[per_epoch + 1 : 2 * per_epoch])
    assert len(same) < per_epoch // 4, "which examples share a batch must change between epochs"
    assert stream(True, start=9) == grouped[9:]


def seeded_recipe(run_dir, target_dir, out: str, *overrides) -> tuple[DrafterRecipe, dict]:
    """A finetune recipe (no feature noise) whose drafter weights are drawn from seed 0, and its
    first batch."""
    r = DrafterRecipe(tcfg(run_dir, target_dir, "eagle.feature_noise=0", *overrides), "finetune")
    r.out = run_dir / out
    r.setup()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in r.model.parameters():
            p.copy_(torch.randn_like(p) * 0.02)
    return r, next(r.batches())


def test_online_and_offline_features_give_the_same_loss(gemma_run, tiny_gemma_dir):
    losses = []
    for mode in ("online", "offline"):
        r, batch = seeded_recipe(gemma_run, tiny_gemma_dir, f"train-{mode}", f"features={mode}")
        losses.append(r.loss(batch)[0].item())
        r.cleanup()
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)


def test_kept_target_distributions_give_the_recomputed_loss(gemma_run, tiny_gemma_dir, monkeypatch):
    """The target's distribution at an example's loss rows is computed the first time the example is
    seen and read back afterwards (no target-head GEMM for it in later epochs); loss and metrics
    equal recomputing it every step, and a memory bound that holds only some examples keeps the rest
    recomputed."""
    import train.objectives as obj

    computed = []
    real = obj.target_probs
    monkeypatch.setattr(
        obj, "target_probs", lambda rows, *a: (computed.append(rows.shape[0]), real(rows, *a))[1]
    )
    r, _ = seeded_recipe(gemma_run, tiny_gemma_dir, "train-probs")
    stream = r.batches()  # endless, epoch after epoch
    # two epochs
    batches = [next(stream) for _ in range(-(-2 * len(r.train_set) // r.cfg.optim.batch_size))]
    per_row = 2 * len(r.ids_s)  # fp16 bytes of one loss row
    for budget, name in ((1 << 40, "all"), (per_row * 40, "some"), (0, "none")):
        r.probs = obj.TargetProbs(r.head_w, r.softcap, budget)
        seen, late = set(), []
        for batch in batches:
            idx = batch["index"].tolist()
            computed.clear()
            loss, metrics = r.loss(batch)
            rows_now = sum(computed)  # target rows through the head for the kept path
            # the reference: eagle_loss computes its own targets
            r.probs, kept = (lambda *a: None), r.probs
            ref, ref_metrics = r.loss(batch)
            r.probs = kept
            assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
            assert metrics == pytest.approx(ref_metrics, rel=1e-6)
            if set(idx) <= seen:
                late.append(rows_now)
            seen |= set(idx)
        assert late, "some batch must hold only examples seen before"
        if name == "all":
            assert not any(late) and r.probs.bytes > 0
        elif name == "some":
            assert 0 < r.probs.bytes <= per_row * 40 and any(late)
        else:
            assert r.probs.bytes == 0 and all(late)


def test_rows_whose_target_argmax_lies_outside_the_draft_vocabulary_leave_the_token_loss(
    llama_run, tiny_llama_dir, monkeypatch
):
    """``eagle.mask_out_of_vocab``: the loss equals the unmasked one with those tokens taken out of
    the loss mask (every training-time-test step: step i's row t is step 0's row t + i, the same
    token), and ``in_vocab`` says which share stayed."""
    from accelerate.state import AcceleratorState

    from train.objectives import in_vocab_rows, loss_rows

    head = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])  # argmax of (a, b): 0, 1 or 2
    assert in_vocab_rows(
        torch.tensor([[2.0, 1.0], [0.0, 3.0], [-2.0, 1.0]]),
        head,
        torch.tensor([True, False, True]),
        chunk=2,
    ).tolist() == [True, False, True]
    AcceleratorState._reset_state(reset_partial_state=True)
    ov = ["eagle.arch=eagle3", "eagle.ttt_steps=2", "mixed_precision='no'"]
    r, batch = seeded_recipe(
        llama_run, tiny_llama_dir, "train-oov", *ov, "eagle.mask_out_of_vocab=true"
    )
    r.probs = None  # kept distributions are per example and mask: recomputed for both losses
    seen = []
    monkeypatch.setattr(
        "train.recipe.in_vocab_rows", lambda *a: seen.append(in_vocab_rows(*a)) or seen[-1]
    )
    loss, metrics = r.loss(batch)
    [keep] = seen
    assert metrics["in_vocab"] == pytest.approx(keep.float().mean().item())
    assert 0.0 < metrics["in_vocab"] < 1.0, (
        "the tiny target's argmax must leave its 128 draft ids at some rows"
    )
    m0 = loss_rows(batch["loss_mask"]).bool()
    drop = torch.zeros_like(m0)
    drop[m0] = ~keep
    ref_batch = dict(batch, loss_mask=batch["loss_mask"].clone())
    # step-0 row t reads token t + 2 (its last row reads none)
    ref_batch["loss_mask"][:, 2:][drop[:, :-1]] = 0
    r.in_draft = None
    ref, ref_metrics = r.loss(ref_batch)
    r.cleanup()
    AcceleratorState._reset_state(reset_partial_state=True)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-4)
    assert [metrics[k] for k in ("ce_0", "ce_1", "top1_0", "top1_1")] == pytest.approx(
        [ref_metrics[k] for k in ("ce_0", "ce_1", "top1_0", "top1_1")], rel=1e-4
    )


def test_padded_batches_and_bf16_autocast_keep_the_loss(gemma_run, tiny_gemma_dir, monkeypatch):
    """Batches rounded up to pad_to_multiple give the unpadded loss (the head reads loss rows only,
    so padding rows cannot count); the loss equals the full-head reference (every row through the
    head, then masked); bf16 autocast (what mixed_precision auto picks on a bf16-native CPU) stays
    within 2 % of fp32."""
    from accelerate.state import AcceleratorState

    from train.objectives import reduced_logits
    from train.recipe import resolve_mixed_precision

    losses = {}
    for name, ov in (
        ("fp32", ["data.pad_to_multiple=1"]),
        ("padded", ["data.pad_to_multiple=64"]),
        ("bf16", ["data.pad_to_multiple=64", "mixed_precision=bf16"]),
    ):
        # a process-wide singleton: one precision each
        AcceleratorState._reset_state(reset_partial_state=True)
        r, batch = seeded_recipe(gemma_run, tiny_gemma_dir, f"train-pad-{name}", *ov)
        assert batch["input_ids"].shape[1] % (64 if name != "fp32" else 1) == 0
        loss, metrics = r.loss(batch)
        losses[name] = loss.item()
        # the CE term the old way: all B x T rows through the head, masked afterwards
        if name == "fp32":
            f = target_features(r.target.model, batch["input_ids"], batch["attention_mask"])
            emb = r.embed(batch["input_ids"]).float()
            T = batch["input_ids"].shape[1]
            pred, _ = r.model(
                emb[:, 1:], f[:, : T - 1], position_ids=torch.arange(1, T).unsqueeze(0)
            )
            m = torch.zeros_like(batch["loss_mask"][:, : T - 1])
            m[:, : T - 2] = batch["loss_mask"][:, 2:]
            p_ = torch.softmax(reduced_logits(f[:, 1:], r.head_w, r.softcap).float(), -1)
            logq = torch.log_softmax(reduced_logits(pred, r.head_w, r.softcap).float(), -1)
            assert metrics["ce_0"] == pytest.approx(
                ((-(p_ * logq).sum(-1) * m).sum() / m.sum()).item(), rel=1e-4
            )
        r.cleanup()
    AcceleratorState._reset_state(reset_partial_state=True)
    assert losses["padded"] == pytest.approx(losses["fp32"], rel=1e-4)
    assert (
        losses["bf16"] == pytest.approx(losses["fp32"], rel=2e-2)
        and losses["bf16"] != losses["fp32"]
    )
    monkeypatch.delenv("POLYSPEC_DTYPE", raising=False)
    # a bf16-native device
    monkeypatch.setattr("train.recipe.resolve_dtype", lambda d, dev: torch.bfloat16)
    assert resolve_mixed_precision("auto") == "bf16" and resolve_mixed_precision("no") == "no"
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert resolve_mixed_precision("auto") == ("bf16" if torch.cuda.is_available() else "no")
    # `accelerate launch --cpu` on a CUDA machine: the step runs on the CPU, DeepSpeed there stays
    # fp32
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    assert resolve_mixed_precision("auto") == "no"


# ------------------------------------------------------------- the token loss (eagle.token_loss)


def tiny_loss_setup(H: int = 16, s: int = 12, V: int = 50, sharp: float = 1.0):
    """A tiny EAGLE-1 drafter (one Llama layer, weights from seed 0), a frozen embedding and head
    over s draft ids, and a batch of 3 sequences with prompt rows, a weighted second turn and
    padding: what :func:`train.objectives.eagle_loss` reads, without a target."""
    from transformers import LlamaConfig

    torch.manual_seed(0)
    layer = LlamaConfig(
        hidden_size=H,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        vocab_size=V,
    )
    drafter = EagleDrafter(eagle_layer_config(layer))
    embed = torch.nn.Embedding(V, H).requires_grad_(False)
    head_w = torch.randn(s, H) * sharp
    B, T = 3, 10
    ids = torch.randint(0, V, (B, T))
    loss_mask = torch.zeros(B, T)
    loss_mask[0, 3:] = 1  # a prompt, then the answer to the end
    loss_mask[1, 5:8] = 1  # a short answer, then padding
    loss_mask[2, 2:6] = 1
    loss_mask[2, 7:9] = 0.5  # a second turn, weighted
    f = torch.randn(B, T, H)
    return drafter, embed, head_w, {"input_ids": ids, "loss_mask": loss_mask}, f


def wmean(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w).sum() / w.sum()


def token_loss_by_hand(drafter, embed, head_w, batch, f, ecfg, keep0=None):
    """:func:`eagle_loss` of an EAGLE-1 drafter (no feature noise) recomputed over whole [B, L]
    tensors: every entry through the drafter and the head, the loss rows and the kept
    (in-vocabulary) rows picked by masks afterwards; step i's target at row t is the target's at
    token t+2+i. → (total, {ce_i, lk_i, accept_est_i})."""
    import torch.nn.functional as F

    ids, mask = batch["input_ids"], batch["loss_mask"]
    B, T = ids.shape
    emb = embed(ids).float()
    keep = torch.ones(B, T - 1)  # step 0's rows: whether their target argmax is a draft id
    m0 = torch.zeros(B, T - 1)
    m0[:, : T - 2] = mask[:, 2:]
    if keep0 is not None:
        keep[m0.bool()] = keep0.float()
    g, total, out = f[:, :-1], 0.0, {}
    for i in range(ecfg.ttt_steps):
        L = T - 1 - i
        pos = torch.arange(1 + i, T).unsqueeze(0).expand(B, -1)
        pred, _ = drafter(emb[:, 1 + i :], g[:, :L], position_ids=pos)
        m = torch.zeros(B, L)
        m[:, : L - 1] = mask[:, 2 + i :]
        feat = (F.smooth_l1_loss(pred, f[:, 1 + i :], reduction="none").mean(-1) * m).sum()
        feat = feat / m.sum()
        w = m * keep[:, i:]
        p = torch.softmax(f[:, 1 + i :] @ head_w.T, -1).half().float()
        logq = torch.log_softmax(pred @ head_w.T, -1)
        q = logq.exp()
        ce = -(p * logq).sum(-1)
        kl = F.kl_div(logq, p, reduction="none").sum(-1)
        alpha = torch.minimum(p, q).sum(-1)
        lam = torch.exp(-ecfg.lk_eta * alpha).detach()
        lk = lam * kl + (1 - lam) * (1 - alpha)
        tok = wmean(lk, w) if ecfg.token_loss == "lk_hybrid" else wmean(ce, w)
        total = total + ecfg.ttt_decay**i * (
            ecfg.feature_loss_weight * feat + ecfg.token_loss_weight * tok
        )
        out.update(
            {f"ce_{i}": wmean(ce, w), f"lk_{i}": wmean(lk, w), f"accept_est_{i}": wmean(alpha, w)}
        )
        g = pred
    return total, {k: float(v.detach()) for k, v in out.items()}


@pytest.mark.parametrize("token_loss", ["kl", "lk_hybrid"])
def test_the_token_loss_is_computed_over_the_loss_rows_of_every_step(token_loss):
    """eagle.token_loss: the loss of every training-time-test step (decay weights, the loss mask's
    weighted rows, soft targets over the draft ids, out-of-vocabulary rows left out) equals the
    whole-tensor computation by hand — kl the previous CE, lk_hybrid speculators' blend —; kl logs
    what it logged before, lk_hybrid adds lk_i and accept_est_i; a config without the option (what
    callers such as the integration smoke pass) is kl, bit for bit."""
    from types import SimpleNamespace

    from train.config import EagleConfig
    from train.objectives import eagle_loss, loss_rows

    drafter, embed, head_w, batch, f = tiny_loss_setup()
    ecfg = EagleConfig(ttt_steps=2, feature_noise=0.0, token_loss=token_loss, token_loss_weight=1.0)
    n0 = int(loss_rows(batch["loss_mask"]).bool().sum())
    keep0 = torch.arange(n0) % 3 != 1  # a third of the step-0 rows out of the draft vocabulary
    for keep in (None, keep0):
        loss, metrics = eagle_loss(drafter, embed, head_w, batch, f, ecfg, keep0=keep)
        ref, ref_metrics = token_loss_by_hand(drafter, embed, head_w, batch, f, ecfg, keep)
        assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
        keys = ["ce_0", "ce_1"] + (
            ["lk_0", "lk_1", "accept_est_0", "accept_est_1"] if token_loss == "lk_hybrid" else []
        )
        assert {k: metrics[k] for k in keys} == pytest.approx(
            {k: ref_metrics[k] for k in keys}, rel=1e-5
        )
        assert ("accept_est_0" in metrics) == (token_loss == "lk_hybrid")
    # the two losses differ (the test sees which one ran)
    assert ref_metrics["lk_0"] != pytest.approx(ref_metrics["ce_0"], rel=1e-2)
    if token_loss == "kl":
        plain = SimpleNamespace(
            ttt_steps=2,
            ttt_decay=ecfg.ttt_decay,
            feature_noise=0.0,
            feature_loss_weight=1.0,
            token_loss_weight=1.0,
        )
        old, old_metrics = eagle_loss(drafter, embed, head_w, batch, f, plain)
        new, new_metrics = eagle_loss(drafter, embed, head_w, batch, f, ecfg)
        assert torch.equal(old, new) and old_metrics == new_metrics


def test_lk_hybrid_is_the_kl_and_acceptance_blend_and_is_zero_at_the_target():
    """lk_hybrid on two hand-made rows: per row λ·KL(p‖q) + (1 − λ)·(1 − Σ min(p, q)), λ =
    exp(−η·Σ min(p, q)) a weight (not differentiated), rows weighted like the CE; η = 0 is the KL;
    the loss is 0 (its minimum) where q = p and grows as q leaves p."""
    import math

    from train.objectives import lk_hybrid

    def run(z, p, w, eta=3.0):
        logq = torch.log_softmax(z, -1)
        return lk_hybrid(-(p * logq).sum(-1), logq, p, w, w.sum(), eta)

    p = torch.tensor([[0.5, 0.3, 0.2], [0.7, 0.2, 0.1]])
    q = torch.tensor([[0.2, 0.2, 0.6], [0.7, 0.2, 0.1]])  # row 1: q = p
    w = torch.tensor([1.0, 0.5])
    loss, accept = run(q.log(), p, w)
    kl = 0.5 * math.log(0.5 / 0.2) + 0.3 * math.log(0.3 / 0.2) + 0.2 * math.log(0.2 / 0.6)
    alpha = 0.2 + 0.2 + 0.2
    lam = math.exp(-3.0 * alpha)
    row0 = lam * kl + (1 - lam) * (1 - alpha)  # row 1: KL 0, 1 − α 0
    assert loss.item() == pytest.approx(row0 / 1.5, rel=1e-5)
    assert accept.item() == pytest.approx((alpha * 1.0 + 1.0 * 0.5) / 1.5, rel=1e-5)
    assert run(q.log(), p, w, eta=0.0)[0].item() == pytest.approx(kl / 1.5, rel=1e-5)
    # the minimum: q = p gives 0 and full acceptance; any other q more
    torch.manual_seed(0)
    zp = torch.randn(4, 10)
    pr = torch.softmax(zp, -1)
    ones = torch.ones(4)
    at_p, acc_p = run(zp, pr, ones)
    assert abs(at_p.item()) < 1e-6 and acc_p.item() == pytest.approx(1.0, abs=1e-6)
    for scale in (0.01, 0.1, 1.0):
        off, acc_off = run(zp + scale * torch.randn(4, 10), pr, ones)
        assert off.item() > at_p.item() + 1e-7 and acc_off.item() < 1.0
    # λ is a weight: the gradient is that of λ·KL + (1 − λ)·(1 − α) with λ held fixed
    z = q.log().clone().requires_grad_(True)
    (g_impl,) = torch.autograd.grad(run(z, p, w)[0], z)

    def by_hand(detach: bool):
        logq = torch.log_softmax(z, -1)
        a = torch.minimum(p, logq.exp()).sum(-1)
        lam_ = torch.exp(-3.0 * (a.detach() if detach else a))
        kl_ = (p * (p.log() - logq)).sum(-1)
        return ((lam_ * kl_ + (1 - lam_) * (1 - a)) * w).sum() / w.sum()

    (g_fixed,) = torch.autograd.grad(by_hand(True), z)
    (g_through,) = torch.autograd.grad(by_hand(False), z)
    torch.testing.assert_close(g_impl, g_fixed)
    assert not torch.allclose(g_fixed, g_through, atol=1e-4)


def test_lk_hybrid_training_raises_the_estimated_acceptance():
    """With the token loss alone (feature_loss_weight 0), lk_hybrid's gradient reaches the
    drafter's weights and a few Adam steps on one batch raise accept_est (the mean Σ min(p, q))."""
    from train.config import EagleConfig
    from train.objectives import eagle_loss

    drafter, embed, head_w, batch, f = tiny_loss_setup(sharp=3.0)
    ecfg = EagleConfig(
        ttt_steps=2, feature_noise=0.0, token_loss="lk_hybrid", feature_loss_weight=0.0
    )
    opt = torch.optim.Adam(drafter.parameters(), lr=3e-3)
    seen = []
    for step in range(25):
        loss, metrics = eagle_loss(drafter, embed, head_w, batch, f, ecfg)
        seen.append((loss.item(), metrics["accept_est_0"], metrics["accept_est_1"]))
        opt.zero_grad()
        loss.backward()
        if step == 0:
            grads = [p.grad for p in drafter.parameters() if p.grad is not None]
            assert grads and all(torch.isfinite(g).all() for g in grads)
            assert drafter.fc.weight.grad.abs().sum() > 0
        opt.step()
    (l0, a0, b0), (l1, a1, b1) = seen[0], seen[-1]
    assert l1 < l0 and a1 > a0 + 0.05 and b1 > b0, seen


def test_lk_eta_needs_lk_hybrid_and_older_checkpoints_keep_their_hash(tmp_path):
    """eagle.lk_eta set without eagle.token_loss=lk_hybrid is refused; the checkpoint hash of a kl
    config is that of a config without the two options (a run checkpointed before them resumes),
    and lk_hybrid changes it."""
    from types import SimpleNamespace

    from train.checkpoint import config_hash

    assert tcfg(tmp_path, "t").eagle.token_loss == "kl"
    assert tcfg(tmp_path, "t", "eagle.token_loss=lk_hybrid", "eagle.lk_eta=1.5").eagle.lk_eta == 1.5
    with pytest.raises(PolyspecError, match="lk_eta is an option of eagle.token_loss=lk_hybrid"):
        tcfg(tmp_path, "t", "eagle.lk_eta=1.5")
    acc = SimpleNamespace(
        num_processes=1, distributed_type="NO", state=SimpleNamespace(deepspeed_plugin=None)
    )

    def hashed(cfg) -> str:
        return config_hash(cfg, "finetune", "sha", {}, [], None, acc)

    kl = tcfg(tmp_path, "t")
    before = kl.model_dump()
    for k in ("token_loss", "lk_eta"):
        del before["eagle"][k]
    old = SimpleNamespace(
        model_dump=lambda exclude: {k: before[k] for k in before if k not in exclude}
    )
    assert hashed(kl) == hashed(old)
    assert hashed(tcfg(tmp_path, "t", "eagle.token_loss=lk_hybrid")) != hashed(kl)


def test_without_a_scored_held_out_sequence_export_ships_final(
    tmp_path, llama_run, tiny_llama_dir, monkeypatch
):
    """An evaluation that scored nothing (τ 0 on no sequence) must not freeze best/ at the first
    eval."""
    run_dir = tmp_path / "run"
    shutil.copytree(llama_run, run_dir)
    monkeypatch.setattr(DrafterRecipe, "evaluate", lambda self: summarize([], self.cfg.eval_depth))
    finetune(run_dir, tiny_llama_dir)
    base = run_dir / "train" / "vi"
    assert not (base / "finetune" / "best").exists()
    assert (base / "final" / "model.safetensors").read_bytes() == (
        base / "finetune" / "final" / "model.safetensors"
    ).read_bytes()


@pytest.mark.parametrize("kind", ["eagle", "eagle-hint", "eagle3", "small-lm"])
def test_pretrain_then_finetune_writes_the_layout(kind, tmp_path, llama_run, tiny_llama_dir):
    run_dir = tmp_path / "run"
    shutil.copytree(llama_run, run_dir)
    arch = {"eagle3": ["eagle.arch=eagle3"], "eagle-hint": ["eagle.lookup_hint=true"]}.get(kind, [])
    hinted, kind = kind == "eagle-hint", "eagle" if kind.startswith("eagle") else kind
    results = run(tcfg(run_dir, tiny_llama_dir, f"drafter_type={kind}", "eagle.ttt_steps=2", *arch))
    assert [r["stage"] for r in results] == ["pretrain", "finetune"]
    base = run_dir / "train" / "vi"
    for stage in ("pretrain", "finetune"):
        assert (base / stage / "final" / "model.safetensors").is_file()
        assert (base / stage / "best" / "config.json").is_file()
        lines = [json.loads(x) for x in (base / stage / "metrics.jsonl").read_text().splitlines()]
        assert any("eval" in x for x in lines) and any("loss" in x for x in lines)
        assert len(list((base / stage).glob("checkpoint-*"))) <= 2
    model, meta = load_drafter(base / "final")
    assert meta["drafter_type"] == kind and meta["stage"] == "finetune"
    # export ships the finetune's best/ by held-out τ
    shipped = (base / "final" / "model.safetensors").read_bytes()
    assert shipped == (base / "finetune" / "best" / "model.safetensors").read_bytes()
    assert not list(base.glob(".final.*"))  # copied through a temporary folder, renamed into place
    # the hint weights reload (NaN-initialised otherwise)
    assert getattr(model, "lookup_hint", False) == hinted
    if hinted:  # a finetune cannot start from a drafter of the other form
        shutil.copytree(llama_run, tmp_path / "other")
        with pytest.raises(
            PolyspecError, match="lookup_hint is False in the config, True in the drafter"
        ):
            finetune(
                run_dir,
                tiny_llama_dir,
                f"init_from={base / 'final'}",
                "run=" + str(tmp_path / "other"),
            )
    # EAGLE-3: own head over the language's top-128 ids, three target layers fused
    if arch == ["eagle.arch=eagle3"]:
        assert model.arch_name == "eagle3" and model.lm_head.weight.shape[0] == 128
        assert model.fc.in_features == 3 * load_target(str(tiny_llama_dir)).hidden_size
    assert meta["vocab"]["size"] == 128 and meta["target"]["tokenizer_sha256"]
    first = json.loads((base / "finetune" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["init_from"].endswith("pretrain/final"), (
        "finetune starts from the pretrain weights"
    )
    ev = results[1]["eval"]
    # mean accepted = Σ_i P(accept ≥ i)
    assert ev["accept_len"] == pytest.approx(sum(ev["alpha"]), abs=1e-3)
    target = load_target(str(tiny_llama_dir))
    # the trained drafter, drafting token by token from each step's verified prefix
    if kind == "small-lm":
        got, want = ev, redrafted_small_lm(base / "finetune", target, k=3)
    else:  # EAGLE: scored on a drafter whose drafts follow from the target alone
        echo_run = tmp_path / "echo-run"
        shutil.copytree(llama_run, echo_run)
        echo = echo_eagle(base / "finetune" / "final", tmp_path / "echo", target)
        got = finetune(
            echo_run,
            tiny_llama_dir,
            "drafter_type=eagle",
            *arch,
            "eval_only=true",
            f"init_from={echo}",
        )[0]["eval"]
        want = echo_acceptance(echo_run / "train" / "vi" / "finetune", target, echo, k=3)
    assert want["accept_len"] > 0, (
        "a drafter that never hits cannot tell a right evaluation from a wrong one"
    )
    assert got["steps"] == want["steps"]
    assert got["alpha"] == pytest.approx(want["alpha"], abs=1e-4)
    assert got["accept_len"] == pytest.approx(want["accept_len"], abs=1e-4)
    assert got["tau"] == pytest.approx(want["tau"], abs=1e-3)


def test_training_score_is_the_decoders_tau(tmp_path, llama_run, tiny_llama_dir):
    """The score that picks best/ is what the decoder measures: the same held-out prompts decoded by
    decoder/core.py (chain, γ = eval_depth, greedy, fp32) take as many target forwards as the score
    counts."""
    from decoder.core import Decoder
    from export.bundle import write_bundle

    run_dir = tmp_path / "run"
    shutil.copytree(llama_run, run_dir)
    target = load_target(str(tiny_llama_dir))
    shutil.copytree(llama_run, tmp_path / "trained")
    finetune(tmp_path / "trained", tiny_llama_dir)
    # accepts drafts here
    echo = echo_eagle(tmp_path / "trained/train/vi/finetune/final", tmp_path / "echo", target)
    [res] = finetune(
        run_dir,
        tiny_llama_dir,
        "eval_only=true",
        f"init_from={echo}",
        "data.eval_max_examples=6",
        "data.eval_fraction=0.4",
    )
    shutil.copytree(echo, run_dir / "train/vi/final")
    bundle = write_bundle(tmp_path / "bundle", run_dir, ["vi"], target.pin(), [128])
    dec = Decoder(target, bundle, method="chain", gamma=3, size=128, lang="vi")
    tokens = forwards = 0
    seqs = json.loads((run_dir / "train/vi/finetune/eval_sequences.json").read_text())["sequences"]
    for s in seqs:
        out = dec.generate(s["ids"][: s["start"]], len(s["ids"]) - s["start"], stop=[])
        assert out.tokens == s["ids"][s["start"] :]
        tokens, forwards = tokens + len(out.tokens), forwards + out.target_forwards
    assert len(seqs) >= 4 and res["eval"]["accept_len"] > 0.2, res["eval"]
    assert res["eval"]["tau"] == pytest.approx(tokens / forwards, rel=0.02)


def test_a_two_layer_eagle3_drafter_trains_reloads_scores_and_decodes_losslessly(
    tmp_path, llama_run, tiny_llama_dir
):
    """eagle.arch=eagle3 eagle.num_layers=2 (issue 68's two-layer drafter): a finetune
    (training-time test unrolled, packed steps, held-out score) writes a drafter whose second layer
    is an ordinary decoder layer (``layers.1``: H input, no hidden_norm) that reloads with identical
    logits, one pass and cached continuation alike, and fails loudly without its weights; a stage
    asking for one layer refuses to start from it. Rewired to echo the target (every layer's output
    adds nothing), its training score is the decoder's τ, and the decoder's chain and tree on it
    give the target's greedy answers with drafts accepted."""
    from safetensors.torch import load_file, save_file

    from decoder.core import Decoder
    from export.bundle import write_bundle
    from polyspec.drafter_models import save_drafter

    target = load_target(str(tiny_llama_dir))
    H = target.hidden_size
    two = ("eagle.arch=eagle3", "eagle.num_layers=2")
    shutil.copytree(llama_run, tmp_path / "trained")
    [trained] = finetune(tmp_path / "trained", tiny_llama_dir, *two, "eagle.ttt_steps=2")
    assert trained["eval"]["steps"] > 0, trained["eval"]  # train/score.py ran on it
    final = tmp_path / "trained/train/vi/finetune/final"
    model, meta = load_drafter(final)
    assert model.num_layers == 2 and meta["num_layers"] == 2
    assert meta["layer_config"]["num_hidden_layers"] == 2
    first, second = model.self_attn.q_proj, model.layers["1"].self_attn.q_proj
    assert (first.in_features, second.in_features) == (2 * H, H)
    names = set(load_file(str(final / "model.safetensors")))
    assert {"layers.1.self_attn.q_proj.weight", "layers.1.input_layernorm.weight"} <= names
    assert not any(k.startswith("layers.1.hidden_norm") for k in names)
    # saved and loaded back: the same logits, in one pass and through the KV cache
    save_drafter(tmp_path / "again", model, {k: v for k, v in meta.items() if k != "num_layers"})
    back, _ = load_drafter(tmp_path / "again")
    g = torch.Generator().manual_seed(0)
    emb, aux = torch.randn(1, 9, H, generator=g), torch.randn(1, 9, 3 * H, generator=g)
    outs = []
    with torch.no_grad():
        for m in (model, back):
            h, cache = m(emb[:, :6], aux[:, :6], use_cache=True)
            h2, _ = m(emb[:, 6:], aux[:, 6:], past_key_values=cache, use_cache=True)
            outs.append((m.logits(h), m.logits(h2), m.logits(m(emb, aux)[0])))
    assert all(torch.equal(a, b) for a, b in zip(*outs))
    torch.testing.assert_close(torch.cat(outs[0][:2], 1), outs[0][2], rtol=1e-4, atol=1e-5)
    state = load_file(str(tmp_path / "again" / "model.safetensors"))
    del state["layers.1.mlp.up_proj.weight"]
    save_file(state, str(tmp_path / "again" / "model.safetensors"))
    with pytest.raises(PolyspecError, match="layers.1.mlp.up_proj"):
        load_drafter(tmp_path / "again")
    shutil.copytree(llama_run, tmp_path / "one")
    with pytest.raises(PolyspecError, match="num_layers is 1 in the config, 2 in the drafter"):
        finetune(tmp_path / "one", tiny_llama_dir, "eagle.arch=eagle3", f"init_from={final}")
    # the echo: its drafts are the target's own choices, so the decoder accepts them
    echo = echo_eagle(final, tmp_path / "echo", target)
    run_dir = tmp_path / "run"
    shutil.copytree(llama_run, run_dir)
    [res] = finetune(
        run_dir,
        tiny_llama_dir,
        *two,
        "eval_only=true",
        f"init_from={echo}",
        "data.eval_max_examples=6",
        "data.eval_fraction=0.4",
    )
    shutil.copytree(echo, run_dir / "train/vi/final")
    bundle = write_bundle(tmp_path / "bundle", run_dir, ["vi"], target.pin(), [128])
    seqs = json.loads((run_dir / "train/vi/finetune/eval_sequences.json").read_text())["sequences"]
    for method, opts in (
        ("chain", dict(gamma=3)),
        ("tree", dict(tree_depth=3, tree_topk=2, tree_nodes=6)),
    ):
        dec = Decoder(target, bundle, method=method, size=128, lang="vi", **opts)
        assert dec.source.runtimes["vi"].drafter.num_layers == 2
        tokens = forwards = accepted = 0
        for s in seqs:
            out = dec.generate(s["ids"][: s["start"]], len(s["ids"]) - s["start"], stop=[])
            assert out.tokens == s["ids"][s["start"] :], method
            tokens, forwards = tokens + len(out.tokens), forwards + out.target_forwards
            accepted += sum(st.accepted for st in out.steps)
        assert accepted > 0, f"{method}: no draft accepted"
        if method == "chain":  # eval_depth 3 = γ
            assert len(seqs) >= 4 and res["eval"]["accept_len"] > 0.2, res["eval"]
            assert res["eval"]["tau"] == pytest.approx(tokens / forwards, rel=0.02)


def _chain(seq: dict, k: int, drafts_at) -> tuple[int, list[int]]:
    """The decoder's greedy chain procedure on a known greedy answer, written out independently of
    train/score.py: from the verified prefix ids[:p+1], k drafts; the leading matches and the
    target's next token are kept. → (answer tokens, accepted drafts per step)."""
    ids, p, acc = seq["ids"], seq["start"], []
    while p < len(ids) - 1:
        d, a = drafts_at(p), 0
        while a < k and p + 2 + a < len(ids) and d[a] == ids[p + 1 + a]:
            a += 1
        acc.append(a)
        p += a + 1
    return len(ids) - seq["start"], acc


def _acceptance(per_seq: list[tuple[int, list[int]]], k: int) -> dict:
    steps = [a for _, acc in per_seq for a in acc]
    return {
        "steps": len(steps),
        "alpha": [sum(n >= i for n in steps) / len(steps) for i in range(1, k + 1)],
        "accept_len": sum(steps) / len(steps),
        "tau": sum(t for t, _ in per_seq) / (len(per_seq) + len(steps)),
    }


@torch.no_grad()
def redrafted_small_lm(stage_dir, target, k: int) -> dict:
    """The held-out score of a small-LM drafter (``<stage>/final``) recomputed from the stage's
    files: at every step it drafts token by token (greedy over its vocabulary) from the verified
    prefix, not by train's one-forward teacher forcing."""
    from vocab.files import load_ranked

    model, meta = load_drafter(stage_dir / "final")
    model.eval()
    ids_s = torch.as_tensor(
        load_ranked(meta["vocab"]["file"]).top(meta["vocab"]["size"]).astype("int64")
    )
    restrict = len(ids_s) < target.vocab_size

    def drafts(ids, p):
        ctx, out = list(ids[: p + 1]), []
        for _ in range(k):
            logits = model(input_ids=torch.tensor([ctx])).logits[0, -1]
            d = int(ids_s[logits[ids_s].argmax()]) if restrict else int(logits.argmax())
            ctx, out = [*ctx, d], [*out, d]
        return out

    seqs = json.loads((stage_dir / "eval_sequences.json").read_text())["sequences"]
    return _acceptance([_chain(s, k, lambda p, ids=s["ids"]: drafts(ids, p)) for s in seqs], k)


def echo_eagle(src, dst, target):
    """A copy of an EAGLE drafter folder rewired to echo the target: fc passes the target's last
    hidden state through (EAGLE-3: the aux entry that is the final layer), attention and MLP add
    nothing, the output norm is plain, EAGLE-3's head is the target's rows and lookup hints add
    nothing. Its every draft at start t, at every depth, is then the target's own top choice over
    the draft vocabulary at t, known without running the drafter."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    meta = json.loads((dst / "config.json").read_text())
    sd = load_file(str(dst / "model.safetensors"))
    H = target.hidden_size
    # fc reads [h_a | h_b | h_c] of output_hidden_states[aux_layers]
    if meta.get("arch") == "eagle3":
        # the post-norm final layer
        j = meta["aux_layers"].index(target.model.config.num_hidden_layers)
        sd["fc.weight"] = torch.zeros(H, 3 * H)
        sd["fc.weight"][:, j * H : (j + 1) * H] = torch.eye(H)
        sd["lm_head.weight"] = (
            target.model.get_output_embeddings().weight[sd["draft_ids"].long()].detach().clone()
        )
        zero, norm = ["self_attn.o_proj.weight", "mlp.down_proj.weight"], "norm.weight"
        # eagle.num_layers > 1: the later layers add nothing either
        zero += [
            k
            for k in sd
            if k.startswith("layers.") and k.endswith(("o_proj.weight", "down_proj.weight"))
        ]
    else:  # fc reads [embed(x_{t+1}) | f_t]
        sd["fc.weight"] = torch.cat([torch.zeros(H, H), torch.eye(H)], dim=1)
        sd["fc.bias"] = torch.zeros(H)
        zero, norm = (
            ["layer.layers.0.self_attn.o_proj.weight", "layer.layers.0.mlp.down_proj.weight"],
            "layer.norm.weight",
        )
    # no hint either
    zero += [k for k in ("hint_fc.weight", "hint_strength.weight", "hint_gate.weight") if k in sd]
    for key in zero:
        sd[key] = torch.zeros_like(sd[key])
    sd[norm] = torch.ones_like(sd[norm])
    save_file(sd, str(dst / "model.safetensors"))
    return dst


@torch.no_grad()
def echo_acceptance(stage_dir, target, echo_dir, k: int) -> dict:
    """Score of :func:`echo_eagle`'s drafter from the target alone: at a step whose verified prefix
    ends at p, its first draft reads the target's feature at p - 1 and re-proposes D = argmax over
    the draft vocabulary of the target's logits there, and every later draft reads that same
    feature: k copies of D."""
    from vocab.files import load_ranked

    vocab = json.loads((echo_dir / "config.json").read_text())["vocab"]
    ids_s = torch.as_tensor(load_ranked(vocab["file"]).top(vocab["size"]).astype("int64"))
    per_seq = []
    for s in json.loads((stage_dir / "eval_sequences.json").read_text())["sequences"]:
        logits = target.model(input_ids=torch.tensor([s["ids"]])).logits[0]
        per_seq.append(
            _chain(s, k, lambda p, lg=logits: [int(ids_s[lg[p - 1, ids_s].argmax()])] * k)
        )
    return _acceptance(per_seq, k)


def test_training_reduces_the_loss(tmp_path, llama_run, tiny_llama_dir):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(llama_run, run_dir)
    finetune(
        run_dir,
        tiny_llama_dir,
        "finetune.steps=40",
        "optim.lr=3e-3",
        "eval_every=100",
        "checkpoint_every=100",
        "log_every=1",
    )
    losses = [
        json.loads(x)["loss"]
        for x in (run_dir / "train/vi/finetune/metrics.jsonl").read_text().splitlines()
        if '"loss"' in x
    ]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


@pytest.mark.slow
def test_kill_9_then_resume_reaches_the_same_final_loss(tmp_path, llama_run, tiny_llama_dir):
    import shutil

    args = lambda d: drafter_argv(d, tiny_llama_dir)  # noqa: E731
    for name in ("ref", "crash"):
        shutil.copytree(llama_run, tmp_path / name)
    ref = run_cli(*args(tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr[-2000:]
    crashed = run_cli(*args(tmp_path / "crash"), env={"POLYSPEC_TEST_KILL_AT_STEP": "5"})
    assert crashed.returncode == -signal.SIGKILL
    resumed = run_cli(*args(tmp_path / "crash"), env={"POLYSPEC_TEST_KILL_AT_STEP": ""})
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed vi/finetune from checkpoint-4" in resumed.stdout + resumed.stderr

    def losses(d):
        rows = [
            json.loads(x) for x in (d / "train/vi/finetune/metrics.jsonl").read_text().splitlines()
        ]
        return {r["step"]: r["loss"] for r in rows if "loss" in r}

    a, b = losses(tmp_path / "ref"), losses(tmp_path / "crash")
    assert a[8] == pytest.approx(b[8], rel=1e-5) and a[6] == pytest.approx(b[6], rel=1e-5)
    # the resumed stage reports its whole run: the killed launch's tokens up to checkpoint-4 count
    ends = {
        d: [
            json.loads(x)
            for x in (tmp_path / d / "train/vi/finetune/metrics.jsonl").read_text().splitlines()
            if '"end"' in x
        ][-1]
        for d in ("ref", "crash")
    }
    assert ends["crash"]["stage_tokens"] == ends["ref"]["stage_tokens"] > 0
    assert ends["crash"]["stage_seconds"] >= ends["crash"]["seconds"]


@pytest.mark.slow
def test_ddp_two_processes_on_cpu_follow_the_single_process_trend(
    tmp_path, llama_run, tiny_llama_dir
):
    import shutil

    # drafter_argv's finetune for 12 steps, neither evaluated nor checkpointed on the way
    common = ("finetune.steps=12", "eval_every=100", "checkpoint_every=100", "optim.lr=3e-3")
    for name in ("one", "two"):
        shutil.copytree(llama_run, tmp_path / name)
    one = run_cli(*drafter_argv(tmp_path / "one", tiny_llama_dir, *common, "optim.grad_accum=2"))
    assert one.returncode == 0, one.stderr[-2000:]
    two = run_cli(
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        *drafter_argv(tmp_path / "two", tiny_llama_dir, *common),
        env={"ACCELERATE_USE_CPU": "1"},
    )
    assert two.returncode == 0, two.stderr[-3000:]

    def losses(d):
        rows = [
            json.loads(x) for x in (d / "train/vi/finetune/metrics.jsonl").read_text().splitlines()
        ]
        return [r["loss"] for r in rows if "loss" in r]

    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(a) == len(b) == 12
    # same global batch (2 processes x 2 = 1 process x 2 micro-batches): same trend, close values
    assert sum(b[-3:]) < sum(b[:3]) and sum(a[-3:]) < sum(a[:3])
    assert abs(sum(a) - sum(b)) / sum(a) < 0.1


def test_bad_input_fails_before_training(tmp_path, gemma_run, tiny_gemma_dir, tiny_llama_dir):
    with pytest.raises(PolyspecError, match="training data not found"):
        finetune(tmp_path, tiny_gemma_dir)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{not json\n[1, 2]\n{"conversations": 3}\n')
    with pytest.raises(PolyspecError, match=r"no usable training example .*\(3 lines skipped\)"):
        finetune(gemma_run, tiny_gemma_dir, f"data.finetune=[{bad}]")
    # vocab built for the gemma tokenizer
    with pytest.raises(PolyspecError, match="another tokenizer"):
        finetune(gemma_run, tiny_llama_dir)
    # make vocab's lists span |V|; a shorter ranked list (another tool, a truncated file) is refused
    from vocab.files import RankedVocab, load_ranked, save_ranked

    full = load_ranked(gemma_run / "vocab" / "vi.safetensors")
    save_ranked(
        tmp_path / "short", RankedVocab("vi", full.ranked_ids[:100], full.counts[:100], full.meta)
    )
    with pytest.raises(PolyspecError, match="larger than the ranked list"):
        finetune(
            gemma_run, tiny_gemma_dir, f"eagle.vocab_file={tmp_path / 'short' / 'vi.safetensors'}"
        )
    with pytest.raises(PolyspecError, match="larger than the target vocabulary"):
        finetune(gemma_run, tiny_gemma_dir, "eagle.vocab_size=100000")


def test_cli_script_entry_point_prints_one_line_errors(tmp_path, tiny_gemma_dir):
    # `accelerate launch train/drafter.py` runs the file as a script: a user's mistake is one line,
    # no traceback
    args = [
        str(REPO / "train" / "drafter.py"),
        f"run={tmp_path}",
        f"target={tiny_gemma_dir}",
        "lang=vi",
        "stage=finetune",
        "report_to=none",
    ]
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: training data not found: {tmp_path}/synth/vi/data.jsonl"
    ]
    bad = run_cli(*args, "optim.lr=-1")  # a config error is reported before anything is loaded
    assert (
        bad.returncode == 2
        and len(bad.stderr.strip().splitlines()) == 1
        and "optim.lr" in bad.stderr
    )
    assert bad.stderr.startswith("error: ")


def test_wandb_offline_run_holds_the_logged_metrics(
    tmp_path, llama_run, tiny_llama_dir, monkeypatch
):
    import shutil

    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the recipe must choose offline by itself
    run_dir = tmp_path / "run"
    shutil.copytree(llama_run, run_dir)
    finetune(run_dir, tiny_llama_dir, "report_to=wandb", "finetune.steps=3", "log_every=1")
    runs = list((run_dir / "train/vi/finetune/wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((run_dir / "train/vi/finetune").rglob("*"))[:20]
    logged = list(runs[0].glob("*.wandb"))
    assert logged and logged[0].stat().st_size > 0
    # the .wandb file is wandb's binary record log (protobuf); logged keys are stored verbatim.
    # wandb's service process may still be flushing it after finish() returns on a busy machine
    # (seen once in CI): wait for it.
    keys = (b"finetune/loss", b"finetune/accept_len", b"finetune/tokens_per_s")
    deadline = time.monotonic() + 60
    while not all(k in logged[0].read_bytes() for k in keys) and time.monotonic() < deadline:
        time.sleep(0.5)
    blob = logged[0].read_bytes()
    for key in keys:
        assert key in blob, key


def test_compare_tables_untrained_and_trained_runs(tmp_path, llama_run, tiny_llama_dir, capsys):
    import shutil

    from train.compare import main as compare_main

    for name, extra in (("untrained", ["eval_only=true"]), ("f", [])):
        shutil.copytree(llama_run, tmp_path / name)
        finetune(tmp_path / name, tiny_llama_dir, *extra)
    only = json.loads((tmp_path / "untrained/train/vi/finetune/eval_only.json").read_text())
    assert only["steps"] == 0 and only["init_from"] is None and only["eval"]["steps"] > 0
    assert not (tmp_path / "untrained/train/vi/finetune/final").exists(), "eval_only trains nothing"
    assert (
        compare_main(["--lang", "vi", f"untrained={tmp_path / 'untrained'}", f"f={tmp_path / 'f'}"])
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("| run | step 0 | step 3 | step 6 |")
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in out[3:]}
    assert rows["untrained"][1] == f"{only['eval']['tau']:.3f}" and rows["untrained"][2] == "—"
    final = [
        json.loads(x)
        for x in (tmp_path / "f/train/vi/finetune/metrics.jsonl").read_text().splitlines()
    ]
    assert (
        rows["f"][1] == "—"
        and rows["f"][3] == f"{[r for r in final if 'eval' in r][-1]['eval']['tau']:.3f}"
    )
    with pytest.raises(SystemExit):
        compare_main(["--lang", "vi", f"x={tmp_path / 'missing'}"])


@pytest.mark.slow
def test_make_pf_study_trains_the_three_arms_and_tables_them(tmp_path, llama_run, tiny_llama_dir):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(llama_run, run_dir)
    test_set = tmp_path / "test.jsonl"  # an independent test set scores all three arms
    test_set.write_text(
        "\n".join((run_dir / "synth/vi/data.jsonl").read_text().splitlines()[:3]) + "\n"
    )
    proc = run_cli(
        "make",
        "-s",
        "pf-study",
        "LANG=vi",
        f"TARGET={tiny_llama_dir}",
        f"RUN={run_dir}",
        "PRETRAIN_LANGS=vi,de",
        "PRETRAIN_EPOCHS=1",
        "DISTILL_ARGS=sampling.max_new_tokens=8 limit=12",
        f"TEST_DATA={test_set}",
        "STUDY_ARGS=finetune.steps=3 eval_every=3 checkpoint_every=3 report_to=none "
        "data.max_length=64 data.eval_max_examples=3 eval_depth=3 eagle.vocab_size=128 "
        "optim.batch_size=2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = run_dir / "pf-study" / "eagle-cpu"
    # the pretraining data: every language's on-policy answers, features captured
    for lang in ("vi", "de"):
        stats = json.loads((run_dir / "synth" / f"{lang}-distill" / "stats.json").read_text())
        assert stats["accepted"] > 0 and stats["feature_bytes"] > 0
    pf = [
        json.loads(x)
        for x in (study / "pretrain-finetune/train/vi/finetune/metrics.jsonl")
        .read_text()
        .splitlines()
    ]
    assert pf[0]["init_from"].endswith("pretrain-finetune/train/vi/pretrain/final")
    ft = [
        json.loads(x)
        for x in (study / "finetune-only/train/vi/finetune/metrics.jsonl").read_text().splitlines()
    ]
    assert ft[0]["init_from"] is None and not (study / "finetune-only/train/vi/pretrain").exists()
    table = (study / "table.md").read_text().splitlines()
    assert (
        table[1].startswith("| run | step 0 | step 3 |")
        and table == proc.stdout.strip().splitlines()[-6:]
    )
    assert [r.split(" | ")[0] for r in table[3:]] == [
        "| pretrain-finetune",
        "| finetune-only",
        "| untrained",
    ]
    for arm in ("pretrain-finetune", "finetune-only", "untrained"):
        seqs = json.loads((study / arm / "train/vi/finetune/eval_sequences.json").read_text())[
            "sequences"
        ]
        assert len(seqs) == 3, arm
    assert len({r.split(" | ")[-1] for r in table[3:]}) == 1, (
        "the same held-out answers for every arm"
    )


def test_eval_file_scores_an_independent_test_set(tmp_path, llama_run, tiny_llama_dir):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(llama_run, run_dir)
    records = (run_dir / "synth/vi/data.jsonl").read_text().splitlines()
    test_a, test_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    test_a.write_text("\n".join(records[:2]) + "\n")
    test_b.write_text("\n".join(records[2:7]) + "\n")
    seqs = run_dir / "train/vi/finetune/eval_sequences.json"
    scores = {}
    # same run folder: the cached sequences must follow the file
    for name, f in (("a", test_a), ("b", test_b)):
        [res] = finetune(
            run_dir,
            tiny_llama_dir,
            "eval_only=true",
            f"data.eval_file=[{f}]",
            "data.eval_max_examples=50",
        )
        scores[name] = res["eval"]["sequences"]
        assert len(json.loads(seqs.read_text())["sequences"]) == (2 if name == "a" else 5)
    assert scores["a"] < scores["b"]
    with pytest.raises(PolyspecError, match="not found"):
        finetune(
            run_dir, tiny_llama_dir, "eval_only=true", f"data.eval_file=[{tmp_path / 'none.jsonl'}]"
        )
    # with a test set, finetune trains on every record of its data
    recipe = DrafterRecipe(
        tcfg(run_dir, tiny_llama_dir, "stage=finetune", f"data.eval_file=[{test_a}]"), "finetune"
    )
    recipe.setup()
    assert len(recipe.train_set) == len(records) and len(recipe.eval_seqs) == 2
    recipe.cleanup()


def test_resume_refuses_checkpoints_of_another_data_config(tmp_path, llama_run, tiny_llama_dir):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(llama_run, run_dir)
    finetune(run_dir, tiny_llama_dir, *TWO_STEPS)
    finetune(run_dir, tiny_llama_dir, *TWO_STEPS)
    # the data settings are part of the resume key
    for changed in ("data.max_length=48", "data.eval_fraction=0.2"):
        with pytest.raises(PolyspecError, match="another config or data"):
            finetune(run_dir, tiny_llama_dir, *TWO_STEPS, changed)


def test_train_bench_times_the_recipes_step_and_leaves_the_run_alone(
    tmp_path, llama_run, tiny_llama_dir
):
    import shutil

    from train.bench import main as bench_main

    run_dir = tmp_path / "run"
    shutil.copytree(llama_run, run_dir)
    finetune(run_dir, tiny_llama_dir, *TWO_STEPS)
    before = {p: p.stat().st_mtime_ns for p in (run_dir / "train").rglob("*")}
    # another data config than the finished stage's checkpoint: training would refuse to resume, the
    # bench starts fresh
    over = [
        f"run={run_dir}",
        f"target={tiny_llama_dir}",
        "lang=vi",
        "eagle.vocab_size=128",
        "optim.batch_size=2",
        "data.max_length=48",
        "data.pad_to_multiple=16",
        "data.eval_max_examples=3",
        "finetune.steps=50",
    ]
    out = tmp_path / "bench.json"
    assert bench_main(["--steps", "4", "--warmup", "1", "--json", str(out), *over]) == 0
    got = json.loads(out.read_text())
    assert got["steps"] == 4 and got["stage"] == "finetune" and got["drafter"] == "eagle1"
    assert {p: p.stat().st_mtime_ns for p in (run_dir / "train").rglob("*")} == before
    # the counted tokens are those of the stream's batches 2..5 (after one warm-up step)
    cfg = validate(TrainConfig, apply_overrides({}, [*over, "stage=finetune", "report_to=none"]))
    r = DrafterRecipe(cfg, "finetune")
    r.setup(timing_only=True)
    batches = [b for _, b in zip(range(5), r.batches())][1:]
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    loss = sum(int(b["loss_mask"].sum()) for b in batches)
    padded = sum(b["attention_mask"].numel() for b in batches)
    assert (got["tokens"], got["loss_tokens"]) == (real, loss)
    assert got["tokens_per_s"] == pytest.approx(real / got["seconds"], rel=0.02)
    assert got["padding"] == pytest.approx(1 - real / padded, abs=1e-3) and 0 < loss < real


# ---------------------------------------------------------------------------------- damaged files


def _truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_truncated_captured_feature_shard_is_a_one_line_error_naming_it(tmp_path):
    from polyspec.features import FeatureReader, write_shard

    shard = tmp_path / "synth" / "vi-distill" / "features" / "a0000000.safetensors"
    shard.parent.mkdir(parents=True)
    write_shard(
        shard,
        {"r0": {"ids": [5, 6, 7], "start": 1, "f": torch.randn(3, 8)}},
        {"target": "t", "tokenizer": "s"},
    )
    assert FeatureReader("t", "s").ids(str(shard), "r0") == ([5, 6, 7], 1)
    with pytest.raises(PolyspecError, match="holds no r1.f"):
        FeatureReader("t", "s").get(str(shard), "r1")
    _truncate(shard)
    with pytest.raises(PolyspecError) as e:
        FeatureReader("t", "s").get(str(shard), "r0")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"corrupt feature shard {shard}: ")
    assert f"delete {tmp_path / 'synth' / 'vi-distill'} and rerun synth distill" in msg


def test_a_truncated_offline_feature_shard_is_a_one_line_error_naming_it(tmp_path):
    from safetensors.torch import save

    from train.features import FeatureStore

    path = tmp_path / "features" / "shard-00000.safetensors"
    path.parent.mkdir()
    path.write_bytes(save({f"ex{i}": torch.randn(4, 8) for i in range(3)}))
    # the shard is there: nothing computed
    store = FeatureStore(path.parent, [None] * 3, target=None, is_main=False)
    assert store.get([0, 2], 5, "cpu").shape == (2, 5, 8)
    _truncate(path)
    with pytest.raises(PolyspecError) as e:
        FeatureStore(path.parent, [None] * 3, target=None, is_main=False).get([1], 5, "cpu")
    msg = str(e.value)
    assert (
        "\n" not in msg
        and msg.startswith(f"corrupt feature shard {path}: ")
        and msg.endswith("rerun train")
    )


def test_a_damaged_checkpoint_is_a_one_line_error_naming_it(tmp_path, llama_run, tiny_llama_dir):
    run_dir = tmp_path / "run"
    shutil.copytree(llama_run, run_dir)
    common = ["checkpoint_every=2", "eval_every=100", "keep_checkpoints=2", "finetune.steps=4"]
    finetune(run_dir, tiny_llama_dir, *common)
    ck = run_dir / "train/vi/finetune/checkpoint-4"
    weights = ck / "model.safetensors"
    _truncate(weights)
    # a rerun of the finished stage resumes from its last checkpoint
    with pytest.raises(PolyspecError) as e:
        finetune(run_dir, tiny_llama_dir, *common)
    msg = str(e.value)
    assert (
        "\n" not in msg
        and msg.startswith(f"corrupt checkpoint {weights}: ")
        and f"delete {ck} and rerun" in msg
    )
    (ck / "trainer_state.json").write_text("{")
    with pytest.raises(PolyspecError, match=f"corrupt checkpoint {ck / 'trainer_state.json'}: "):
        finetune(run_dir, tiny_llama_dir, *common)
    shutil.rmtree(ck)  # as the message says: the stage resumes from the checkpoint before
    assert finetune(run_dir, tiny_llama_dir, *common)[0]["steps"] == 4


def test_compare_skips_a_torn_metrics_line(tmp_path):
    from train.compare import eval_rows

    stage = tmp_path / "train" / "vi" / "finetune"
    stage.mkdir(parents=True)
    ev = {"tau": 1.5, "accept_len": 0.5, "alpha": [0.5], "steps": 2, "tokens": 3}
    (stage / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "loss": 2.0})
        + "\n"
        + json.dumps({"step": 2, "eval": ev})
        + "\n"
        + '{"step": 3, "ev'
    )
    assert eval_rows(tmp_path, "vi") == {2: ev}


def test_split_text_reads_every_token_of_a_long_document(tiny_llama_dir, tmp_path):
    """``data.split_text``: a plain-text document longer than max_length becomes pieces of at most
    max_length, each after BOS, covering all of its tokens (a tail under 16 tokens dropped; a
    document shorter than that stays whole); without it the document is cut."""
    from polyspec.targets import load_target
    from train.data import build_dataset

    target = load_target(str(tiny_llama_dir), device="cpu")
    text = " ".join(f"word{i}" for i in range(400))
    (tmp_path / "t.jsonl").write_text(
        json.dumps({"text": text}) + "\n" + json.dumps({"text": ""}) + "\n"
    )
    ids = target.tokenizer(text, add_special_tokens=True)["input_ids"]
    bos = target.tokenizer.bos_token_id
    head = ids[:1] if bos is not None and ids[0] == bos else []
    cut = build_dataset([str(tmp_path / "t.jsonl")], target, str(tmp_path), "en", 64, False)
    whole = build_dataset(
        [str(tmp_path / "t.jsonl")], target, str(tmp_path), "en", 64, False, split_text=True
    )
    assert len(cut.examples) == 1 and cut.examples[0].input_ids == ids[:64]
    assert len(whole.examples) > 1 and all(len(e.input_ids) <= 64 for e in whole.examples)
    assert all(e.input_ids[: len(head)] == head and e.loss_mask[0] == 0 for e in whole.examples)
    body = [t for e in whole.examples for t in e.input_ids[len(head) :]]
    assert body == ids[len(head) :][: len(body)] and len(ids) - len(head) - len(body) < 16
    assert whole.skipped == cut.skipped == 1, "the empty document has nothing to train on"


def test_max_seconds_fits_the_schedule_to_the_budget_and_ends_with_final_weights(
    tmp_path, llama_run, tiny_llama_dir
):
    """``max_seconds``: after a few steps the stage measures its rate and shortens its planned steps
    to what the budget affords, so the cosine schedule still anneals to 0 within it; it writes
    final/ and a checkpoint, and says so in its metrics. The schedule itself is transformers' cosine
    with warm-up."""
    import math
    import shutil

    from train.recipe import REPLAN_AFTER, cosine_with_warmup

    run_dir = tmp_path / "run"
    shutil.copytree(llama_run, run_dir)
    res = finetune(
        run_dir,
        tiny_llama_dir,
        "finetune.steps=4000",
        "max_seconds=2",
        "checkpoint_every=100000",
        "eval_every=100000",
        "optim.lr=1e-3",
    )
    assert REPLAN_AFTER <= res[-1]["steps"] < 4000
    metrics = [
        json.loads(x)
        for x in (run_dir / "train/vi/finetune/metrics.jsonl").read_text().splitlines()
    ]
    replanned = next(m for m in metrics if m.get("event") == "replanned")
    assert replanned["step"] == REPLAN_AFTER and replanned["to"] < 4000
    last = [m for m in metrics if "lr" in m][-1]
    assert last["lr"] < 0.1 * 1e-3 or any(m.get("event") == "max_seconds" for m in metrics)
    assert (run_dir / "train/vi/finetune/final/model.safetensors").is_file()
    f = cosine_with_warmup({"warmup": 10, "total": 110})
    assert (
        f(0) == 0
        and f(5) == 0.5
        and f(10) == 1
        and f(60) == pytest.approx(0.5)
        and f(110) == pytest.approx(0)
    )
    assert f(35) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.25)))
