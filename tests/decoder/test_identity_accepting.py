"""Greedy identity with a drafter the target mostly accepts.

A random drafter is rejected at almost every step, so an identity test with one mostly runs the
"reject, take the target's token" path. Here the drafter is the tiny Llama target itself with a
little noise on its weights (the ``oracle`` of ``conftest.make_tiny_bundle``): most drafts are kept,
so multi-token acceptance, the cache and feature bookkeeping after a long accepted run, and partial
acceptance at the end of a chain or branch are what every step exercises. Each drafter method must
give the target's own greedy tokens AND keep most of what it drafts. (EAGLE-1/EAGLE-3 drafters are
exercised by tests/decoder/test_decoder.py and tests/decoder/test_bench.py with random weights; an
accepted EAGLE drafter needs training, see tests/train/test_train.py's echo drafter.)"""

from __future__ import annotations

import pytest
import torch

from conftest import make_tiny_bundle
from polyspec.targets import greedy_generate, load_target

# as the decoder tests' oracles: measured 0.81–0.89 of chain drafts kept (0.02: 0.88–0.94)
NOISE = 0.05
MAX_NEW = 40

# method, options, and the tree depth (None: judged as a chain). Chains must keep more than half of
# what they draft (accepted / drafted over the run). A tree verifies all its nodes but keeps one
# branch, so accepted / drafted is at most depth / nodes by construction; a tree must instead keep
# more than half its depth per drafting step. hybrid's steps are mostly one chain (the drafter's or
# prompt lookup's) with few SPECTRA nodes beside it: judged as a chain (measured: 0.65 kept with
# this drafter, 0.43 by its training-free sources alone, 0.40 with noise 0.6).
METHODS = [
    ("chain", dict(gamma=4), None),
    ("tree", dict(tree_depth=4, tree_topk=2, tree_nodes=8), 4),
    ("adaspec", dict(gamma=4, lookup_runs=False), None),
    ("adaspec", dict(shape="tree", tree_depth=4, tree_topk=2, tree_nodes=8, lookup_runs=False), 4),
    ("spide", dict(gamma_max=6), None),
    ("hybrid", dict(tree_nodes=10), None),
]


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    return load_target(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def accepting_bundle(tmp_path_factory, llama):
    """An oracle drafter; the decoders use its whole vocabulary (768 ids: no token is out of its
    reach)."""
    return make_tiny_bundle(
        tmp_path_factory.mktemp("accepting") / "bundle",
        llama,
        drafter="oracle",
        noise=NOISE,
        sizes=(256, 768),
    )


@pytest.fixture(scope="module")
def prompts_and_refs(llama):
    g = torch.Generator().manual_seed(11)
    prompts = [
        torch.randint(4, llama.vocab_size, (int(n),), generator=g).tolist()
        for n in torch.randint(3, 40, (6,), generator=g)
    ]
    return prompts, [greedy_generate(llama, p, MAX_NEW) for p in prompts]


def acceptance(method, opts, bundle, target, prompts, refs) -> tuple[float, float]:
    """Decode every prompt, assert identity; return (accepted / drafted, accepted per step with a
    draft)."""
    from decoder.core import Decoder

    dec = Decoder(target, bundle, method=method, size="full", **opts)
    drafted = accepted = drafting_steps = 0
    for k, (prompt, ref) in enumerate(zip(prompts, refs)):
        out = dec.generate(prompt, MAX_NEW, stop=[])
        assert out.tokens == ref, (method, opts, k)
        drafted += sum(s.drafted for s in out.steps)
        accepted += sum(s.accepted for s in out.steps)
        drafting_steps += sum(1 for s in out.steps if s.drafted)
    assert drafted > 0 and drafting_steps > 0, f"{method}: never drafted"
    return accepted / drafted, accepted / drafting_steps


@pytest.mark.parametrize(
    "method,opts,depth",
    METHODS,
    ids=["chain", "tree", "adaspec-chain", "adaspec-tree", "spide", "hybrid"],
)
def test_a_mostly_accepted_drafter_gives_the_targets_own_tokens(
    method, opts, depth, llama, accepting_bundle, prompts_and_refs
):
    rate, per_step = acceptance(method, opts, accepting_bundle, llama, *prompts_and_refs)
    if depth is None:
        assert rate > 0.5, f"{method} {opts}: kept {rate:.2f} of its drafts"
    else:
        assert per_step > depth / 2, (
            f"{method} {opts}: kept {per_step:.2f} tokens per drafting step of depth {depth}"
        )
