"""vocab/: counting, ranking, coverage/overlap, language masks (ADASPEC Alg. 2 lines 6–18),
validation."""

import json

import numpy as np
import pytest
import torch

from conftest import run_cli
from polyspec.config import validate
from polyspec.errors import PolyspecError
from polyspec.languages import get_language
from polyspec.targets import load_target
from vocab.__main__ import parse_sources
from vocab.analysis import coverage_curve, k_for_coverage, overlap_matrix, prompt_coverage_curve
from vocab.build import run_vocab
from vocab.config import SourceConfig, VocabConfig
from vocab.count import count_documents, rank, structural_ids
from vocab.files import load_ranked, with_prompt_ids
from vocab.masks import build_masks, load_masks, save_masks, size_offsets
from vocab.sources import documents

# ------------------------------------------------------------------------------------------- masks


def build_vocab(run_dir, target_dir, lang: str = "vi", **settings) -> dict:
    """``run_vocab`` of ``lang`` into ``run_dir`` with 64-id masks; ``settings``: the rest."""
    base = {"langs": [lang], "target": str(target_dir), "run": str(run_dir), "mask_sizes": [64]}
    return run_vocab(validate(VocabConfig, {**base, **settings}), log=lambda *_: None)


def vocab_cli(target_dir, run_dir, sources: str, *extra: str):
    """``python -m vocab --langs vi --sources … --target … --run …``, then ``extra``."""
    args = ["--sources", sources, "--target", str(target_dir), "--run", str(run_dir), *extra]
    return run_cli("-m", "vocab", "--langs", "vi", *args)


