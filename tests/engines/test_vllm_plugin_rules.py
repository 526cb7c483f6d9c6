"""The vLLM plugin's pure-Python parts (plugins/vllm: polyspec_vllm.settings, .hybrid's rule,
.checks, the version pin), without vLLM. The plugin inside the real vLLM: test_vllm_plugin.py."""

from __future__ import annotations

import json

import pytest
import torch

from polyspec_vllm import SUPPORTED_VLLM, PolyspecVllmError, check_vllm_version
from polyspec_vllm.checks import drafter_problems
from polyspec_vllm.hybrid import HybridProposer, HybridStats, choose, drafter_tokens
from polyspec_vllm.settings import FILE, Hybrid, Settings, SettingsError, parse, read, write


def test_the_hybrid_takes_the_ngram_row_where_there_is_one_else_the_drafters_own_length():
    ngram = [[5, 6, 7], [], [9], []]
    drafted = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 1, 1]]
    rows, took = choose(ngram, drafted, drafter_tokens=2)
    assert rows == [[5, 6, 7], [4, 5], [9], [1, 1]]
    assert took == [True, False, True, False]
    with pytest.raises(ValueError, match="3 n-gram rows for 4"):
        choose(ngram[:3], drafted, 2)
    stats = HybridStats(log_every=2)
    assert not stats.add(took, 2) and stats.add([True, True], 0)
    assert (stats.ngram_rows, stats.drafter_rows, stats.steps, stats.mixed_steps) == (4, 2, 2, 1)
    assert stats.ngram_only_steps == 1


def test_the_drafter_drafts_nothing_on_a_step_whose_every_row_is_an_ngram_one():
    """Its forward still runs (vLLM's drafter KV cache stays whole) but at length 0; a request
    that sampled nothing this step (still in its prompt) needs no row."""
    assert drafter_tokens([[5, 6, 7], [9]], [[1], [2, 3]], k=3, own=2) == 0
    assert drafter_tokens([[5, 6, 7], []], [[1], []], k=3, own=2) == 0
    assert drafter_tokens([[5, 6, 7], []], [[1], [4]], k=3, own=2) == 2
    assert drafter_tokens([[], []], [[1], [4]], k=1, own=2) == 1
    # above drafter_max_batch requests in the step: n-gram rows only, no drafter forward
    assert drafter_tokens([[5], []], [[1], [4]], k=3, own=2, max_batch=1) is None
    assert drafter_tokens([[5], []], [[1], []], k=3, own=2, max_batch=1) == 0
    assert drafter_tokens([[], []], [[1], []], k=3, own=2, max_batch=1) == 2


def test_settings_round_trip_and_refuse_what_the_plugin_cannot_honour(tmp_path):
    assert read(tmp_path) is None and read(None) is None
    write(tmp_path, Hybrid(ngram_min=3, ngram_max=5, drafter_tokens=2))
    assert read(tmp_path) == Settings(hybrid=Hybrid(3, 5, 2))
    # the optional drafter_max_batch: written only when set, read back either way
    assert "drafter_max_batch" not in (tmp_path / FILE).read_text()
    write(tmp_path, Hybrid(3, 5, 2, drafter_max_batch=1))
    assert read(tmp_path) == Settings(hybrid=Hybrid(3, 5, 2, 1))
    write(tmp_path, None)
    assert read(tmp_path) == Settings(hybrid=None)
    good = {"format": "polyspec_vllm", "version": 1}
    for bad, says in [
        ({**good, "version": 2}, "version 2"),
        ({**good, "hybird": None}, "unknown keys"),
        ({**good, "hybrid": {"ngram_min": 3}}, "must have the keys"),
        (
            {**good, "hybrid": {"ngram_min": 3, "ngram_max": 5, "drafter_tokens": 2, "x": 1}},
            "must have the keys",
        ),
        ({**good, "hybrid": {"ngram_min": 3, "ngram_max": 5, "drafter_tokens": True}}, "integers"),
        ([], "JSON object"),
    ]:
        with pytest.raises(SettingsError, match=says):
            parse(bad)
    (tmp_path / FILE).write_text("{not json")
    with pytest.raises(SettingsError, match="not valid JSON"):
        read(tmp_path)
    with pytest.raises(SettingsError, match="ngram_min ≤ ngram_max"):
        Hybrid(4, 3, 1).check(3)
    with pytest.raises(SettingsError, match="raise num_speculative_tokens"):
        Hybrid(2, 3, 4).check(3)
    Hybrid(2, 3, 3).check(3)
    with pytest.raises(SettingsError, match="drafter_max_batch must be ≥ 1"):
        Hybrid(2, 3, 3, drafter_max_batch=0).check(3)


