"""SPECTRA (decoder/drafts/spectra.py): CORE's forward/backward dictionaries and candidate pool,
RETRIEVAL's corpus index and refinement — crafted contexts whose next tokens are known; no model
except the last test."""

from __future__ import annotations

import json
import math
import random

import pytest

from decoder.drafts.spectra import Spectra, corpus_from_file, refine_by_perplexity, target_nll


def chains(tokens: list[int], parents: list[int]) -> set[tuple[int, ...]]:
    """Every root-to-node path of a proposed tree."""
    out = set()
    for i in range(len(tokens)):
        path, n = [], i
        while n >= 0:
            path.append(tokens[n])
            n = parents[n]
        out.add(tuple(reversed(path)))
    return out


def check_tree(tokens, parents, max_nodes, max_depth):
    assert len(tokens) == len(parents) <= max_nodes
    depth = []
    for i, p in enumerate(parents):
        assert -1 <= p < i  # parents always point to earlier nodes
        depth.append(1 if p < 0 else depth[p] + 1)
    assert max(depth, default=0) <= max_depth
    siblings = [(p, t) for p, t in zip(parents, tokens)]
    # a trie: no two children of one node carry the same token
    assert len(set(siblings)) == len(siblings)


def test_forward_dictionary_proposes_the_observed_chain():
    sp = Spectra(100)
    sp.observe([1, 5, 6, 7, 8, 2, 3, 9, 5, 4, 11])
    assert (6, 7, 8) in sp.fwd[5] and (4, 11) in sp.fwd[5]
    # the pending 5 follows 10, which S_bwd has never seen: the backward guess follows the newest 5
    # (→ 4 11 …), only the forward dictionary knows the older continuation 6 7 8
    assert sp.backward_guess([10, 5], 3)[0] == 4
    tokens, parents = sp.propose([10, 5], max_nodes=16, max_depth=4)
    check_tree(tokens, parents, 16, 4)
    assert (6, 7, 8) in chains(tokens, parents)
    assert (4, 11) in chains(tokens, parents)


def test_backward_dictionary_longer_prefix_wins():
    sp = Spectra(100, max_ngram=4)
    sp.observe([1, 2, 3, 9, 12])  # (2, 3) → 9 …
    sp.observe([7, 3, 4, 13])  # … but the newer (3,) → 4
    assert sp.bwd[(3,)] == 4 and sp.bwd[(2, 3)] == 9 and sp.bwd[(1, 2, 3)] == 9
    # the 2-token key (2, 3) beats the 1-token key (3,)
    assert sp.backward_guess([8, 2, 3], 2) == [9, 12]
    assert sp.backward_guess([8, 6, 3], 2) == [4, 13]  # only (3,) matches
    tokens, parents = sp.propose([8, 2, 3], max_nodes=16, max_depth=4)
    assert tokens[:2] == [9, 12] and parents[:2] == [-1, 0]  # the backward guess u comes first


def test_candidate_pool_learns_the_verifiers_predictions():
    sp = Spectra(100, refine_threshold=1.0)  # τ = 1: argmax only
    assert sp.propose([3, 9], 16, 4) == ([], [])  # nothing known yet
    # one forward verified [9 (pending), 20, 21]: 20 is a child of 9, 21 a child of 20; 20 rejected
    sp.update(
        inputs=[9, 20, 21],
        parents=[-1, 0, 1],
        top_ids=[[42, 43], [30, 31], [50, 51]],
        top_probs=[[0.9, 0.05], [0.6, 0.3], [0.7, 0.2]],
        accepted=[0],
        context=[1, 3, 9],
    )
    tokens, parents = sp.propose([5, 9], 16, 4)
    assert 42 in [t for t, p in zip(tokens, parents) if p == -1]
    # rejected nodes teach too
    assert sp.bwd[(3, 9)] == 42 and sp.bwd[(9, 20)] == 30 and sp.bwd[(20, 21)] == 50
    assert (20, 21, 50) in sp.fwd[9]
    # the next step's context holds the bonus token 42; its row (3 9 42) is fed as real text
    sp.update(
        inputs=[42],
        parents=[-1],
        top_ids=[[44]],
        top_probs=[[0.9]],
        accepted=[0],
        context=[1, 3, 9, 42],
    )
    assert (42, 44) in sp.fwd[9] and sp.bwd[(3, 9, 42)] == 44
    assert sp.propose([3, 9], 16, 4)[0][:2] == [42, 44]


