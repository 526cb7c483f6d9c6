"""Target features captured while the target generates (issue 14 items 1–3): the engine's capture
equals a separate full forward, distill writes shards every accepted record names (resumable,
bounded, refused for another target and by vLLM), multi-turn prompts are answered turn by turn, and
drafters train on the shards with the loss of online features."""

import json
import math
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run_cli, tiny_train_overrides
from polyspec.config import apply_overrides, validate
from polyspec.errors import PolyspecError
from polyspec.features import FeatureReader
from polyspec.prompts import encode, render, truncate_at_stop
from polyspec.targets import eagle3_layers, greedy_generate, load_target
from synth.config import DistillConfig
from synth.distill import run_distill
from synth.engines import Request, TransformersEngine, VLLMEngine
from synth.filters import strip_leakage
from synth.selfsynth import derive_seed
from train.config import TrainConfig
from train.data import build_dataset
from train.drafter import DrafterRecipe, run
from train.objectives import target_features

PROMPTS = [
    "Xin chào",
    "Warum fallen im Herbst die Blätter von den Bäumen?",
    "日本の首都はどこですか？",
    "Bonjour à tous, comment allez-vous aujourd'hui ?",
    "Viết một bài thơ ngắn về mùa thu.",
    "Kể một câu chuyện.",
    "What is two plus two?",
    "Escribe una frase sobre el mar.",
]


def read_jsonl(path: Path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        if path.exists()
        else []
    )


def full_forward(t, ids: list[int], aux: list[int] | None = None):
    """The features a separate, unpadded forward of the whole sequence gives (what online training
    reads)."""
    x = torch.tensor([ids])
    got = target_features(t.model, x, torch.ones_like(x), aux)
    return (got[0][0], got[1][0]) if aux is not None else (got[0], None)


def greedy_reference(t, prompt_ids: list[int], n: int) -> list[int]:
    ref = greedy_generate(t, prompt_ids, n)
    eos = t.tokenizer.eos_token_id
    return ref[: ref.index(eos) + 1] if eos in ref else ref


def reference_answer(t, messages: list[dict], n: int) -> str:
    """The target's own greedy answer to ``messages``, cut where the engine cuts and cleaned as
    distill does."""
    fmt, tok = t.spec.prompt_format, t.tokenizer
    ref = [
        x
        for x in greedy_reference(t, encode(fmt, tok, render(fmt, tok, messages)), n)
        if x != tok.eos_token_id
    ]
    text, _ = truncate_at_stop(tok.decode(ref, skip_special_tokens=True), fmt.stop)
    return strip_leakage(text, fmt.stop)


def write_prompts(path: Path, prompts: list[str]) -> Path:
    path.write_text(
        "".join(json.dumps({"instruction": p}, ensure_ascii=False) + "\n" for p in prompts),
        encoding="utf-8",
    )
    return path


def dcfg(run_dir, target_dir, prompts, *extra) -> DistillConfig:
    base = [
        f"run={run_dir}",
        f"target={target_dir}",
        "lang=vi",
        f"prompts={prompts}",
        "temperatures=[0.0, 1.0]",
        "sampling.max_new_tokens=10",
        "engine.batch_size=4",
        "batches_per_commit=1",
        "capture_features=true",
    ]
    return validate(DistillConfig, apply_overrides({}, [*base, *extra]))


# conftest's tiny training settings (as tcfg's), finetune on captured data
def tcfg(run_dir, target_dir, *extra) -> TrainConfig:
    base = [
        *tiny_train_overrides(run_dir, target_dir),
        "stage=finetune",
        f"data.finetune=[{run_dir}/synth/vi-distill/data.jsonl]",
        "features=captured",
    ]
    return validate(TrainConfig, apply_overrides({}, [*base, *extra]))


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    return load_target(str(tiny_llama_dir))


