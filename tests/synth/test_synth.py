"""synth/ on tiny random targets: engine correctness, Alg. 1 bookkeeping, crash-resume, translation,
the vLLM adapter and self-distillation."""

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from conftest import run_cli
from polyspec.config import apply_overrides, validate
from polyspec.errors import PolyspecError
from polyspec.languages import get_language, translated_path
from polyspec.prompts import encode, render
from polyspec.targets import eagle3_layers, greedy_generate, load_target
from synth.config import DistillConfig, SynthConfig
from synth.distill import run_distill
from synth.engines import Request, TransformersEngine, VLLMEngine, make_engine
from synth.filters import dedup_keys, normalize, strip_leakage
from synth.selfsynth import derive_seed, instruction_prompt, run_selfsynth

# Tiny random models ramble in every script: these checks are about bookkeeping, not language.
TINY = [
    "instruction.max_new_tokens=16",
    "response.max_new_tokens=16",
    "filters.keep_unfinished_instructions=true",
    "filters.min_response_chars=1",
    "filters.min_instruction_chars=1",
    "filters.require_language=false",
]


def synth_cfg(run, target_dir, *extra, n=8, batch=3):
    data = apply_overrides(
        {},
        [
            f"n={n}",
            f"run={run}",
            f"target={target_dir}",
            f"engine.batch_size={batch}",
            *TINY,
            *extra,
        ],
    )
    return validate(SynthConfig, data)


def read_jsonl(path: Path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        if path.exists()
        else []
    )


# ------------------------------------------------------------------------------------------- engine


def test_batched_greedy_equals_hf_generate_with_left_padding(tiny_target_dir):
    t = load_target(str(tiny_target_dir))
    prompts = [
        "Xin chào",
        "Warum fallen im Herbst die Blätter von den Bäumen?",
        "日本",
        "Bonjour à tous, comment allez-vous ?",
    ]
    engine = TransformersEngine(t, batch_size=4)
    res = engine.generate([Request(p, seed=0, temperature=0.0, max_new_tokens=12) for p in prompts])
    for p, r in zip(prompts, res):
        ids = t.tokenizer(p, add_special_tokens=t.spec.prompt_format.kind == "completion")[
            "input_ids"
        ]
        ref = greedy_generate(t, ids, 12)
        eos = t.tokenizer.eos_token_id
        ref = ref[: ref.index(eos) + 1] if eos in ref else ref
        assert r.num_tokens == len(ref)
        assert r.text == t.tokenizer.decode([x for x in ref if x != eos], skip_special_tokens=True)


def test_shared_prompt_fan_out_equals_separate_rows(tiny_llama_dir):
    t = load_target(str(tiny_llama_dir))
    engine = TransformersEngine(t, batch_size=8)
    shared = engine.generate([Request("Một hai ba", seed=s, max_new_tokens=10) for s in range(4)])
    alone = [
        engine.generate([Request("Một hai ba", seed=s, max_new_tokens=10)])[0] for s in range(4)
    ]
    assert [r.text for r in shared] == [r.text for r in alone]
    assert len({r.text for r in shared}) > 1, "different seeds must give different samples"


def _assert_answered_as_alone(t, reqs, got, aux):
    """Every text, token count, finish flag, id list, NLL and captured feature equals the request
    run alone."""
    for r, g in zip(reqs, got):
        alone = TransformersEngine(t, batch_size=1).generate([r], capture=aux)[0]
        assert (g.text, g.num_tokens, g.finished, g.ids) == (
            alone.text,
            alone.num_tokens,
            alone.finished,
            alone.ids,
        )
        assert g.nll == pytest.approx(alone.nll, rel=1e-5)
        for k in ("f", "aux"):
            torch.testing.assert_close(g.features[k], alone.features[k], atol=1e-4, rtol=1e-4)


def _joining_requests() -> list[Request]:
    """10 requests of mixed prompt lengths (some past the tiny gemma3's 64-token window), greedy and
    sampled, that finish at different steps: through 4 rows they join, trim and outlive each
    other."""
    long = " ".join(["Warum fallen im Herbst die Blätter von den Bäumen?"] * 4)
    prompts = [
        "Xin chào",
        long,
        "日本",
        "Bonjour à tous",
        "Kể một câu chuyện.",
        long[:90],
        "a b c",
        long[:40],
        "Escribe una frase sobre el mar.",
        long + " Und im Winter?",
    ]
    return [
        Request(
            p,
            seed=i,
            temperature=(0.0, 1.0)[i % 2],
            max_new_tokens=(3, 4, 9, 30, 2, 25, 40, 5, 12, 30)[i],
        )
        for i, p in enumerate(prompts)
    ]