def test_candidate_pool_explores_unseen_tokens():
    # τ = 0: always add the best token S_fwd has not seen after 9
    sp = Spectra(100, refine_threshold=0.0)
    step = dict(inputs=[9], parents=[-1], top_ids=[[42, 43, 44]], top_probs=[[0.5, 0.3, 0.2]])
    sp.update(**step, accepted=[0], context=[9])
    # the argmax last (most recent), S_bwd keeps the argmax
    assert list(sp.fwd[9]) == [(43,), (42,)]
    assert sp.bwd[(9,)] == 42
    sp.update(**step, accepted=[0], context=[9])  # the same step again
    assert (44,) in sp.fwd[9]  # 43 is known now: the next unseen one
    low = Spectra(100, refine_threshold=0.0, min_prob=0.35)
    low.update(
        inputs=[9],
        parents=[-1],
        top_ids=[[42, 43]],
        top_probs=[[0.7, 0.3]],
        accepted=[0],
        context=[9],
    )
    assert list(low.fwd[9]) == [(42,)]  # below min_prob: not worth a slot


def test_retrieval_fills_the_budget_after_core():
    sp = Spectra(100, retrieval_min_match=2)
    sp.add_corpus([[1, 2, 3, 4, 5, 6], [7, 8, 9]])
    tokens, parents = sp.propose([0, 2, 3], 16, 6)
    assert chains(tokens, parents) == {(4,), (4, 5), (4, 5, 6)}  # stops at the sequence's end
    # (9, 3) never occurs; a 1-token match is below the minimum
    assert sp.propose([0, 9, 3], 16, 6) == ([], [])
    sp.observe([3, 10, 11])  # CORE: after 3 comes 10 11
    tokens, parents = sp.propose([0, 2, 3], 16, 6)
    assert tokens == [10, 11, 4, 5, 6] and parents == [-1, 0, -1, 2, 3]  # CORE's guesses first
    for budget in range(6):
        t, p = sp.propose([0, 2, 3], budget, 6)
        assert t == [10, 11, 4, 5, 6][:budget]
        check_tree(t, p, budget, 6)
    t, p = sp.propose([0, 2, 3], 16, 2)
    assert t == [10, 11, 4, 5]
    check_tree(t, p, 16, 2)


def test_retrieval_longest_match_and_frequency():
    sp = Spectra(100, retrieval_min_match=1)
    sp.add_corpus([[5, 3, 7, 7], [2, 3, 8], [2, 3, 8], [6, 3, 9]])
    chains_all = chains(*sp.propose([2, 3], 16, 2))
    assert chains_all == {(8,)}  # (2, 3) occurs: only its continuations, not (3,)'s 7 and 9
    t, p = sp.propose([4, 3], 16, 2)
    assert t[0] in (7, 8, 9) and {c[0] for c in chains(t, p)} == {7, 8, 9}
    # the most frequent continuation of (3,) wins a budget of one
    assert sp.propose([4, 3], 1, 2)[0] == [8]


def test_propose_random_trees_are_valid():
    rng = random.Random(0)
    sp = Spectra(64)
    sp.add_corpus([[rng.randrange(64) for _ in range(200)] for _ in range(5)])
    for _ in range(200):
        ctx = [rng.randrange(64) for _ in range(rng.randrange(1, 30))]
        sp.observe(ctx)
        n, d = rng.randrange(0, 17), rng.randrange(1, 7)
        tokens, parents = sp.propose(ctx, n, d)
        check_tree(tokens, parents, n, d)