def test_mask_rows_are_top_s_ids_in_row_order_s_times_L_plus_l(tmp_path):
    rng = np.random.default_rng(0)
    V, sizes = 50, [3, 7, 12]
    ranked = [rng.permutation(V)[:20].astype(np.int32) for _ in range(4)]  # 4 languages
    mask = build_masks(ranked, sizes, V)
    L = len(ranked)
    assert mask.shape == (L * len(sizes), V) and mask.dtype == torch.bool
    for s, size in enumerate(sizes):
        for l, ids in enumerate(ranked):
            row = mask[s * L + l]
            assert set(torch.nonzero(row).flatten().tolist()) == set(ids[:size].tolist())
    # ADASPEC Alg. 2 literally: for l, for s, for t in range(s): M[s*|L| + l, V_l[t]] = 1
    ref = torch.zeros_like(mask)
    for l in range(L):
        for s in range(len(sizes)):
            for t in range(sizes[s]):
                ref[s * L + l, int(ranked[l][t])] = True
    assert torch.equal(mask, ref)
    path = save_masks(tmp_path / "m.safetensors", mask, ["vi", "de", "ja", "en"], sizes)
    back, langs, sz = load_masks(path)
    assert torch.equal(back, mask) and langs == ["vi", "de", "ja", "en"] and sz == sizes
    from safetensors.numpy import load_file

    packed = load_file(path)["mask_packed"]
    assert packed.dtype == np.uint8 and packed.shape == (12, (V + 7) // 8)  # bit-packed along |V|


def test_size_offsets_favour_smaller_sizes():
    off = size_offsets(num_languages=2, num_sizes=3, z=2)
    assert off.tolist() == [4, 4, 2, 2, 0, 0]


def test_mask_sizes_are_validated():
    with pytest.raises(PolyspecError, match="exceeds the ranked list"):
        build_masks([np.arange(5)], [8], 10)
    with pytest.raises(PolyspecError, match="increasing order"):
        validate(VocabConfig, {"mask_sizes": [16, 8]})


def test_corrupted_mask_file_is_one_line_error(tmp_path):
    bad = tmp_path / "m.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(PolyspecError) as e:
        load_masks(bad)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------- counting


def test_rank_puts_structural_first_then_count_then_id():
    counts = np.array([5, 0, 9, 5, 1, 9, 0], dtype=np.int64)
    assert rank(counts, first=[6, 4]).tolist() == [6, 4, 2, 5, 0, 3]


def test_rank_tail_covers_the_vocabulary_by_the_other_languages_counts():
    counts = np.array([0, 3, 0, 1, 0, 0], dtype=np.int64)
    tail = np.array([0.0, 0.0, 0.2, 0.0, 0.5, 0.2])
    assert rank(counts, first=[0], tail_counts=tail).tolist() == [0, 1, 3, 4, 2, 5]


def test_wordfreq_forms_follow_running_text():
    from vocab.sources import wordfreq_items

    de = dict(wordfreq_items(get_language("de"), space_share=0.8, capital_share=0.2))
    assert de[" und"] > de["und"] > 0 and de[" Und"] == pytest.approx(de[" und"] * 0.25)
    ja = dict(wordfreq_items(get_language("ja"), space_share=0.8))
    assert "の" in ja and " の" not in ja


def test_capital_share_is_measured_on_the_seeds_so_german_nouns_keep_their_capital():
    from vocab.sources import seed_capital_share, wordfreq_items

    de, en = get_language("de"), get_language("en")
    # German capitalises its nouns
    assert seed_capital_share(de) > 0.25 and 0.05 < seed_capital_share(en) < 0.2
    assert seed_capital_share(get_language("ja")) == 0.0
    share = seed_capital_share(de)
    forms = dict(wordfreq_items(de, space_share=0.8))  # the default: the seeds' share
    assert forms[" Haus"] / forms[" haus"] == pytest.approx(share / (1 - share))


def test_structural_ids_include_punctuation_and_digits(tiny_gemma_dir):
    t = load_target(str(tiny_gemma_dir))
    ids = structural_ids(t.tokenizer, t.spec.prompt_format.stop)
    assert ids[0] == t.tokenizer.bos_token_id or t.tokenizer.bos_token_id in ids[:4]
    for ch in (".", ",", "?"):
        enc = t.tokenizer(ch, add_special_tokens=False)["input_ids"]
        if len(enc) == 1:
            assert enc[0] in ids
    assert len(set(ids)) == len(ids)


def test_count_documents_holds_out_every_kth(tiny_gemma_dir):
    t = load_target(str(tiny_gemma_dir))
    texts = [f"Tài liệu số {i} về lá cây." for i in range(30)]
    c = count_documents(iter(texts), t.tokenizer, t.vocab_size, batch_size=7, heldout_every=10)
    assert c.documents == 27 and c.heldout_documents == 3
    total = sum(len(t.tokenizer(x, add_special_tokens=False)["input_ids"]) for x in texts)
    assert c.counts.sum() + c.heldout.sum() == total == c.tokens + c.heldout.sum()


def test_coverage_and_overlap_math():
    ranked = np.array([3, 1, 2, 0])
    held = np.array([1, 2, 3, 4])  # tokens 3 (4x), 2 (3x), 1 (2x), 0 (1x)
    assert coverage_curve(ranked, held, [1, 2, 4]) == {"1": 0.4, "2": 0.6, "4": 1.0}
    assert k_for_coverage(ranked, held, (0.5, 0.95)) == {"50%": 2, "95%": 4}
    m = overlap_matrix({"a": np.array([1, 2, 3, 4]), "b": np.array([4, 3, 9, 8])}, k=2)
    assert m["a"]["a"] == 1.0 and m["a"]["b"] == 0.0 and m["b"]["a"] == 0.0


# ------------------------------------------------------------------------------------------- stage


@pytest.fixture
def corpus(tmp_path):
    """A local FineWeb-like dataset per language: jsonl with a 'text' column."""
    root = tmp_path / "corpus"
    for code in ("vi", "de"):
        lang = get_language(code)
        texts = [s.response for s in lang.seeds] * 5 + [s.instruction for s in lang.seeds] * 5
        (root / code).mkdir(parents=True)
        with open(root / code / "part-0.jsonl", "w", encoding="utf-8") as f:
            for i, t in enumerate(texts):
                f.write(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n")
    return root


@pytest.mark.slow
def test_stage_end_to_end_on_local_fineweb_schema(tmp_path, tiny_gemma_dir, corpus):
    cfg = validate(
        VocabConfig,
        {
            "langs": ["vi", "de"],
            "target": str(tiny_gemma_dir),
            "run": str(tmp_path / "run"),
            "sources": [
                {"name": "fineweb2", "path": str(corpus / "{lang}")},
                {"name": "wordfreq", "weight": 0.5},
            ],
            "mask_sizes": [64, 128],
            "coverage_ks": [16, 64, 256],
            "overlap_k": 160,
        },
    )
    summary = run_vocab(cfg, log=lambda *_: None)
    out = tmp_path / "run" / "vocab"
    for f in (
        "vi.safetensors",
        "vi.json",
        "de.safetensors",
        "coverage.json",
        "coverage.png",
        "overlap.json",
        "overlap.png",
        "language_masks.safetensors",
        "summary.json",
    ):
        assert (out / f).is_file(), f
    target = load_target(str(tiny_gemma_dir))
    vi = load_ranked(out / "vi.safetensors", tokenizer_sha256=target.tokenizer_sha256)
    first = structural_ids(target.tokenizer, target.spec.prompt_format.stop)
    assert vi.ranked_ids[: len(first)].tolist() == first
    rest = vi.counts[len(first) :]
    assert (np.diff(rest) <= 0).all(), "descending counts after the structural tokens"
    # tail covers |V|
    assert len(set(vi.ranked_ids.tolist())) == len(vi.ranked_ids) == target.vocab_size
    assert (vi.counts[: vi.meta["seen_ids"]] > 0).sum() >= vi.meta["seen_ids"] - len(first)
    assert (vi.counts[len(first) + vi.meta["seen_ids"] :] == 0).all()
    assert vi.meta["heldout"]["kind"] == "split" and vi.meta["heldout"]["documents"] == 6
    assert [s["name"] for s in vi.meta["sources"]] == ["fineweb2", "wordfreq"]
    cov = summary["coverage"]["vi"]
    assert 0 < cov["16"] <= cov["64"] <= cov["256"] <= 1
    overlap = json.loads((out / "overlap.json").read_text())["overlap"]
    assert overlap["vi"]["vi"] == 1.0 and overlap["vi"]["de"] < 1.0
    mask, langs, sizes = load_masks(out / "language_masks.safetensors")
    assert langs == ["vi", "de"] and sizes == [64, 128] and mask.shape == (4, target.vocab_size)
    assert set(torch.nonzero(mask[2 + 1]).flatten().tolist()) == set(
        load_ranked(out / "de.safetensors").top(128).tolist()
    )


def test_a_requests_head_keeps_the_prompts_ids_within_its_size():
    ranked = np.arange(100, 0, -1)  # rank order: 100, 99, …, 1
    # all within the top 10: the block as is
    ids, added = with_prompt_ids(ranked, 10, [100, 95, 91])
    assert added == 0 and ids.tolist() == list(range(100, 90, -1))
    ids, added = with_prompt_ids(ranked, 10, [95, 3, 7, 7, 50])  # 3, 7, 50 rank below 10
    assert added == 3 and len(ids) == 10 and len(set(ids.tolist())) == 10
    # 95 kept in the block
    assert ids[:7].tolist() == list(range(100, 93, -1)) and sorted(ids[7:].tolist()) == [3, 7, 50]
    # the block stays a prefix: 91 (its last row) moves behind it
    ids, added = with_prompt_ids(ranked, 10, [91, 1, 2])
    assert ids.tolist() == [100, 99, 98, 97, 96, 95, 94, 1, 2, 91] and added == 3
    ids, added = with_prompt_ids(ranked, 10, list(range(1, 40)))  # at most size // 2 prompt ids
    assert added == 5 and len(ids) == 10
    # a short list has room: nothing dropped
    ids, added = with_prompt_ids(np.arange(5, 0, -1), 10, [42, 43])
    assert ids.tolist() == [5, 4, 3, 2, 1, 42, 43] and added == 2
    docs = [([100, 3, 3, 42], [3, 9]), ([100, 99, 42], [])]  # answer ids, prompt ids
    # top-2 ∪ {3, 9} / top-2
    assert prompt_coverage_curve(ranked, docs, [2]) == {"2": (1 + 2 + 2) / 7}
    assert coverage_curve(
        ranked.astype(np.int64), np.bincount([100, 3, 3, 42, 100, 99, 42], minlength=101)[:101], [2]
    ) == {"2": 3 / 7}


def test_coverage_on_held_out_answers_counts_the_prompts_ids_too(tmp_path, tiny_gemma_dir):
    """heldout=answers: coverage.json also gives the coverage of the head the decoder builds for
    each request (the top-k ids with the answer's prompt ids among them), never below the plain
    curve."""
    target = load_target(str(tiny_gemma_dir))
    held = tmp_path / "synth" / "vi-heldout"
    held.mkdir(parents=True)
    rows = [
        ("Hãy nhắc lại: Zorblax Quintaphor", "Zorblax Quintaphor Zorblax"),
        ("Xin chào", "Chào bạn"),
    ]
    held.joinpath("data.jsonl").write_text(
        "".join(
            json.dumps(
                {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}
            )
            + "\n"
            for q, a in rows
        )
    )
    summary = build_vocab(tmp_path, tiny_gemma_dir, coverage_ks=[16, 64], heldout="answers")
    cov = json.loads((tmp_path / "vocab" / "coverage.json").read_text())
    plain, withp = cov["coverage"]["vi"], cov["coverage_with_prompt_ids"]["vi"]
    assert summary["coverage_with_prompt_ids"]["vi"] == withp
    # the copied name is covered
    assert all(withp[k] >= plain[k] for k in plain) and withp["16"] > plain["16"]
    from vocab.build import heldout_answer_docs

    docs = heldout_answer_docs(
        validate(VocabConfig, {"langs": ["vi"], "run": str(tmp_path)}), get_language("vi"), target
    )
    # the prompt in the target's format
    assert [len(a) for a, _ in docs] and all(p for _, p in docs)
    ranked = load_ranked(tmp_path / "vocab" / "vi.safetensors").ranked_ids
    assert withp == prompt_coverage_curve(ranked, docs, [16, 64])


def test_wordfreq_only_measures_coverage_on_other_text(tmp_path, tiny_llama_dir):
    summary = build_vocab(tmp_path, tiny_llama_dir, "ja", coverage_ks=[64, 256])
    assert summary["heldout"]["ja"]["kind"] == "seeds" and summary["heldout"]["ja"]["tokens"] > 0


def test_wrong_tokenizer_is_refused(tmp_path, tiny_gemma_dir, tiny_llama_dir):
    build_vocab(tmp_path, tiny_gemma_dir)
    other = load_target(str(tiny_llama_dir)).tokenizer_sha256
    with pytest.raises(PolyspecError) as e:
        load_ranked(tmp_path / "vocab" / "vi.safetensors", tokenizer_sha256=other)
    assert "another tokenizer" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(PolyspecError, match="larger than the ranked list"):
        load_ranked(tmp_path / "vocab" / "vi.safetensors").top(10**6)


def test_empty_corpus_and_missing_data_are_clear_errors(tmp_path, tiny_gemma_dir):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(PolyspecError, match="empty corpus"):
        build_vocab(tmp_path, tiny_gemma_dir, sources=[{"name": "files", "path": str(empty)}])
    none = str(tmp_path / "none*.txt")
    with pytest.raises(PolyspecError, match="no txt/jsonl/parquet"):
        build_vocab(tmp_path, tiny_gemma_dir, sources=[{"name": "files", "path": none}])
    # no synth output for this language in the run
    with pytest.raises(PolyspecError, match="gave no tokens"):
        build_vocab(tmp_path, tiny_gemma_dir, sources=[{"name": "synth"}], heldout="seeds")
    with pytest.raises(PolyspecError, match="would measure coverage on the text that was counted"):
        build_vocab(tmp_path, tiny_gemma_dir, sources=[{"name": "synth"}], heldout="synth")


def test_online_sources_fail_in_one_line_when_offline(tmp_path, tiny_gemma_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cfg = validate(
        VocabConfig,
        {
            "langs": ["vi"],
            "target": str(tiny_gemma_dir),
            "run": str(tmp_path),
            "sources": [{"name": "wikipedia", "max_tokens": 1000}],
        },
    )
    with pytest.raises(PolyspecError) as e:
        run_vocab(cfg, log=lambda *_: None)
    assert "wikimedia/wikipedia" in str(e.value) and "\n" not in str(e.value)


def test_cli(tmp_path, tiny_gemma_dir, corpus):
    proc = vocab_cli(
        tiny_gemma_dir, tmp_path, f"files={corpus / 'vi'},wordfreq@0.2", "mask_sizes=[32,64]"
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["mask_sizes"] == [32, 64]
    bad = run_cli(
        "-m", "vocab", "--langs", "vi,qq", "--target", str(tiny_gemma_dir), "--run", str(tmp_path)
    )
    assert bad.returncode == 2 and "'qq'" in bad.stderr and bad.stderr.count("\n") == 1


# ------------------------------------------------------------------------------- bounded streaming


def test_sources_cli_syntax_sets_caps_and_options():
    assert parse_sources(
        "fineweb2@1.0:max_tokens=50M,wikipedia@0.5:max_tokens=2.5k:max_documents=100,wordfreq"
    ) == [
        {"name": "fineweb2", "weight": 1.0, "max_tokens": 50_000_000},
        {"name": "wikipedia", "weight": 0.5, "max_tokens": 2500, "max_documents": 100},
        {"name": "wordfreq"},
    ]
    assert parse_sources(
        "files:text_field=body:max_tokens=1000=/d/a=b/*.jsonl,fineweb2:dataset=/mirror/fw2"
    ) == [
        {"name": "files", "text_field": "body", "max_tokens": 1000, "path": "/d/a=b/*.jsonl"},
        {"name": "fineweb2", "dataset": "/mirror/fw2"},
    ]
    assert parse_sources("files=/data/x.jsonl") == [{"name": "files", "path": "/data/x.jsonl"}]
    for bad, why in [
        ("fineweb2:max_tokens=lots", "not a count"),
        ("fineweb2:weight=2", "name\\[@weight\\]"),
        ("fineweb2@x", "not a number"),
        ("fineweb2:max_tokens", "expected name"),
    ]:
        with pytest.raises(PolyspecError, match=why):
            parse_sources(bad)
    # other options: SourceConfig's fields
    with pytest.raises(PolyspecError, match="sources.0.colour: unknown key"):
        validate(VocabConfig, {"sources": parse_sources("fineweb2:colour=red")})
    with pytest.raises(PolyspecError, match="dataset is for fineweb2/wikipedia"):
        validate(VocabConfig, {"sources": parse_sources("synth:dataset=/x")})


def test_gpu_profile_caps_every_streamed_source():
    from pipelines.__main__ import load_profile

    for src in parse_sources(load_profile("gpu-paper").vocab.sources):
        if src["name"] in ("fineweb2", "wikipedia"):
            assert src.get("max_tokens", 0) >= 10**6, src


@pytest.fixture
def fineweb2_snapshot(tmp_path):
    """A local folder laid out like the HuggingFaceFW/fineweb-2 repo: README.md `configs` (one per
    language, split train) over parquet shards with FineWeb-2's columns. vie_Latn: 3 shards × 40
    documents."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "fineweb-2"
    readme = ["---", "configs:"]
    for code, config, shards in (("vi", "vie_Latn", 3), ("de", "deu_Latn", 1)):
        readme += [
            f"- config_name: {config}",
            "  data_files:",
            "  - split: train",
            f"    path: data/{config}/train/*.parquet",
        ]
        seeds = get_language(code).seeds
        (root / "data" / config / "train").mkdir(parents=True)
        for k in range(shards):
            texts = [f"{seeds[i % len(seeds)].response} ({config} {k}-{i})" for i in range(40)]
            table = pa.table(
                {
                    "text": texts,
                    "id": [f"<urn:{config}:{k}:{i}>" for i in range(40)],
                    "url": [f"https://example.org/{i}" for i in range(40)],
                    "language": [config] * 40,
                    "language_score": [0.99] * 40,
                }
            )
            pq.write_table(table, root / "data" / config / "train" / f"{k:03d}_00000.parquet")
    (root / "README.md").write_text(
        "\n".join([*readme, "---", "A FineWeb-2 stand-in for tests.", ""]), encoding="utf-8"
    )
    return root


def test_hub_path_streams_a_local_snapshot_and_stops_at_the_token_cap(
    tmp_path, tiny_gemma_dir, fineweb2_snapshot, monkeypatch
):
    import datasets

    calls = []
    real = datasets.load_dataset

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    vi = get_language("vi")
    docs = list(
        documents(SourceConfig(name="fineweb2", dataset=str(fineweb2_snapshot)), vi, tmp_path)
    )
    assert calls == [
        ((str(fineweb2_snapshot),), {"name": "vie_Latn", "split": "train", "streaming": True})
    ]
    # the language's config, every shard
    assert len(docs) == 120 and all("(vie_Latn " in d for d in docs)

    tok = load_target(str(tiny_gemma_dir), with_model=False).tokenizer
    per_doc = max(len(ids) for ids in tok(docs, add_special_tokens=False)["input_ids"])
    cap = 2000
    proc = vocab_cli(
        tiny_gemma_dir,
        tmp_path,
        f"fineweb2:dataset={fineweb2_snapshot}:max_tokens={cap}",
        "batch_size=4",
        "heldout_every=5",
        "mask_sizes=[32]",
        "coverage_ks=[16,32]",
    )
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((tmp_path / "vocab" / "vi.json").read_text())
    (src,) = meta["sources"]
    # the stream stopped at the first batch (4 documents) that reached the cap, long before its 120
    # documents
    assert cap <= src["tokens"] < cap + 4 * per_doc
    assert src["documents"] + meta["heldout"]["documents"] < 120


def test_synth_source_skips_a_torn_line(tmp_path, capsys):
    d = tmp_path / "synth" / "vi"
    d.mkdir(parents=True)
    conv = [{"from": "human", "value": "Xin chào"}, {"from": "gpt", "value": "Chào bạn"}]
    (d / "data.jsonl").write_text(
        json.dumps({"conversations": conv}, ensure_ascii=False) + '\n{"conversations": [{"fr',
        encoding="utf-8",
    )
    assert list(documents(SourceConfig(name="synth"), get_language("vi"), tmp_path)) == [
        "Xin chào\nChào bạn"
    ]
    assert "skipped 1 torn or malformed line" in capsys.readouterr().err


def test_synth_source_never_counts_either_held_out_set(tmp_path):
    for name, text in (
        ("en", "kept"),
        ("en-distill", "answer"),
        ("en-heldout", "held"),
        ("en-heldout-chat", "chat"),
    ):
        d = tmp_path / "synth" / name
        d.mkdir(parents=True)
        conv = [{"from": "human", "value": text}]
        (d / "data.jsonl").write_text(json.dumps({"conversations": conv}) + "\n")
    got = documents(SourceConfig(name="synth"), get_language("en"), tmp_path)
    assert sorted(got) == ["answer", "kept"]


def test_coverage_on_eval_answers_counts_every_turn_and_leaves_mixed_out(
    tmp_path, tiny_gemma_dir, capsys
):
    import numpy as np

    from vocab.coverage import main as coverage_main
    from vocab.files import RankedVocab, save_ranked

    target = load_target(str(tiny_gemma_dir))
    tok = target.tokenizer
    a, b = "xin chào bạn", "tạm biệt"
    ids_a, ids_b = (
        tok(a, add_special_tokens=False)["input_ids"],
        tok(b, add_special_tokens=False)["input_ids"],
    )
    # ranked list: a's ids first, then the rest of the vocabulary
    first = list(dict.fromkeys(ids_a))
    rest = [i for i in range(target.vocab_size) if i not in first]
    ranked = np.asarray(first + rest, dtype=np.int32)
    save_ranked(
        tmp_path / "vocab",
        RankedVocab(
            "vi",
            ranked,
            np.zeros(len(ranked), dtype=np.int64),
            {"tokenizer_sha256": target.tokenizer_sha256},
        ),
    )
    answers = tmp_path / "eval" / "answers" / "ar.jsonl"
    answers.parent.mkdir(parents=True)
    answers.write_text(
        "\n".join(
            json.dumps(r, ensure_ascii=False)
            for r in [
                {"language": "vi", "category": "qa", "turns": [a, b]},
                # mixed: not one vocabulary's text
                {"language": "vi", "category": "mixed", "turns": [b * 5]},
                # no de vocabulary
                {"language": "de", "category": "qa", "turns": ["hallo"]},
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    k = len(first)
    assert (
        coverage_main(
            [
                "--run",
                str(tmp_path),
                "--target",
                str(tiny_gemma_dir),
                "--ks",
                f"{k},{target.vocab_size}",
            ]
        )
        == 0
    )
    got = json.loads((tmp_path / "eval" / "coverage.json").read_text())["languages"]
    assert (
        set(got) == {"vi"}
        and got["vi"]["answers"] == 2
        and got["vi"]["tokens"] == len(ids_a) + len(ids_b)
    )
    covered = sum(1 for i in ids_a + ids_b if i in first)
    assert got["vi"]["coverage"][str(k)] == pytest.approx(covered / (len(ids_a) + len(ids_b)))
    assert got["vi"]["coverage"][str(target.vocab_size)] == 1.0
    assert (
        f"vi: {len(ids_a) + len(ids_b)} tokens in 2 answers · top-{k}: " in capsys.readouterr().out
    )
    with pytest.raises(SystemExit) as e:
        coverage_main(
            [
                "--run",
                str(tmp_path),
                "--target",
                str(tiny_gemma_dir),
                "--answers",
                str(tmp_path / "no.jsonl"),
            ]
        )
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no.jsonl is missing" in err and err.count("\n") == 1