def test_waiting_requests_join_the_running_batch_and_answer_as_alone(tiny_target_dir, monkeypatch):
    """Continuous batching: 10 requests through 4 rows. Rows that finish are replaced by waiting
    requests, whose caches are left-padded to the running batch's (or it to theirs, for a longer
    prompt); columns no live row uses are dropped. Every answer, NLL and captured feature equals the
    request generated alone, greedy and sampled, across Gemma's 64-token sliding window (the tiny
    gemma3). Where the cache cannot be joined, requests go in groups of ``batch_size``, as
    before."""
    import synth.engines

    t = load_target(str(tiny_target_dir))
    reqs = _joining_requests()
    joins, trims, real_join, real_trim = [], [], synth.engines._join, synth.engines._trim

    def join(past, mask, new_past, new_mask):
        joins.append((None if mask is None else mask.shape, new_mask.shape))
        return real_join(past, mask, new_past, new_mask)

    def trim(cache, mask):
        trims.append(mask.shape)
        return real_trim(cache, mask)

    monkeypatch.setattr(synth.engines, "_join", join)
    monkeypatch.setattr(synth.engines, "_trim", trim)
    engine = TransformersEngine(t, batch_size=4)
    aux = eagle3_layers(t.num_layers)
    got = engine.generate(reqs, capture=aux)
    running = [(m, n) for m, n in joins if m is not None]
    assert len(running) >= 3, "waiting requests must join a running batch"
    assert any(n[1] > m[1] for m, n in running) and any(n[1] < m[1] for m, n in running), (
        "both paddings: a longer prompt joins a shorter cache, and a shorter one a longer cache"
    )
    assert any(s[1] > 64 for s in trims), "the tiny gemma3 runs past its 64-token sliding window"
    _assert_answered_as_alone(t, reqs, got, aux)
    assert len({r.num_tokens for r in got}) >= 5, "rows must leave the batch at different steps"
    # a cache that cannot be joined (chunked attention, other layer kinds): groups of 4, one after
    # the other
    monkeypatch.setattr(synth.engines, "_joinable", lambda model, cache: False)
    joins.clear()
    grouped = engine.generate(reqs)
    assert all(m is None for m, _ in joins) and len(joins) == 3
    assert [(r.text, r.num_tokens) for r in grouped] == [(r.text, r.num_tokens) for r in got]


def test_the_engines_roomy_cache_answers_as_transformers_own(tiny_target_dir, monkeypatch):
    """The engine's KV cache writes each step's column into spare room instead of re-concatenating
    the cache (``_Roomy``). With 3 columns of room (a fresh buffer every 3 steps, through joins,
    trims, row selection and the sliding window), every answer, NLL and captured feature equals the
    one transformers' own ``DynamicCache`` gives in the same batches."""
    import synth.engines

    t = load_target(str(tiny_target_dir))
    reqs, aux = _joining_requests(), eagle3_layers(t.num_layers)
    monkeypatch.setattr(synth.engines._Roomy, "room", 3)
    layers = []
    real = synth.engines._roomy_cache
    monkeypatch.setattr(
        synth.engines, "_roomy_cache", lambda model: layers.append(real(model)) or layers[-1]
    )
    roomy = TransformersEngine(t, batch_size=4).generate(reqs, capture=aux)
    assert layers and all(isinstance(x, synth.engines._Roomy) for c in layers for x in c.layers)
    if "gemma3" in str(tiny_target_dir):
        assert any(isinstance(x, synth.engines._RoomySlidingLayer) for x in layers[0].layers)
    monkeypatch.setattr(
        synth.engines, "_roomy_cache", lambda model: DynamicCache(config=model.config)
    )
    plain = TransformersEngine(t, batch_size=4).generate(reqs, capture=aux)
    assert sum(r.num_tokens for r in plain) > 100
    for r, p in zip(roomy, plain):
        assert (r.text, r.num_tokens, r.finished, r.ids, r.nll) == (
            p.text,
            p.num_tokens,
            p.finished,
            p.ids,
            p.nll,
        )
        for k in ("f", "aux"):
            torch.testing.assert_close(r.features[k], p.features[k], atol=0, rtol=0)