# ---------------------------------------------------------------------------------------- 1. engine


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_engine_capture_equals_a_full_forward_and_changes_no_token(
    family, tiny_llama_dir, tiny_gemma_dir
):
    t = load_target(str(tiny_llama_dir if family == "llama" else tiny_gemma_dir))
    fmt, tok = t.spec.prompt_format, t.tokenizer
    engine = TransformersEngine(t, batch_size=8)
    aux = eagle3_layers(t.num_layers)
    # rows of different prompt lengths, greedy and sampled, ending at different steps (max tokens, a
    # stop string)
    reqs = [
        Request(
            render(fmt, tok, [{"role": "user", "content": p}]),
            seed=i,
            temperature=(0.0, 1.0)[i % 2],
            max_new_tokens=(3, 12, 7, 12, 5)[i],
        )
        for i, p in enumerate(PROMPTS[:5])
    ]
    free = engine.generate(reqs[3:4])[0]
    reqs[3].stop = [free.text[3:5]]  # the sampled row stops early at a stop string
    plain = engine.generate(reqs)
    got = engine.generate(reqs, capture=aux)
    # prefilled once
    shared = [Request(reqs[1].prompt, seed=s, max_new_tokens=(4, 9, 6)[s]) for s in range(3)]
    plain += engine.generate(shared)
    got += engine.generate(shared, capture=aux)
    assert got[3].finished and got[3].num_tokens < 12, "the stop string must end a row early"
    assert len({r.num_tokens for r in got}) >= 4, "rows must leave the batch at different steps"
    for r, p, q in zip(reqs + shared, plain, got):
        assert (q.text, q.num_tokens, q.finished) == (p.text, p.num_tokens, p.finished)
        prompt = encode(fmt, tok, r.prompt)
        assert q.prompt_tokens == len(prompt) and q.ids[: q.prompt_tokens] == prompt
        # every fed token has its feature; the last sampled one is never fed
        assert (
            len(q.ids)
            == len(prompt) + q.num_tokens - 1
            == q.features["f"].shape[0]
            == q.features["aux"].shape[0]
        )
        if r.temperature == 0.0:  # the generated ids are the target's greedy tokens
            assert (
                q.ids[len(prompt) :]
                == greedy_reference(t, prompt, r.max_new_tokens)[: q.num_tokens - 1]
            )
        f, a = full_forward(t, q.ids, aux)
        assert q.nll == pytest.approx(p.nll, rel=1e-5) and q.nll > 0
        # nll: the target's own -log p of each generated token, from a separate forward
        if r.temperature == 0.0:
            with torch.inference_mode():
                lp = torch.log_softmax(
                    t.model(input_ids=torch.tensor([q.ids])).logits[0].float(), -1
                )
            # the last greedy token was never fed
            gen = q.ids[len(prompt) :] + [int(lp[-1].argmax())]
            ref = -lp[len(prompt) - 1 :].gather(1, torch.tensor(gen)[:, None]).mean().item()
            assert q.nll == pytest.approx(ref, rel=1e-4, abs=1e-5)
        torch.testing.assert_close(q.features["f"], f, atol=1e-4, rtol=0)
        torch.testing.assert_close(q.features["aux"], a, atol=1e-4, rtol=0)
    last = engine.generate(reqs[:2], capture=[])
    assert all(set(r.features) == {"f"} for r in last)


# --------------------------------------------------------------------------------------- 2. distill


