"""oneDNN-prepacked linears (polyspec.packed): the same outputs as nn.Linear, only where they apply."""

import pytest
import torch
from torch import nn

from decoder.core import Decoder
from polyspec.packed import PackedLinear, pack_linears, packing_available
from polyspec.targets import load_target

needs_packing = pytest.mark.skipif(not packing_available(torch.zeros(1, dtype=torch.bfloat16)),
                                   reason="this torch build has no oneDNN linear packing")


@needs_packing
def test_packed_linear_matches_nn_linear_and_keeps_the_weight():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 500, bias=False)).to(torch.bfloat16)
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
    # with autograd on, the packed op (inference only) is not used: gradients still flow to the input
    xg = x.float().to(torch.bfloat16).requires_grad_(True)
    model(xg).float().sum().backward()
    assert xg.grad is not None and xg.grad.abs().sum() > 0


def test_pack_linears_leaves_fp32_alone():
    model = nn.Sequential(nn.Linear(8, 8))
    assert pack_linears(model) == 0 and type(model[0]) is nn.Linear


@needs_packing
def test_bf16_target_is_packed_and_decodes_as_unpacked(tiny_gemma_dir):
    """The tiny Gemma3 target in bf16 on CPU: every linear packed, the head's weight still the parameter it was (tied or not), logits
    within bf16 rounding of the unpacked model's, and greedy decoding (ar and prompt lookup) the same tokens."""
    packed = load_target(str(tiny_gemma_dir), device="cpu", dtype="bfloat16")
    plain = load_target(str(tiny_gemma_dir), device="cpu", dtype="bfloat16", pack=False)
    n_linear = sum(type(m) is nn.Linear for m in plain.model.modules())
    assert plain.packed_linears == 0 and packed.packed_linears == n_linear > 0
    assert not any(type(m) is nn.Linear for m in packed.model.modules())
    head = packed.model.get_output_embeddings()
    assert isinstance(head, PackedLinear)
    tied = plain.model.get_output_embeddings().weight.data_ptr() == plain.model.get_input_embeddings().weight.data_ptr()
    assert (head.weight.data_ptr() == packed.model.get_input_embeddings().weight.data_ptr()) == tied  # as it was
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
    assert any(s.accepted for s in x.steps)  # prompt lookup's drafts were accepted, not only proposed