def test_rows_sharing_a_prompt_share_its_prefill_and_answer_as_alone(tiny_target_dir):
    """Distillation asks every pool prompt at each temperature (adjacent attempts): a prefill runs
    each distinct prompt once and fans its cache out. Every answer, NLL and captured feature equals
    the request alone."""
    t = load_target(str(tiny_target_dir))
    prompts = ["Xin chào", "Warum fallen im Herbst die Blätter?", "日本", "a b c d e f"]
    reqs = [
        Request(p, seed=i, temperature=temp, max_new_tokens=(6, 11, 3)[i % 3])
        for i, (p, temp) in enumerate((p, temp) for p in prompts for temp in (0.0, 1.0, 0.7))
    ]
    widths = []
    hook = t.model.get_decoder().register_forward_pre_hook(
        lambda mod, args, kw: widths.append(kw["input_ids"].shape), with_kwargs=True
    )
    aux = eagle3_layers(t.num_layers)
    try:
        got = TransformersEngine(t, batch_size=6).generate(reqs, capture=aux)
    finally:
        hook.remove()
    prefills = [w[0] for w in widths if w[1] > 1]
    # the first 6 attempts are 2 prompts; later joins take the rows that are free, one prompt's or
    # two's
    assert prefills[0] == 2 and sum(prefills) <= len(reqs) // 2, (
        f"one forward row per distinct prompt: {prefills}"
    )
    assert len({g.text for g in got[:3]}) > 1, (
        "the temperatures must give different answers to one prompt"
    )
    _assert_answered_as_alone(t, reqs, got, aux)


def test_sampling_is_a_function_of_prompt_and_seed(tiny_gemma_dir):
    engine = TransformersEngine(load_target(str(tiny_gemma_dir)), batch_size=2)
    reqs = [Request(p, seed=7, max_new_tokens=10) for p in ("a b c", "hello world", "xin chào")]
    assert [r.text for r in engine.generate(reqs)] == [r.text for r in engine.generate(reqs)]


def test_sampler_draws_the_tempered_top_p_distribution():
    """The engine's inverse-CDF sampler (it replaced torch.multinomial, 5.5 ms a call at 262K ids)
    draws each id with its tempered probability, never a zero-probability id, and respects top-p."""
    import torch

    from synth.engines import _sample

    logits = torch.full((1000,), -1e9)
    logits[[3, 500, 998]] = torch.tensor([0.0, 1.0, 2.0])  # every other id has probability 0
    gen = torch.Generator().manual_seed(0)
    n = 6000
    counts = torch.bincount(
        torch.tensor([_sample(logits, 1.0, 1.0, gen) for _ in range(n)]), minlength=1000
    )
    want = torch.softmax(logits, -1)
    assert set(counts.nonzero().flatten().tolist()) == {3, 500, 998}
    for i in (3, 500, 998):  # binomial sd at n = 6000 is <= 0.0065: 4 sd
        assert abs(counts[i] / n - want[i]) < 0.026, (i, counts[i] / n, want[i])
    # T = 0.5: p(998) = 0.867 > top_p alone
    hot = [_sample(logits, 0.5, 0.6, gen) for _ in range(200)]
    assert set(hot) == {998}
    assert _sample(logits, 0.0, 1.0, gen) == 998
    with pytest.raises(PolyspecError, match="NaN"):  # torch.multinomial refused these too
        _sample(torch.full((1000,), float("nan")), 0.7, 1.0, gen)


def test_stop_strings_end_generation_and_are_cut(tiny_llama_dir):
    t = load_target(str(tiny_llama_dir))
    engine = TransformersEngine(t, batch_size=1)
    free = engine.generate([Request("abc", seed=1, max_new_tokens=20)])[0]
    assert len(free.text) > 4
    stop = free.text[2:4]
    cut = engine.generate([Request("abc", seed=1, max_new_tokens=20, stop=[stop])])[0]
    assert cut.finished and stop not in cut.text and free.text.startswith(cut.text)
    assert cut.num_tokens < free.num_tokens


# ------------------------------------------------------------------------------------------ filters