def test_tables_stay_bounded():
    rng = random.Random(1)
    sp = Spectra(
        5000, pool_width=3, fwd_keys=50, bwd_keys=200, refine_threshold=0.0, corpus_tokens=100
    )
    ctx = [1]
    for _ in range(500):
        n = rng.randrange(1, 9)
        inputs = [ctx[-1]] + [rng.randrange(5000) for _ in range(n)]
        parents = [-1] + [rng.randrange(i) for i in range(1, n + 1)]
        top = [[rng.randrange(5000) for _ in range(4)] for _ in inputs]
        sp.update(inputs, parents, top, [[0.4, 0.3, 0.2, 0.1]] * len(inputs), [0], ctx)
        ctx.append(top[0][0])
    sizes = sp.table_sizes()
    assert sizes["fwd_keys"] <= 50 and sizes["bwd_keys"] <= 200
    assert all(len(d) <= 3 for d in sp.fwd.values())
    assert sizes["fwd_keys"] == 50 and sizes["bwd_keys"] == 200  # really filled, then capped
    for _ in range(30):
        sp.add_corpus([[rng.randrange(5000) for _ in range(9)]])
    assert sp.table_sizes()["corpus_sequences"] == 10  # the newest 10 × (9 + separator) tokens


def test_refine_by_perplexity():
    seqs = [[1], [2], [3], [4], [5]]
    assert refine_by_perplexity(seqs, [3.0, 1.0, 5.0, 2.0, math.nan], 0.4) == [[2], [4]]
    assert refine_by_perplexity(seqs, [3.0, 1.0, 5.0, 2.0, 0.5], 0.2) == [[5]]
    assert refine_by_perplexity(seqs, [1.0] * 5, 1.0) == seqs
    with pytest.raises(Exception, match="keep"):
        refine_by_perplexity(seqs, [1.0] * 5, 0.0)


class CharTokenizer:
    """Characters as ids (what corpus_from_file needs of a tokenizer: batch call → input_ids)."""

    def __call__(self, texts, add_special_tokens=True):
        return {"input_ids": [[ord(c) for c in t] for t in texts]}


def test_corpus_from_file(tmp_path):
    jl = tmp_path / "data.jsonl"
    rec = {
        "id": 1,
        "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "ab"}],
    }
    jl.write_text(
        json.dumps(rec)
        + "\n"
        + json.dumps({"text": "cd"})
        + "\n"
        + "{not json\n"
        + json.dumps({"conversations": [{"from": "gpt", "value": "ef"}]})
        + "\n"
        + '{"text": "tor',
        encoding="utf-8",
    )
    tok = CharTokenizer()
    assert corpus_from_file(jl, tok, 10)[0] == [[97, 98], [99, 100], [101, 102]]
    assert corpus_from_file(jl, tok, 2)[0] == [[97, 98], [99, 100]]
    txt = tmp_path / "notes.txt"
    txt.write_text("one\ntwo\n\n\n three \n\nfour", encoding="utf-8")
    assert corpus_from_file(txt, tok, 10) == (
        [
            [ord(c) for c in "one\ntwo"],
            [ord(c) for c in "three"],
            # text: no NLL
            [ord(c) for c in "four"],
        ],
        [None, None, None],
    )
    with pytest.raises(Exception, match="not found"):
        corpus_from_file(tmp_path / "missing.jsonl", tok, 10)


def test_target_nll_matches_unbatched(tiny_llama_dir):
    import torch

    from polyspec.targets import load_target

    target = load_target(str(tiny_llama_dir))
    tok = target.tokenizer
    seqs = [
        tok("xin chào thế giới", add_special_tokens=False)["input_ids"],
        tok("hello", add_special_tokens=False)["input_ids"],
        [],
        tok("guten Morgen, wie geht es dir heute?", add_special_tokens=False)["input_ids"],
    ]
    batched = target_nll(target, seqs, batch_size=8)
    single = target_nll(target, seqs, batch_size=1)
    assert batched[2] == math.inf
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    with torch.inference_mode():
        for s, b, one in zip(seqs, batched, single):
            if not s:
                continue
            ids = torch.tensor([bos + s])
            lp = torch.log_softmax(target.model(input_ids=ids).logits[0, :-1].float(), -1)
            ref = -lp.gather(1, ids[0, 1:, None]).mean().item()
            assert b == pytest.approx(ref, rel=1e-4) and one == pytest.approx(ref, rel=1e-4)
    sp = Spectra(target.vocab_size)
    kept = refine_by_perplexity(seqs, batched, 0.5)
    assert len(kept) == 2 and [] not in kept
    sp.add_corpus(kept)