def test_the_version_pin():
    check_vllm_version(SUPPORTED_VLLM[0])
    check_vllm_version(SUPPORTED_VLLM[0] + "+cpu")
    with pytest.raises(PolyspecVllmError) as e:
        check_vllm_version("0.31.2")
    assert str(e.value.code).startswith("error: polyspec-vllm: tested with vLLM 0.32.0 only")
    assert "\n" not in str(e.value.code)


def test_a_drafter_folder_is_checked_against_its_target(tmp_path, tiny_llama_dir):
    from types import SimpleNamespace

    from export.interop import write_speculators_folder
    from polyspec.targets import load_target
    from polyspec.testing import oracle_eagle3

    target = load_target(str(tiny_llama_dir), device="cpu", dtype="float32")
    folder = write_speculators_folder(
        oracle_eagle3(target, torch.arange(target.vocab_size)),
        target,
        tmp_path / "en",
        2,
        {"lang": "en", "target": target.pin()},
    )
    cfg = target.model.config

    def like(**kw):
        base = dict(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.num_hidden_layers,
            model_type=cfg.model_type,
        )
        return SimpleNamespace(**{**base, **kw})

    assert drafter_problems(folder, like(), str(tiny_llama_dir)) == []
    assert drafter_problems(folder, like(model_type="gemma3_text"), None) == [
        "it was trained on a llama model, the target is gemma3_text"
    ]
    got = drafter_problems(folder, like(vocab_size=999, num_hidden_layers=1), None)
    n = cfg.num_hidden_layers
    assert f"it was trained on a {n}-layer target, this one has 1" in got
    assert f"its vocabulary has {cfg.vocab_size} ids, the target's 999" in got
    assert any(p.startswith("it reads target layers") for p in got)
    # the same shapes, another tokenizer: its saved vocabulary tells
    other = tmp_path / "other-tok"
    target.tokenizer.save_pretrained(other)
    vocab = json.loads((other / "tokenizer.json").read_text())
    a, b = list(vocab["model"]["vocab"])[10:12]
    vocab["model"]["vocab"][a], vocab["model"]["vocab"][b] = (
        vocab["model"]["vocab"][b],
        vocab["model"]["vocab"][a],
    )
    (other / "tokenizer.json").write_text(json.dumps(vocab))
    assert drafter_problems(folder, like(), str(other)) == [
        "its tokenizer differs from the target's (4 entries differ)"
    ]
    # another export of polyspec's (an hf-assistant model for vLLM's draft_model): not checked here
    cfg_path = folder / "config.json"
    speculators_cfg = cfg_path.read_text()
    cfg_path.write_text(json.dumps({"model_type": "llama", "vocab_size": 5}))
    assert drafter_problems(folder, like(model_type="gemma3_text"), None) == []
    cfg_path.write_text(speculators_cfg)
    # a folder polyspec did not export: not its business
    (folder / "polyspec.json").unlink()
    assert drafter_problems(folder, like(model_type="gemma3_text"), None) == []


def test_where_the_batch_schedule_drafts_nothing_neither_proposer_runs():
    """vLLM's num_speculative_tokens_per_batch_size at 0: no n-gram lookup, no drafter forward
    (measured to cost throughput at 16 requests), empty rows; else both run."""
    from types import SimpleNamespace

    calls = []

    def original(runner, scheduler_output, sampled, *a, **kw):
        calls.append(scheduler_output.num_spec_tokens_to_schedule)
        return torch.tensor([[7, 8]] * len(sampled))

    ngram = SimpleNamespace(
        propose=lambda k, sampled, n, ids: calls.append("ngram") or [[1, 2, 3], []]
    )
    hp = object.__new__(HybridProposer)
    hp.hybrid, hp.stats, hp.ngram = Hybrid(1, 3, 2), HybridStats(), ngram
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(num_tokens_no_spec=None, token_ids_cpu=None)
    )
    out = hp.propose(runner, original, SimpleNamespace(num_spec_tokens_to_schedule=0), [[5], [6]])
    assert out == ([[], []], [False, False], 0) and calls == []
    step = SimpleNamespace(num_spec_tokens_to_schedule=3)
    rows, took, own = hp.propose(runner, original, step, [[5], [6]])
    assert rows == [[1, 2, 3], [7, 8]] and took == [True, False] and own == 2
    assert calls == ["ngram", 2] and step.num_spec_tokens_to_schedule == 3
    # above drafter_max_batch requests: the n-gram rows alone, no drafter forward
    hp.hybrid, calls[:] = Hybrid(1, 3, 2, drafter_max_batch=1), []
    rows, took, own = hp.propose(runner, original, step, [[5], [6]])
    assert rows == [[1, 2, 3], []] and took == [True, False] and own == 0
    assert calls == ["ngram"]
    # one request sampled (the other still in its prompt): the drafter's forward runs, at length 0
    # (the live row has an n-gram row)
    rows, took, own = hp.propose(runner, original, step, [[5], []])
    assert calls == ["ngram", "ngram", 0] and own == 0