def test_strip_leakage_and_dedup_keys():
    stop = ["### Instruction:", "### Response:"]
    assert strip_leakage("Trả lời.\n\n### Instruction:\nTiếp", stop) == "Trả lời."
    assert strip_leakage("Antwort hier.\n### Feedback:\nblah", stop) == "Antwort hier."
    assert strip_leakage("ok<|im_end|>junk", stop) == "ok"
    assert strip_leakage("  a ### b is fine  ", stop) == "a ### b is fine"
    assert normalize("Xin  CHÀO, bạn!") == "xin chào bạn"
    a, b = dedup_keys("Hello, World!", "Hi"), dedup_keys("hello world", "hi.")
    assert a[0] != b[0] and a[1] == b[1]


def test_derive_seed_is_stable_and_spread():
    assert derive_seed(0, 5, "instruction") == derive_seed(0, 5, "instruction")
    seeds = {derive_seed(0, a, s) for a in range(100) for s in ("instruction", "response")}
    assert len(seeds) == 200 and all(0 <= s < 2**31 for s in seeds)


# ---------------------------------------------------------------------------------------- Alg. 1


def test_instruction_prompt_opens_a_user_turn(tiny_gemma_dir, tiny_llama_dir):
    vi = get_language("vi")
    base = load_target(str(tiny_gemma_dir))
    p = instruction_prompt(base, vi, few_shot=6)
    assert p.startswith(vi.system_prompt) and p.endswith("### Instruction:\n")
    assert all(s.instruction in p and s.response in p for s in vi.seeds)
    chat = instruction_prompt(load_target(str(tiny_llama_dir)), vi, few_shot=2)
    assert (
        chat.endswith("<|user|>\n")
        and vi.seeds[1].response in chat
        and vi.seeds[2].instruction not in chat
    )


def test_selfsynth_keeps_n_with_consistent_stats(tmp_path, tiny_gemma_dir):
    stats = run_selfsynth(synth_cfg(tmp_path, tiny_gemma_dir, n=7), log=lambda *_: None)
    out = tmp_path / "synth" / "vi"
    data, rejected = read_jsonl(out / "data.jsonl"), read_jsonl(out / "rejected.jsonl")
    assert stats["complete"] and len(data) == 7
    assert stats["attempted"] == stats["accepted"] + sum(stats["rejected_by_reason"].values())
    assert stats["accepted"] == len(data) and stats["rejected"] == len(rejected)
    assert len({r["id"] for r in data + rejected}) == len(data) + len(rejected)
    assert json.loads((out / "stats.json").read_text()) == stats
    rec = data[0]
    assert {"id", "lang", "source", "temperature", "conversations", "lid", "target"} <= set(rec)
    assert rec["source"] == "self-synth" and rec["lang"] == "vi" and rec["temperature"] == 1.0
    assert [c["from"] for c in rec["conversations"]] == ["human", "gpt"]
    assert set(rec["lid"]) == {"label", "prob"}


def test_language_gate_rejects_off_language_pairs(tmp_path, tiny_gemma_dir):
    cfg = synth_cfg(
        tmp_path, tiny_gemma_dir, "filters.require_language=true", "max_attempts=9", n=3
    )
    stats = run_selfsynth(cfg, log=lambda *_: None)
    rejected = read_jsonl(tmp_path / "synth" / "vi" / "rejected.jsonl")
    lid_rejects = [r for r in rejected if r["reason"].startswith("lid_")]
    assert lid_rejects, "random text must fail the Vietnamese language-ID gate"
    assert all(r["lid"]["label"] != "vi" or r["lid"]["prob"] < 0.5 for r in lid_rejects)
    assert sum(stats["lid_labels_of_rejects"].values()) == len(lid_rejects)
    if not stats["complete"]:
        assert stats["attempted"] == 9


def test_budget_spent_exits_3_keeping_what_was_kept(tmp_path, tiny_gemma_dir):
    args = [
        "-m",
        "synth",
        "--lang",
        "vi",
        "--n",
        "50",
        "--target",
        str(tiny_gemma_dir),
        "--run",
        str(tmp_path),
        "--max-attempts",
        "6",
        "--batch-size",
        "3",
        *TINY[:-1],
    ]
    proc = run_cli(*args)
    assert proc.returncode == 3 and "attempt budget spent" in proc.stderr
    stats = json.loads((tmp_path / "synth" / "vi" / "stats.json").read_text())
    assert stats["attempted"] == 6 and not stats["complete"]