def test_distill_captures_a_shard_for_every_accepted_record(tmp_path, tiny_llama_dir, llama):
    prompts = write_prompts(tmp_path / "prompts.jsonl", PROMPTS[:5])
    stats = run_distill(
        dcfg(tmp_path / "ref", tiny_llama_dir, prompts, "feature_layers=eagle3"), target=llama
    )
    out = tmp_path / "ref" / "synth" / "vi-distill"
    data = read_jsonl(out / "data.jsonl")
    assert (
        stats["attempted"] == 10
        and len(data) == stats["accepted"] >= 5
        and stats["feature_bytes"] > 0
    )
    fmt, tok = llama.spec.prompt_format, llama.tokenizer
    reader = FeatureReader(llama.spec.name, llama.tokenizer_sha256)
    aux = eagle3_layers(llama.num_layers)
    for rec in data:
        path = out / rec["features_file"]
        assert path.is_file() and reader.aux_layers(str(path)) == aux
        ids, start = reader.ids(str(path), rec["id"])
        question = rec["conversations"][0]["value"]
        assert ids[:start] == encode(
            fmt, tok, render(fmt, tok, [{"role": "user", "content": question}])
        )
        assert len(ids) - start == rec["tokens"]["response"] - 1
        if rec["temperature"] == 0.0:
            assert ids[start:] == greedy_reference(llama, ids[:start], 10)[: len(ids) - start]
        # stored in bf16: one bf16 rounding (2^-8 relative) apart
        f, a = full_forward(llama, ids, aux)
        torch.testing.assert_close(
            reader.get(str(path), rec["id"]).float(), f, atol=2e-2, rtol=1e-2
        )
        torch.testing.assert_close(
            reader.get(str(path), rec["id"], "aux").float(), a, atol=2e-2, rtol=1e-2
        )
    # another target's reader refuses the shard: one line
    shard = str(out / data[0]["features_file"])
    for other in (
        FeatureReader("other-target", llama.tokenizer_sha256),
        FeatureReader(llama.spec.name, "0" * 64),
    ):
        with pytest.raises(PolyspecError, match="features of target") as e:
            other.ids(shard, data[0]["id"])
        assert "\n" not in str(e.value)
    # a disk bound reached after the first shard: capture stops, the records go on without features
    small = run_distill(
        dcfg(
            tmp_path / "small",
            tiny_llama_dir,
            prompts,
            "feature_layers=eagle3",
            "max_feature_gb=1e-9",
        ),
        target=llama,
    )
    kept = read_jsonl(tmp_path / "small" / "synth" / "vi-distill" / "data.jsonl")
    assert [r["id"] for r in kept] == [r["id"] for r in data] and small["accepted"] == stats[
        "accepted"
    ]
    assert (
        len(list((tmp_path / "small" / "synth" / "vi-distill" / "features").glob("*.safetensors")))
        == 1
    )
    assert [r.get("features_file") for r in kept] == [
        r["features_file"] if r["attempt"] < 4 else None for r in data
    ]