def test_a_requests_language_is_its_tag_else_the_language_id_of_its_prompt():
    """ADASPEC per request: the client's tag wins (the prompt is not even read); without one, or
    with a malformed one, fastText's language ID (polyspec's own, lid.176) names it; a language
    without a drafter here drafts with the multilingual drafter (None)."""
    from polyspec_vllm.languages import drafter_keys, identify_text, request_language

    def unread():
        raise AssertionError("a tagged request's prompt must not be read")

    assert request_language({"lang": "vi"}, unread) == "vi"
    assert request_language(None, lambda: "Der Hund läuft schnell über die Straße.") == "de"
    assert request_language({"lang": 7}, lambda: "Le chat dort sur le canapé du salon.") == "fr"
    assert request_language({}, lambda: "", identify=lambda text: None) is None
    assert identify_text("   ") is None
    assert drafter_keys(["vi", "fr", None, "de"], {"vi", "de"}) == ["vi", None, None, "de"]


def test_a_language_tag_that_is_no_language_code_is_one_line_for_a_400():
    from polyspec_vllm.languages import tag_problem

    served = {"vi", "de", "ja"}
    assert tag_problem(None, served) is None and tag_problem({"other": 1}, served) is None
    assert tag_problem({"lang": "fr"}, served) is None  # no drafter: the multilingual one drafts
    for bad in ("Klingon", "", "vi-VN!", 5, None, ["vi"]):
        problem = tag_problem({"lang": bad}, served)
        assert problem.startswith(f"extra_args.lang {bad!r} is no language code")
        assert "de, ja, vi" in problem and "\n" not in problem


def test_settings_list_language_drafters_relative_to_their_folder(tmp_path):
    folder = tmp_path / "speculators" / "multilingual"
    folder.mkdir(parents=True)
    write(folder, Hybrid(2, 4, 2), languages={"vi": "../vi", "de": "../de"})
    got = read(folder)
    assert got.hybrid == Hybrid(2, 4, 2)
    assert got.languages == {"vi": folder / "../vi", "de": folder / "../de"}
    assert read(folder).languages["vi"].resolve() == (tmp_path / "speculators" / "vi").resolve()
    write(folder, None)
    assert read(folder) == Settings()
    base = {"format": "polyspec_vllm", "version": 1}
    for bad, says in (
        ({"languages": {}}, "languages must map language codes"),
        ({"languages": {"Vietnamese": "../vi"}}, "is no ISO 639 code"),
        ({"languages": {"vi": 3}}, "languages.vi must be a folder path"),
    ):
        with pytest.raises(SettingsError, match=says):
            parse({**base, **bad})


def test_language_drafters_must_have_the_multilingual_drafters_shape(tmp_path):
    from polyspec_vllm.checks import shape_problems

    cfg = {
        "draft_vocab_size": 8192,
        "target_hidden_size": 640,
        "eagle_aux_hidden_state_layer_ids": [2, 9, 15],
        "transformer_layer_config": {"hidden_size": 640, "intermediate_size": 2048},
    }
    for name, c in (
        ("mul", cfg),
        ("vi", cfg),
        ("de", {**cfg, "draft_vocab_size": 16384}),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(c))
    assert shape_problems(tmp_path / "mul", tmp_path / "vi") == []
    assert shape_problems(tmp_path / "mul", tmp_path / "de") == [
        "draft_vocab_size 16384 differs from the multilingual drafter's 8192"
    ]