def test_rerun_with_other_arguments_is_refused(tmp_path, tiny_gemma_dir):
    run_selfsynth(synth_cfg(tmp_path, tiny_gemma_dir, n=2), log=lambda *_: None)
    with pytest.raises(PolyspecError, match="other arguments"):
        run_selfsynth(synth_cfg(tmp_path, tiny_gemma_dir, "seed=1", n=2), log=lambda *_: None)


@pytest.mark.slow
def test_kill_9_then_rerun_equals_uninterrupted_run(tmp_path, tiny_llama_dir):
    args = lambda run: [  # noqa: E731
        "-m",
        "synth",
        "--lang",
        "de",
        "--n",
        "10",
        "--target",
        str(tiny_llama_dir),
        "--run",
        str(run),
        "--batch-size",
        "2",
        *TINY,
    ]
    ref = run_cli(*args(tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr
    killed = run_cli(*args(tmp_path / "crash"), env={"POLYSPEC_TEST_KILL_AT_COMMIT": "3"})
    assert killed.returncode == -signal.SIGKILL
    crash_dir = tmp_path / "crash" / "synth" / "de"
    # the worst moment: half a line on disk
    assert '{"torn": ' in (crash_dir / "data.jsonl").read_text()
    resumed = run_cli(*args(tmp_path / "crash"), env={"POLYSPEC_TEST_KILL_AT_COMMIT": ""})
    assert resumed.returncode == 0, resumed.stderr
    for name in ("data.jsonl", "rejected.jsonl"):
        a = (tmp_path / "ref" / "synth" / "de" / name).read_text()
        b = (crash_dir / name).read_text()
        assert a == b, name
    data = read_jsonl(crash_dir / "data.jsonl")
    assert len(data) == 10 and len({r["id"] for r in data}) == 10
    stats = json.loads((crash_dir / "stats.json").read_text())
    assert stats["attempted"] == stats["accepted"] + stats["rejected"]


def test_invalid_language_is_one_line_error(tmp_path, tiny_gemma_dir):
    proc = run_cli(
        "-m", "synth", "--lang", "xx", "--target", str(tiny_gemma_dir), "--run", str(tmp_path)
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "'xx'" in proc.stderr and "vi" in proc.stderr


def test_unbuilt_language_is_translated_cached_and_synthesized(
    tmp_path, tiny_gemma_dir, isolated_cache
):
    logs = []
    cfg = synth_cfg(tmp_path, tiny_gemma_dir, "lang=sw", "translation_max_new_tokens=24", n=2)
    stats = run_selfsynth(cfg, log=logs.append)
    target_name = Path(tiny_gemma_dir).name
    cached = translated_path("sw", target_name)
    assert cached.is_file() and any("translated" in m for m in logs)
    sw = get_language("sw", target=target_name)
    assert (
        sw.fasttext_label == "__label__sw"
        and sw.fineweb2.config == "swa_Latn"
        and len(sw.seeds) >= 5
    )
    assert len(sw.translation["lid"]) == 1 + 2 * len(sw.seeds)  # LID ran on every translation
    assert stats["complete"] and stats["lang"] == "sw"
    logs.clear()
    run_selfsynth(
        synth_cfg(
            tmp_path / "again", tiny_gemma_dir, "lang=sw", "translation_max_new_tokens=24", n=2
        ),
        log=logs.append,
    )
    assert not any("translated" in m for m in logs), "second run must use the cached translation"


# ------------------------------------------------------------------------------------------- vLLM


@dataclass
class FakeSamplingParams:  # the fields of vllm.SamplingParams that the adapter sets
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    stop: list | None = None
    seed: int | None = None
    logprobs: int | None = None


class FakeLLM:
    """Follows vllm.LLM.generate: list of RequestOutput with .outputs[0].{text, token_ids,
    finish_reason, cumulative_logprob} (the last None unless ``logprobs`` was asked for).

    ``run_ids`` records the ids vLLM would run: a ``TokensPrompt`` dict as given, a text prompt
    encoded the way vLLM encodes it (``tokenizer.encode(text)``, special tokens added), when a
    tokenizer is given."""

    def __init__(self, tokenizer=None):
        self.calls = []
        self.run_ids = []
        self.tokenizer = tokenizer

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append((list(prompts), list(sampling_params)))
        for p in prompts:
            if isinstance(p, dict):
                self.run_ids.append(list(p["prompt_token_ids"]))
            elif self.tokenizer is not None:
                self.run_ids.append(self.tokenizer.encode(p))

        @dataclass
        class Completion:
            text: str
            token_ids: list
            finish_reason: str
            cumulative_logprob: float | None = None

        @dataclass
        class Output:
            outputs: list

        return [
            Output(
                [
                    Completion(
                        f"Câu trả lời số {sp.seed % 97} về cây xanh và ánh sáng mặt trời.",
                        [1] * 9,
                        "stop",
                        None if sp.logprobs is None else -4.5,
                    )
                ]
            )
            for p, sp in zip(prompts, sampling_params)
        ]


def test_vllm_adapter_maps_requests_and_outputs(tiny_gemma_dir):
    llm = FakeLLM()
    target = load_target(str(tiny_gemma_dir), with_model=False)
    engine = VLLMEngine(target, llm=llm, sampling_params_cls=FakeSamplingParams)
    res = engine.generate(
        [
            Request("p1", seed=3, temperature=0.7, top_p=0.9, max_new_tokens=5, stop=["###"]),
            Request("p2", seed=4),
        ]
    )
    prompts, params = llm.calls[0]
    fmt, tok = target.spec.prompt_format, target.tokenizer
    assert prompts == [
        {"prompt_token_ids": encode(fmt, tok, "p1")},
        {"prompt_token_ids": encode(fmt, tok, "p2")},
    ]
    assert params[0] == FakeSamplingParams(
        temperature=0.7, top_p=0.9, max_tokens=5, stop=["###"], seed=3, logprobs=0
    )
    assert params[1].stop is None
    assert res[0].finished and res[0].num_tokens == 9 and "cây xanh" in res[0].text
    assert res[0].nll == pytest.approx(0.5)  # -cumulative_logprob / tokens
    assert engine.stats["tokens"] == 18


def test_vllm_runs_the_transformers_engines_token_ids_for_a_chat_target(tiny_llama_dir):
    """A chat template that writes BOS itself: vLLM must run the ids the transformers engine
    prefills (one BOS), not its own encoding of the text (which adds a second BOS in front)."""
    t = load_target(str(tiny_llama_dir))
    tok, fmt = t.tokenizer, t.spec.prompt_format
    assert fmt.kind == "chat-template" and "bos_token" in tok.chat_template
    prompts = [
        render(fmt, tok, [{"role": "user", "content": c}])
        for c in ("Xin chào", "Warum ist der Himmel blau?")
    ]
    assert tok.encode(prompts[0])[:2] == [tok.bos_token_id] * 2, (
        "text through vLLM's encoding doubles BOS here"
    )
    # what the transformers engine feeds the model: one prompt per call, so no padding
    prefilled = []

    def record(_module, _args, kwargs):
        past = kwargs["past_key_values"]
        # a prefill: the engine hands the model an empty cache
        if past is None or past.get_seq_length() == 0:
            prefilled.append(kwargs["input_ids"][0].tolist())

    hook = t.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        for p in prompts:
            TransformersEngine(t, batch_size=1).generate([Request(p, seed=0, max_new_tokens=1)])
    finally:
        hook.remove()
    llm = FakeLLM(tokenizer=tok)
    VLLMEngine(t, llm=llm, sampling_params_cls=FakeSamplingParams).generate(
        [Request(p, seed=0) for p in prompts]
    )
    assert llm.run_ids == prefilled
    assert all(ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1 for ids in prefilled)


def test_selfsynth_runs_on_the_vllm_engine(tmp_path, tiny_gemma_dir):
    llm = FakeLLM()
    target = load_target(str(tiny_gemma_dir), with_model=False)
    engine = VLLMEngine(target, llm=llm, sampling_params_cls=FakeSamplingParams)
    assert target.model is None
    cfg = synth_cfg(
        tmp_path, tiny_gemma_dir, "engine.name=vllm", "filters.require_language=true", n=3
    )
    stats = run_selfsynth(cfg, target=target, engine=engine, log=lambda *_: None)
    assert stats["accepted"] + stats["rejected"] == stats["attempted"] >= 3
    assert all(sp.seed == derive_seed(0, i, "instruction") for i, sp in enumerate(llm.calls[0][1]))


def test_vllm_without_an_environment_is_one_line_error_before_loading(
    tiny_gemma_dir, monkeypatch, tmp_path
):
    """No vLLM anywhere (no POLYSPEC_VLLM_PYTHON, no .venv-vllm, not importable here): one line
    naming the fixes, raised before any process starts; a POLYSPEC_VLLM_PYTHON that is not a program
    says so."""
    import importlib.util

    import polyspec.vllm_process as vp

    monkeypatch.delenv("POLYSPEC_VLLM_PYTHON", raising=False)
    monkeypatch.setattr(vp, "REPO_ROOT", tmp_path)
    real_find = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "vllm" else real_find(name, *a),
    )
    cfg = validate(SynthConfig, {"engine": {"name": "vllm"}}).engine
    target = load_target(str(tiny_gemma_dir), with_model=False)
    with pytest.raises(
        PolyspecError, match=r"^vLLM is not installed: make setup-vllm .*polyspec\[vllm\]"
    ) as e:
        make_engine(cfg, target)
    assert "\n" not in str(e.value)
    monkeypatch.setenv("POLYSPEC_VLLM_PYTHON", str(tmp_path / "nothing"))
    with pytest.raises(PolyspecError, match=r"POLYSPEC_VLLM_PYTHON=.* is not an executable Python"):
        make_engine(cfg, target)


def test_vllm_capture_needs_the_targets_weights(tiny_gemma_dir):
    target = load_target(str(tiny_gemma_dir), with_model=False)
    engine = VLLMEngine(target, llm=FakeLLM(), sampling_params_cls=FakeSamplingParams)
    with pytest.raises(PolyspecError, match="needs the target's weights"):
        engine.generate([Request("p1", seed=0)], capture=[1, 2])


def test_vllm_capture_is_the_targets_prefill_over_prompt_and_answer(tiny_llama_dir):
    """With capture, the vLLM engine's features are the target's own prefill over prompt + answer
    less its last token, in the transformers engine's capture layout (ids, prompt_tokens, f,
    aux)."""
    from polyspec.features import prefill_features

    target = load_target(str(tiny_llama_dir), device="cpu", dtype="float32")
    engine = VLLMEngine(target, llm=FakeLLM(), sampling_params_cls=FakeSamplingParams)
    res = engine.generate(
        [Request("p1", seed=0), Request("a longer prompt", seed=1)], capture=[1, 2]
    )
    for r, p in zip(res, ["p1", "a longer prompt"]):
        prompt = engine.prompt(p)["prompt_token_ids"]
        # the fake's 9 tokens, less the last
        assert r.prompt_tokens == len(prompt) and r.ids == prompt + [1] * 8
        want = prefill_features(target, [r.ids], [1, 2])[0]
        assert r.features["f"].shape == (len(r.ids), target.hidden_size)
        assert torch.allclose(r.features["f"], want["f"], atol=1e-5) and torch.allclose(
            r.features["aux"], want["aux"], atol=1e-5
        )


# ------------------------------------------------------------------------------------ distillation


def test_distill_at_several_temperatures(tmp_path, tiny_llama_dir):
    cfg = validate(
        DistillConfig,
        {
            "lang": "ja",
            "run": str(tmp_path),
            "target": str(tiny_llama_dir),
            "temperatures": [0.0, 1.0],
            "sampling": {"max_new_tokens": 8},
            "engine": {"batch_size": 4},
        },
    )
    stats = run_distill(cfg)
    data = read_jsonl(tmp_path / "synth" / "ja-distill" / "data.jsonl")
    n_prompts = len(get_language("ja").seeds)
    assert stats["attempted"] == 2 * n_prompts == len(data) + stats["rejected"]
    assert {r["temperature"] for r in data} <= {0.0, 1.0} and all(
        r["source"] == "self-distill" for r in data
    )
    assert len({r["id"] for r in data}) == len(data)
    # T=0 answers are the target's greedy answers to the rendered prompt
    t = load_target(str(tiny_llama_dir))
    fmt = t.spec.prompt_format
    for r in [r for r in data if r["temperature"] == 0.0][:3]:
        prompt = render(
            fmt, t.tokenizer, [{"role": "user", "content": r["conversations"][0]["value"]}]
        )
        ids = t.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        ref = t.tokenizer.decode(greedy_generate(t, ids, 8), skip_special_tokens=True)
        assert r["conversations"][1]["value"] == strip_leakage(ref, fmt.stop)


def test_distill_from_file_and_continuation_mode(tmp_path, tiny_gemma_dir):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                {"instruction": "Viết một bài thơ ngắn."},
                {
                    "conversations": [
                        {"from": "human", "value": "Kể một câu chuyện."},
                        {"from": "gpt", "value": "..."},
                    ]
                },
            ]
        )
        + "\n"
    )
    cfg = validate(
        DistillConfig,
        {
            "lang": "vi",
            "run": str(tmp_path),
            "target": str(tiny_gemma_dir),
            "prompts": str(prompts),
            "temperatures": [0.3],
            "sampling": {"max_new_tokens": 6},
        },
    )
    run_distill(cfg)
    data = read_jsonl(tmp_path / "synth" / "vi-distill" / "data.jsonl")
    assert [r["conversations"][0]["value"] for r in data] == [
        "Viết một bài thơ ngắn.",
        "Kể một câu chuyện.",
    ]
    cont = validate(
        DistillConfig,
        {
            "lang": "vi",
            "run": str(tmp_path),
            "target": str(tiny_gemma_dir),
            "continuation": True,
            "out_name": "pretrain",
            "temperatures": [1.0],
            "limit": 4,
            "sampling": {"max_new_tokens": 6},
        },
    )
    run_distill(cont)
    data = read_jsonl(tmp_path / "synth" / "vi-pretrain" / "data.jsonl")
    assert len(data) + len(read_jsonl(tmp_path / "synth" / "vi-pretrain" / "rejected.jsonl")) == 4
    assert all(r["text"].startswith(r["conversations"][0]["value"]) for r in data)