@pytest.mark.slow
def test_distill_capture_kill_9_then_resume_equals_uninterrupted(tmp_path, tiny_llama_dir, llama):
    prompts = write_prompts(tmp_path / "prompts.jsonl", PROMPTS[:5])
    run_distill(dcfg(tmp_path / "ref", tiny_llama_dir, prompts), target=llama)
    args = [
        "-m",
        "synth",
        "distill",
        "--lang",
        "vi",
        "--target",
        str(tiny_llama_dir),
        "--run",
        str(tmp_path / "crash"),
        "--prompts",
        str(prompts),
        "--temperatures",
        "0,1.0",
        "--batch-size",
        "4",
        "sampling.max_new_tokens=10",
        "batches_per_commit=1",
        "capture_features=true",
    ]
    killed = run_cli(*args, env={"POLYSPEC_TEST_KILL_AT_COMMIT": "2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = run_cli(*args, env={"POLYSPEC_TEST_KILL_AT_COMMIT": ""})
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    ref_dir, crash_dir = (
        tmp_path / "ref" / "synth" / "vi-distill",
        tmp_path / "crash" / "synth" / "vi-distill",
    )
    assert (crash_dir / "data.jsonl").read_text() == (ref_dir / "data.jsonl").read_text()
    reader = FeatureReader(llama.spec.name, llama.tokenizer_sha256)
    data = read_jsonl(crash_dir / "data.jsonl")
    assert len(data) >= 5 and len(list((crash_dir / "features").glob("*.safetensors"))) == 3
    for rec in data:
        a, b = str(ref_dir / rec["features_file"]), str(crash_dir / rec["features_file"])
        assert reader.ids(a, rec["id"]) == reader.ids(b, rec["id"])
        assert torch.equal(reader.get(a, rec["id"]), reader.get(b, rec["id"]))


def test_vllm_engine_refuses_capture_without_the_targets_weights(tmp_path, tiny_llama_dir):
    """vLLM's captured features come from the target's prefill (tests/synth/test_synth.py,
    tests/engines/test_vllm_real.py): a target loaded without its weights is refused in one line,
    before vLLM is asked anything."""
    target = load_target(str(tiny_llama_dir), with_model=False)
    # refused before vLLM is asked anything
    engine = VLLMEngine(target, llm=object(), sampling_params_cls=object)
    prompts = write_prompts(tmp_path / "prompts.jsonl", PROMPTS[:2])
    with pytest.raises(
        PolyspecError, match="capture_features with engine.name=vllm needs the target's weights"
    ) as e:
        run_distill(
            dcfg(tmp_path, tiny_llama_dir, prompts, "engine.name=vllm"),
            target=target,
            engine=engine,
        )
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------ 3. multi-turn


def test_multi_turn_prompt_is_answered_turn_by_turn(tmp_path, tiny_llama_dir, llama, monkeypatch):
    import synth.pool

    q1, q2, single = "Thủ đô của Việt Nam là gì?", "Giải thích đơn giản hơn.", "Kể một câu chuyện."
    pool = [
        [{"role": "user", "content": q1}, {"role": "user", "content": q2}],
        [{"role": "user", "content": single}],
    ]
    monkeypatch.setattr(synth.pool, "build_pool", lambda lang, run, limit=None, corpus=0: pool)
    run_distill(dcfg(tmp_path, tiny_llama_dir, "pool", "lid_filter=false"), target=llama)
    out = tmp_path / "synth" / "vi-distill"
    data = {r["attempt"]: r for r in read_jsonl(out / "data.jsonl")}
    assert sorted(data) == [0, 1, 2, 3]
    fmt, tok = llama.spec.prompt_format, llama.tokenizer
    reader = FeatureReader(llama.spec.name, llama.tokenizer_sha256)
    for a in (0, 1):  # the two-turn prompt at T = 0 and T = 1
        conv = data[a]["conversations"]
        assert [c["from"] for c in conv] == ["human", "gpt", "human", "gpt"]
        assert (conv[0]["value"], conv[2]["value"]) == (q1, q2)
        assert [c.get("nll", 0.0) > 0 for c in conv] == [False, True, False, True], (
            "each answer carries its NLL"
        )
        first = [{"role": "user", "content": q1}]
        if a == 0:  # the first answer is the target's own greedy answer to the first turn alone
            want = reference_answer(llama, first, 10)
        else:  # sampled with the attempt's own seed stream for turn 0
            req = Request(
                render(fmt, tok, first), derive_seed(0, a, "turn0"), 1.0, 1.0, 10, fmt.stop
            )
            want = strip_leakage(
                TransformersEngine(llama, batch_size=1).generate([req])[0].text, fmt.stop
            )
        assert conv[1]["value"] == want
        history = [*first, {"role": "assistant", "content": want}, {"role": "user", "content": q2}]
        if a == 0:  # the last answer is the greedy answer to the whole history
            assert conv[3]["value"] == reference_answer(llama, history, 10)
        ids, start = reader.ids(str(out / data[a]["features_file"]), data[a]["id"])
        assert ids[:start] == encode(fmt, tok, render(fmt, tok, history)), (
            "the captured prompt holds both turns"
        )
    assert [c["from"] for c in data[2]["conversations"]] == ["human", "gpt"]


def test_earlier_turns_are_answered_a_window_at_a_time_and_resume_the_same(
    tmp_path, tiny_llama_dir, llama, monkeypatch
):
    """The multi-turn attempts' earlier turns are answered together (one engine call per window of
    batches, not a 1–3 row generation in every batch); each history is still the target's own answer
    to the first turn with the attempt's seed stream. The answers come one engine call per commit of
    two batches (its rows refilled as they finish), and a run cut after two commits resumes to the
    same records."""
    import synth.pool
    import synth.store

    pool = []
    for i in range(3):
        pool += [
            [
                {"role": "user", "content": f"Câu hỏi số {i}?"},
                {"role": "user", "content": "Nói thêm đi."},
            ],
            [{"role": "user", "content": f"Kể chuyện số {i}."}],
        ]
    monkeypatch.setattr(synth.pool, "build_pool", lambda lang, run, limit=None, corpus=0: pool)
    calls = []
    generate = TransformersEngine.generate

    def spy(self, requests, capture=None):
        calls.append((len(requests), capture is None))
        return generate(self, requests, capture)

    monkeypatch.setattr(TransformersEngine, "generate", spy)
    per = ["lid_filter=false", "engine.batch_size=2", "batches_per_commit=2"]
    run_distill(dcfg(tmp_path / "ref", tiny_llama_dir, "pool", *per), target=llama)
    # one call: 3 two-turn prompts x 2 temperatures
    assert [c for c in calls if c[1]] == [(6, True)], calls
    # the 12 attempts' answers, 2 batches of 2 a call
    assert [c for c in calls if not c[1]] == [(4, False)] * 3
    data = read_jsonl(tmp_path / "ref" / "synth" / "vi-distill" / "data.jsonl")
    assert [r["attempt"] for r in data] == list(range(12))
    fmt, tok = llama.spec.prompt_format, llama.tokenizer
    for rec in data:
        conv = rec["conversations"]
        if rec["attempt"] // 2 % 2:
            assert len(conv) == 2
            continue
        first = [{"role": "user", "content": conv[0]["value"]}]
        req = Request(
            render(fmt, tok, first),
            derive_seed(0, rec["attempt"], "turn0"),
            rec["temperature"],
            1.0,
            10,
            fmt.stop,
        )
        want = strip_leakage(
            TransformersEngine(llama, batch_size=1).generate([req])[0].text, fmt.stop
        )
        assert [c["from"] for c in conv] == ["human", "gpt", "human", "gpt"] and conv[1][
            "value"
        ] == want

    commit = synth.store.SynthStore.commit

    def cut_after_two(self, *a, **kw):
        if self._commits == 2:
            raise KeyboardInterrupt
        return commit(self, *a, **kw)

    monkeypatch.setattr(synth.store.SynthStore, "commit", cut_after_two)
    cfg = dcfg(tmp_path / "cut", tiny_llama_dir, "pool", *per)
    with pytest.raises(KeyboardInterrupt):
        run_distill(cfg, target=llama)
    monkeypatch.setattr(synth.store.SynthStore, "commit", commit)
    assert len(read_jsonl(tmp_path / "cut" / "synth" / "vi-distill" / "data.jsonl")) == 8
    run_distill(cfg, target=llama)
    assert read_jsonl(tmp_path / "cut" / "synth" / "vi-distill" / "data.jsonl") == data


# ---------------------------------------------------------------------------- 4. training on shards


def save_prompt_vocab(run_dir: Path, target) -> None:
    """A ranked vi vocabulary: the target's ids by their counts in PROMPTS (what train/ needs
    besides data)."""
    from collections import Counter

    from vocab.files import RankedVocab, save_ranked

    counts = Counter(i for p in PROMPTS for i in target.tokenizer(p)["input_ids"])
    order = sorted(range(target.vocab_size), key=lambda i: (-counts.get(i, 0), i))
    save_ranked(
        run_dir / "vocab",
        RankedVocab(
            "vi",
            np.array(order),
            np.array([counts.get(i, 0) for i in order]),
            {"tokenizer_sha256": target.tokenizer_sha256},
        ),
    )


@pytest.fixture(scope="module")
def captured_run(tmp_path_factory, tiny_llama_dir, llama):
    """Distilled finetune data with EAGLE-3 features (f and aux) and a ranked vocabulary, for
    train/."""
    run_dir = tmp_path_factory.mktemp("captured-run")
    prompts = write_prompts(run_dir / "prompts.jsonl", PROMPTS)
    run_distill(
        dcfg(
            run_dir,
            tiny_llama_dir,
            prompts,
            "feature_layers=eagle3",
            "lid_filter=false",
            "engine.batch_size=8",
            "sampling.max_new_tokens=16",
        ),
        target=llama,
    )
    save_prompt_vocab(run_dir, llama)
    return run_dir


def _batch_losses(cfg, target, out: Path) -> tuple[float, float, float]:
    """(captured, online, online with features rounded to bf16 as the shards store them) on one
    batch."""
    import train.recipe

    r = DrafterRecipe(cfg, "finetune")
    r.out = out
    r.setup(target=target)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in r.model.parameters():
            p.copy_(torch.randn_like(p) * 0.02)
    batch = next(r.batches())
    T = batch["input_ids"].shape[1]
    assert any(len(r.reader.ids(*r.train_set[i].feat)[0]) > T for i in batch["index"].tolist()), (
        "a cut sequence"
    )
    captured = r.loss(batch)[0].item()
    r.reader = None  # the same examples, features from a target forward in the step
    online = r.loss(batch)[0].item()
    exact = train.recipe.target_features
    bf16 = lambda *a: (  # noqa: E731
        tuple(x.bfloat16().float() for x in exact(*a))
        if len(a) > 3
        else exact(*a).bfloat16().float()
    )
    train.recipe.target_features = bf16
    try:
        rounded = r.loss(batch)[0].item()
    finally:
        train.recipe.target_features = exact
        r.cleanup()
    return captured, online, rounded


@pytest.mark.parametrize("arch", ["eagle1", "eagle3"])
def test_captured_features_give_the_online_loss(
    arch, captured_run, tiny_llama_dir, llama, tmp_path
):
    # max_length 32 cuts some sequences: the shards' rows beyond it must be dropped with them
    cfg = tcfg(
        captured_run,
        tiny_llama_dir,
        f"eagle.arch={arch}",
        "eagle.feature_noise=0",
        "data.max_length=32",
    )
    captured, online, rounded = _batch_losses(cfg, llama, tmp_path / "train")
    # measured 3e-6 (eagle1), 2e-7 (eagle3): the bf16 storage
    assert captured == pytest.approx(online, rel=1e-4)
    # the same features, rounded as the shards store them
    assert captured == pytest.approx(rounded, rel=1e-5)


def test_captured_training_epochs_and_records_without_features(
    captured_run, tiny_llama_dir, llama, tmp_path
):
    data = captured_run / "synth" / "vi-distill" / "data.jsonl"
    records = read_jsonl(data)
    cfg = tcfg(
        captured_run,
        tiny_llama_dir,
        "finetune.epochs=2",
        "finetune.steps=1000",
        "optim.batch_size=3",
    )
    r = DrafterRecipe(cfg, "finetune")
    r.out = tmp_path / "epochs"
    r.setup(target=llama)
    assert r.skipped == 0 and len(r.train_set) + 1 <= len(records)
    assert r.steps == math.ceil(2 * len(r.train_set) / 3)
    assert all(len(s["f"][0]) == s["seq"].shape[1] for s in r.eval_seqs), (
        "held-out scoring reads the shards too"
    )
    r.cleanup()
    # a record without captured features is skipped and counted
    part = tmp_path / "synth" / "vi-distill" / "data.jsonl"
    shutil.copytree(data.parent / "features", part.parent / "features")
    records[1].pop("features_file")
    part.write_text(
        "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in records), encoding="utf-8"
    )
    ds = build_dataset([str(part)], llama, str(tmp_path), "vi", 64, True, captured=True)
    assert ds.skipped == 1 and [ex.feat[1] for ex in ds.examples] == [
        x["id"] for x in records if x is not records[1]
    ]
    # EAGLE-3 trains from the shards end to end: epochs decide the steps
    results = run(
        tcfg(
            captured_run,
            tiny_llama_dir,
            "eagle.arch=eagle3",
            "finetune.epochs=0.5",
            "optim.batch_size=2",
            "eval_every=100",
            "checkpoint_every=100",
        )
    )
    assert results[0]["steps"] == math.ceil(0.5 * len(r.train_set) / 2)
    assert math.isfinite(results[0]["final_loss"]) and results[0]["eval"]


def test_eagle3_training_refuses_shards_without_its_layers(tmp_path, tiny_llama_dir, llama):
    """Shards captured with the last layer only (or other layers) cannot train an EAGLE-3 drafter:
    one-line error."""
    from polyspec.errors import PolyspecError

    run_dir = tmp_path / "run"
    prompts = write_prompts(tmp_path / "prompts.jsonl", PROMPTS[:4])
    run_distill(
        dcfg(run_dir, tiny_llama_dir, prompts, "lid_filter=false", "sampling.max_new_tokens=8"),
        target=llama,
    )
    save_prompt_vocab(run_dir, llama)
    r = DrafterRecipe(tcfg(run_dir, tiny_llama_dir, "eagle.arch=eagle3"), "finetune")
    r.out = tmp_path / "out"
    with pytest.raises(
        PolyspecError, match=r"holds target layers None, the EAGLE-3 drafter reads \["
    ) as e:
        r.setup(target=llama)
    assert "\n" not in str(e.value)