def test_refined_corpus_is_scored_once_and_cached_on_disk(
    tiny_llama_dir, isolated_cache, monkeypatch, tmp_path
):
    import decoder.drafts.spectra as spectra
    from polyspec.targets import load_target

    target = load_target(str(tiny_llama_dir))
    corpus = tmp_path / "data.jsonl"
    corpus.write_text(
        "\n".join(
            json.dumps({"text": t})
            for t in [
                "xin chào thế giới",
                "hello there",
                "guten Morgen, wie geht es dir?",
                "bonjour",
            ]
        )
        + "\n"
    )
    kept, scored = spectra.refined_corpus(target, [corpus], keep=0.5)
    assert scored == 4 and len(kept) == 2
    assert len(list((isolated_cache / "spectra").glob("*.json"))) == 1

    def no_scoring(*a, **k):
        raise AssertionError("scored again")

    monkeypatch.setattr(spectra, "target_nll", no_scoring)
    assert spectra.refined_corpus(target, [corpus], keep=0.5) == (kept, 4)  # from the disk cache
    # other settings or another corpus: scored afresh
    with pytest.raises(AssertionError, match="scored again"):
        spectra.refined_corpus(target, [corpus], keep=0.75)
    original = corpus.read_text()
    corpus.write_text(json.dumps({"text": "một văn bản khác"}) + "\n")
    with pytest.raises(AssertionError, match="scored again"):
        spectra.refined_corpus(target, [corpus], keep=0.5)
    corpus.write_text(original)
    # broken: ignored, scored afresh
    next((isolated_cache / "spectra").glob("*.json")).write_text("{torn")
    monkeypatch.setattr(spectra, "target_nll", lambda t, seqs: [float(len(s)) for s in seqs])
    kept2, _ = spectra.refined_corpus(target, [corpus], keep=0.5)
    shortest = sorted(map(len, spectra.corpus_from_file(corpus, target.tokenizer, 400)[0]))[:2]
    assert sorted(map(len, kept2)) == shortest  # the lowest "perplexity" (here: length) kept
    monkeypatch.setattr(spectra, "target_nll", no_scoring)
    assert spectra.refined_corpus(target, [corpus], keep=0.5) == (kept2, 4)  # rewritten, read back
    assert spectra.refined_corpus(target, [tmp_path / "missing.jsonl"]) == ([], 0)


def test_recorded_nll_ranks_the_corpus_without_a_scoring_pass(
    tiny_llama_dir, isolated_cache, monkeypatch, tmp_path
):
    import decoder.drafts.spectra as spectra
    from polyspec.targets import load_target

    target = load_target(str(tiny_llama_dir))

    def no_scoring(*a, **k):
        raise AssertionError("scored")

    monkeypatch.setattr(spectra, "target_nll", no_scoring)
    answers = [
        ("xin chào thế giới", 2.5),
        ("hello there", 0.5),
        ("guten Morgen", 1.5),
        ("bonjour", 3.0),
    ]
    recs = [
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": a, "nll": n}]}
        for a, n in answers
    ]
    corpus = tmp_path / "distill.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in recs))
    seqs, nll = spectra.corpus_from_file(corpus, target.tokenizer, 400)
    assert nll == [2.5, 0.5, 1.5, 3.0] and len(seqs) == 4
    kept, scored = spectra.refined_corpus(target, [corpus], keep=0.5)  # no target forward
    assert scored == 4 and kept == [seqs[1], seqs[2]]  # the two lowest recorded NLLs, corpus order
    # one answer without a recorded NLL (or a non-finite one): every sequence is scored, one measure
    # for all
    for missing in (
        {"from": "gpt", "value": "một câu khác"},
        {"from": "gpt", "value": "một câu khác", "nll": "nan"},
    ):
        corpus.write_text(corpus.read_text() + json.dumps({"conversations": [missing]}) + "\n")
        with pytest.raises(AssertionError, match="scored"):
            spectra.refined_corpus(target, [corpus], keep=0.5)


def test_a_missing_explicit_spectra_corpus_is_a_clear_error(tiny_llama_dir, tmp_path):
    from decoder.core import Decoder
    from polyspec.errors import PolyspecError
    from polyspec.targets import load_target

    target = load_target(str(tiny_llama_dir))
    with pytest.raises(PolyspecError, match="spectra corpus not found"):
        Decoder(target, method="spectra", spectra_corpus=tmp_path / "missing.jsonl")
