"""`make test`'s smoke on the real default target (Gemma-3-270m, fp32 as every test pins it): each
decoding method of the registry answers one short prompt token-identically to `ar` and to
transformers' greedy `generate`, and keeps drafts doing it.

Drafts are kept on the real target without a trained bundle: the training-free sources predict the
base model's looping answer from its own text, and the drafter methods read an EAGLE-1 drafter
fitted here, in a few seconds, to that same answer (:func:`memorize`, the training loss of
``train.objectives``). A drafter that memorised the answer proposes it, so the chain, tree, ADASPEC
and SPIDE loops run their accept path (long accepted runs, the cache and feature bookkeeping after
them) on the real model, not only the reject path a random drafter takes. The longer identity sweeps
(random EAGLE-1/EAGLE-3 drafters, three languages) are in test_default_target.py (`make test-all`).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import make_tiny_bundle
from decoder.methods import DECODER_METHODS, METHODS
from polyspec.languages import get_language
from polyspec.prompts import encode, render
from polyspec.targets import greedy_generate

pytestmark = [pytest.mark.integration, pytest.mark.smoke]

MAX_NEW = 32
FIT_STEPS = 300


@pytest.fixture(scope="module")
def prompt_and_ref(gemma):
    """One vi prompt of the seeds (the base model's answer repeats itself) and transformers' greedy
    answer to it."""
    assert gemma.dtype == torch.float32
    fmt = gemma.spec.prompt_format
    ids = encode(
        fmt,
        gemma.tokenizer,
        render(
            fmt,
            gemma.tokenizer,
            [{"role": "user", "content": get_language("vi").seeds[4].instruction}],
        ),
    )
    return ids, greedy_generate(gemma, ids, MAX_NEW)


def memorize(target, ids: list[int], start: int):
    """``fit`` for :func:`conftest.make_tiny_bundle`: trains the EAGLE-1 drafter on one sequence
    (teacher-forced target features, the CE + feature loss of training) until its greedy next token
    is the target's at every answer position, or ``FIT_STEPS`` steps."""
    from train.objectives import eagle_loss, target_features

    x = torch.tensor([ids])
    f = target_features(target.model, x, torch.ones_like(x)).float()
    mask = torch.zeros(x.shape)
    mask[:, start:] = 1.0  # the answer's tokens are the ones to predict
    embed = target.model.get_input_embeddings()
    cfg = SimpleNamespace(
        feature_noise=0.0,
        ttt_steps=1,
        ttt_decay=1.0,
        feature_loss_weight=0.1,
        token_loss_weight=1.0,
    )
    softcap = getattr(target.model.config, "final_logit_softcapping", None)

    def fit(model, order):
        head_w = target.model.get_output_embeddings().weight[torch.as_tensor(order[:1024])].detach()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        for _ in range(FIT_STEPS):
            loss, m = eagle_loss(
                model, embed, head_w, {"input_ids": x, "loss_mask": mask}, f, cfg, softcap
            )
            if m["top1_0"] == 1.0:
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert m["top1_0"] == 1.0, (
            f"the drafter did not memorise the answer in {FIT_STEPS} steps "
            f"(top-1 {m['top1_0']:.2f})"
        )

    return fit


@pytest.fixture(scope="module")
def bundle(gemma, prompt_and_ref, tmp_path_factory):
    ids, ref = prompt_and_ref
    seq = ids + ref
    return make_tiny_bundle(
        tmp_path_factory.mktemp("smoke") / "bundle",
        gemma,
        langs=("vi",),
        drafter="eagle",
        sizes=(1024, 8192),
        first_ids=seq,
        fit=memorize(gemma, seq, len(ids)),
    )


def test_ar_is_transformers_greedy_generate(gemma, prompt_and_ref):
    from decoder.core import Decoder

    ids, ref = prompt_and_ref
    assert Decoder(gemma, method="ar").generate(ids, MAX_NEW, stop=[]).tokens == ref


@pytest.mark.parametrize("method", [m for m in DECODER_METHODS if m != "ar"])
def test_every_method_answers_like_ar_and_keeps_drafts(method, gemma, prompt_and_ref, bundle):
    from decoder.core import Decoder

    ids, ref = prompt_and_ref
    out = Decoder(
        gemma, bundle if METHODS[method].needs_bundle or method == "hybrid" else None, method=method
    ).generate(ids, MAX_NEW, stop=[])
    assert out.tokens == ref, method
    drafted, kept = sum(s.drafted for s in out.steps), sum(s.accepted for s in out.steps)
    # a source that drafts the answer keeps it: fewer target forwards (the prefill's among them)
    # than tokens
    assert kept > 0 and out.tau > 1.0, f"{method}: {kept} of {drafted} drafts kept, τ {out.tau:.2f}"
