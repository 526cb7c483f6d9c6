"""oneDNN-prepacked linears (polyspec.packed), bf16 and fp32: the same outputs as nn.Linear, only
where they apply."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from decoder.core import Decoder
from polyspec.packed import MIN_NUMEL, PackedLinear, pack_linears, packing_available
from polyspec.targets import load_target

needs_packing = pytest.mark.skipif(
    not packing_available(torch.zeros(1, dtype=torch.bfloat16)),
    reason="this torch build or CPU has no oneDNN bf16 linear packing",
)


@needs_packing
def test_packed_linear_matches_nn_linear_and_keeps_the_weight():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 500, bias=False)).to(
        torch.bfloat16
    )
    model.requires_grad_(False)
    ref_weights = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        want = model(x)
    assert pack_linears(model) == 2
    assert all(isinstance(m, PackedLinear) for m in (model[0], model[2]))
    with torch.inference_mode():
        got = model(x)
    assert got.shape == want.shape == (2, 5, 500)
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    assert model.state_dict().keys() == ref_weights.keys()  # same parameters, same names
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ref_weights.items())
    # with autograd on, the packed op (inference only) is not used: gradients still flow to the
    # input
    xg = x.float().to(torch.bfloat16).requires_grad_(True)
    model(xg).float().sum().backward()
    assert xg.grad is not None and xg.grad.abs().sum() > 0


needs_fp32_packing = pytest.mark.skipif(
    not packing_available(torch.zeros(1)),
    reason="this torch build or CPU has no oneDNN fp32 linear packing",
)


def test_pack_linears_leaves_other_dtypes_and_small_fp32_weights_alone(monkeypatch):
    model = nn.Sequential(nn.Linear(8, 8)).to(torch.float16)
    assert pack_linears(model) == 0 and type(model[0]) is nn.Linear
    assert not packing_available(torch.zeros(1, dtype=torch.float64))
    # Gemma-3-270m's k/v and q projections
    small = nn.Sequential(nn.Linear(640, 256), nn.Linear(640, 1024))
    monkeypatch.setenv("POLYSPEC_PACK", "0")  # packing switched off for every stage
    assert pack_linears(small) == 0
    monkeypatch.delenv("POLYSPEC_PACK")
    assert pack_linears(small) == (1 if packing_available(torch.zeros(1)) else 0)
    assert type(small[0]) is nn.Linear  # 164K elements: MKL's GEMM is faster than a oneDNN call


@needs_fp32_packing
def test_fp32_packed_linear_is_batch_invariant_where_nn_linear_is_not():
    """fp32 on CPU is packed too (the head GEMM at 2–3 rows was 2–3× a 1-row forward unpacked); at
    the reorder's row hint each row's output is bitwise the same for 1…16 rows, so a k-token
    verification computes the very linears a 1-token forward does. The default target's head shape,
    so the kernel is the one decoding uses."""
    torch.manual_seed(0)
    lin = nn.Linear(640, 4096, bias=False).requires_grad_(False)  # above MIN_NUMEL
    x = torch.randn(16, 640)
    with torch.inference_mode():
        want = lin(x)
    model = nn.Sequential(lin)
    assert pack_linears(model) == 1 and isinstance(model[0], PackedLinear)
    assert model[0].weight is lin.weight  # the parameter itself, not a copy
    with torch.inference_mode():
        rows = {k: model(x[:k].contiguous()) for k in (1, 2, 3, 5, 8, 12, 16)}
    torch.testing.assert_close(rows[16], want, rtol=1e-5, atol=1e-5)
    for k, y in rows.items():
        assert torch.equal(y, rows[16][:k]), f"packed rows differ between {k} and 16 rows"


@needs_packing
def test_bf16_target_is_packed_and_decodes_as_unpacked(tiny_gemma_dir):
    """The tiny Gemma3 target in bf16 on CPU: every linear packed, the head's weight still the
    parameter it was (tied or not), logits within bf16 rounding of the unpacked model's, and greedy
    decoding (ar and prompt lookup) the same tokens."""
    packed = load_target(str(tiny_gemma_dir), device="cpu", dtype="bfloat16")
    plain = load_target(str(tiny_gemma_dir), device="cpu", dtype="bfloat16", pack=False)
    n_linear = sum(type(m) is nn.Linear for m in plain.model.modules())
    assert plain.packed_linears == 0 and packed.packed_linears == n_linear > 0
    assert not any(type(m) is nn.Linear for m in packed.model.modules())
    head = packed.model.get_output_embeddings()
    assert isinstance(head, PackedLinear)
    tied = (
        plain.model.get_output_embeddings().weight.data_ptr()
        == plain.model.get_input_embeddings().weight.data_ptr()
    )
    # as it was
    assert (head.weight.data_ptr() == packed.model.get_input_embeddings().weight.data_ptr()) == tied
    ids = packed.tokenizer("The quick brown fox jumps over the lazy dog. " * 3)["input_ids"]
    with torch.inference_mode():
        a = packed.model(torch.tensor([ids])).logits.float()
        b = plain.model(torch.tensor([ids])).logits.float()
    torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.95
    for method in ("ar", "pld"):
        x = Decoder(packed, None, method=method).generate(ids, 24)
        y = Decoder(plain, None, method=method).generate(ids, 24)
        assert x.tokens == y.tokens
    # prompt lookup's drafts were accepted, not only proposed
    assert any(s.accepted for s in x.steps)


@needs_fp32_packing
def test_fp32_target_is_packed_and_decodes_as_unpacked(tiny_gemma_dir):
    """The tiny Gemma3 target in fp32 (the exact mode): load_target packs no 64-wide linear (below
    ``MIN_NUMEL``: slower packed); every linear packed by hand, no head padding is left, logits are
    within fp32 rounding of the unpacked model's, and every greedy method decodes the same tokens
    packed and unpacked, with drafts accepted."""
    from decoder.loop.runner import TargetRunner

    assert load_target(str(tiny_gemma_dir), device="cpu", dtype="float32").packed_linears == 0
    packed = load_target(str(tiny_gemma_dir), device="cpu", dtype="float32", pack=False)
    plain = load_target(str(tiny_gemma_dir), device="cpu", dtype="float32", pack=False)
    n_linear = sum(type(m) is nn.Linear for m in plain.model.modules())
    assert pack_linears(packed.model, min_numel=0) == n_linear > 0
    assert not any(type(m) is nn.Linear for m in packed.model.modules())
    # padding only for MKL's GEMM
    assert TargetRunner(packed).pad_rows == 0 and TargetRunner(plain).pad_rows == 8
    ids = packed.tokenizer("The quick brown fox jumps over the lazy dog. " * 3)["input_ids"]
    with torch.inference_mode():
        a = packed.model(torch.tensor([ids])).logits
        b = plain.model(torch.tensor([ids])).logits
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    for method in ("ar", "pld", "ngram-tree"):
        x = Decoder(packed, None, method=method).generate(ids, 64)
        y = Decoder(plain, None, method=method).generate(ids, 64)
        assert x.tokens == y.tokens, method
        if method != "ar":
            # drafts were accepted, not only proposed
            assert any(s.accepted for s in x.steps), method


@needs_fp32_packing
def test_packed_copy_follows_the_weight_through_copies_casts_and_in_place_changes():
    """A packed model can be deep-copied, cast and changed in place (the tests' oracle drafter is
    the target with noise added): the packed copy is rebuilt from the current weight, never a stale
    one."""
    import copy

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 48)).requires_grad_(False)
    assert pack_linears(model, min_numel=0) == 1
    x = torch.randn(4, 32)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin[0].weight.add_(torch.randn_like(twin[0].weight))  # in place, on the copy only
    with torch.inference_mode():
        torch.testing.assert_close(
            model(x), F.linear(x, model[0].weight, model[0].bias), rtol=1e-5, atol=1e-5
        )
        torch.testing.assert_close(
            twin(x), F.linear(x, twin[0].weight, twin[0].bias), rtol=1e-5, atol=1e-5
        )
        assert not torch.allclose(twin(x), model(x))
        half = copy.deepcopy(model).to(torch.float16)  # not a packed dtype: plain F.linear
        torch.testing.assert_close(half(x.half()), F.linear(x.half(), half[0].weight, half[0].bias))
        # copied into the same tensors: their version moves
        model.load_state_dict(twin.state_dict())
        torch.testing.assert_close(model(x), twin(x), rtol=1e-5, atol=1e-5)


@needs_fp32_packing
def test_costs_compares_packed_and_plain_in_one_run(tiny_gemma_dir, tmp_path, capsys, monkeypatch):
    """``python -m decoder.calibrate.costs --compare-unpacked`` measures both forms of the target in
    one process: the plain one keeps ``nn.Linear`` (its curve is really unpacked), the packed twin's
    linears are all packed."""
    import json

    from decoder.calibrate import costs

    plain = load_target(str(tiny_gemma_dir), device="cpu", dtype="float32", pack=False)
    ctx = costs.calibration_context(plain, 40)
    # tiny: pack every linear
    both = costs.packing_curves(plain, ctx, [1, 2, 3], reps=1, passes=2, min_numel=0)
    assert not any(isinstance(m, PackedLinear) for m in plain.model.modules())
    assert both["packed_target"].packed_linears == sum(
        type(m) is nn.Linear for m in plain.model.modules()
    )
    for name in ("plain", "packed"):
        assert (
            set(both[name]["ratio"]) == {1, 2, 3}
            and both[name]["ratio"][1] == 1.0
            and both[name]["passes"] == 2
        )
    out = tmp_path / "costs.json"
    # the CLI packs what load_target packs: here, every linear
    monkeypatch.setitem(MIN_NUMEL, torch.float32, 0)
    assert (
        costs.main(
            [
                "--target",
                str(tiny_gemma_dir),
                "--dtype",
                "float32",
                "--context",
                "40",
                "--max-k",
                "3",
                "--reps",
                "1",
                "--passes",
                "1",
                "--compare-unpacked",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "plain nn.Linear, same run" in printed and "packed ÷ plain" in printed
    saved = json.loads(out.read_text())
    assert set(saved["plain"]["ratio"]) == set(saved["ratio"]) == {"1", "2", "3"}