def test_distill_bad_prompt_source(tmp_path):
    with pytest.raises(PolyspecError, match="not a file"):
        run_distill(validate(DistillConfig, {"prompts": "nothing-here", "run": str(tmp_path)}))


def test_make_synth_invalid_and_untranslated_language():
    proc = run_cli("make", "-s", "synth", "LANG=xx")
    assert proc.returncode != 0 and "'xx'" in proc.stderr
    assert os.environ.get("LANG", "") != "xx"


def test_distill_max_seconds_stops_at_a_commit_and_a_rerun_goes_on(tmp_path, tiny_llama_dir):
    """``max_seconds`` (a lent GPU's budget): distillation stops at the first commit past it, keeps
    what it committed (stats ``complete: false``), and a rerun without the budget answers the rest —
    the records an uninterrupted run writes."""
    base = {
        "lang": "en",
        "target": str(tiny_llama_dir),
        "prompts": "pool",
        "limit": 6,
        "temperatures": [0.0, 1.0],
        "sampling": {"max_new_tokens": 4},
        "engine": {"batch_size": 2},
        "batches_per_commit": 1,
    }
    cut = validate(DistillConfig, {**base, "run": str(tmp_path / "a"), "max_seconds": 1e-6})
    stats = run_distill(cut)
    assert stats["complete"] is False and stats["attempted"] == 2, (
        "one commit of one batch, then the budget stops it"
    )
    done = run_distill(validate(DistillConfig, {**base, "run": str(tmp_path / "a")}))
    whole = run_distill(validate(DistillConfig, {**base, "run": str(tmp_path / "b")}))
    assert done["complete"] and done["attempted"] == whole["attempted"] == 12
    strip = lambda rs: [{k: v for k, v in r.items() if k != "lid"} for r in rs]  # noqa: E731
    assert strip(read_jsonl(tmp_path / "a" / "synth" / "en-distill" / "data.jsonl")) == strip(
        read_jsonl(tmp_path / "b" / "synth" / "en-distill" / "data.jsonl")
    )


def test_overrides_may_follow_the_flags(tmp_path, capsys):
    """``key=value`` overrides after a flag reach the config (argparse alone refused them with
    'unrecognized arguments' once a flag stood between two of them)."""
    from synth.__main__ import main

    for argv in (
        ["distill", "--lang", "en", "seed=0", "--prompts", "heldout", "no_such_key=1"],
        ["--lang", "en", "seed=0", "--n", "4", "no_such_key=1"],
    ):
        with pytest.raises(SystemExit):
            main([*argv[:-1], "--run", str(tmp_path), argv[-1]])
        err = capsys.readouterr().err
        # the config refused the unknown key: argparse passed it through
        assert "no_such_key: unknown key" in err and "unrecognized" not in err, err
