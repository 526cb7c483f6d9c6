"""The distillation prompt pool and the held-out prompts (synth/pool.py; issue 14 items 1 and 4). No
model."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from polyspec import heldout
from polyspec.errors import PolyspecError
from polyspec.languages import get_language
from synth import pool
from synth.pool import (
    HeldoutPrompt,
    benchmark_turns,
    build_pool,
    load_heldout,
    load_heldout_chat,
    load_tasks,
    pool_items,
)

LANGS = ["en", "de", "fr", "es", "zh", "ja", "vi"]
STEP_BY_STEP = {
    "Explain step by step.",
    "Erkläre Schritt für Schritt.",
    "Explique étape par étape.",
    "Explica paso a paso.",
    "順を追って説明してください。",
    "Hãy giải thích từng bước.",
}
TASK_KINDS = {"seed", "qa", "rag", "summarization", "translation", "math", "code", "multiturn"}


def _norm(text: str) -> str:
    return " ".join(text.split())


def _heldout_turns() -> set[str]:
    return {_norm(t) for lang in LANGS for r in load_heldout(lang) for t in r["turns"]}


def _write_synth(run, lang: str, instructions: list[str]) -> None:
    path = run / "synth" / lang / "data.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(instructions):
            f.write(
                json.dumps(
                    {
                        "id": f"{lang}-{i}",
                        "conversations": [
                            {"from": "human", "value": text},
                            {"from": "gpt", "value": "…"},
                        ],
                    }
                )
                + "\n"
            )


@pytest.mark.parametrize("lang", LANGS)
def test_every_language_has_a_broad_pool_of_every_kind(lang):
    items = pool_items(lang, None)
    assert len(items) >= 150, f"{lang}: only {len(items)} prompts"
    assert {p.kind for p in items} == TASK_KINDS
    messages = build_pool(lang, None)
    assert len(messages) == len(items)
    assert all(m and all(x["role"] == "user" and x["content"].strip() for x in m) for m in messages)
    assert all(len(p.turns) == 2 for p in items if p.kind == "multiturn")


@pytest.mark.parametrize("lang", LANGS)
def test_pool_never_contains_heldout_or_benchmark_text(lang, tmp_path):
    forbidden = _heldout_turns() | benchmark_turns()
    # the task files themselves (before the guard): no filled prompt, question or passage is
    # benchmark or held-out text, nor a seed's instruction
    raw = [t for ps in pool.task_prompts(lang).values() for p in ps for t in p.turns]
    assert not {_norm(t) for t in raw} & forbidden
    tasks = load_tasks(lang)
    atoms = (
        [p.text for p in tasks.passages]
        + [p.question for p in tasks.passages]
        + tasks.qa
        + tasks.math
        + tasks.code
        + [t for pair in tasks.multiturn for t in pair]
    )
    for atom in atoms:
        hits = [t for t in forbidden if _norm(atom) in t]
        assert not hits, f"{lang}: {atom!r} occurs in held-out/benchmark prompt {hits[0]!r}"
    seeds = {_norm(s.instruction) for s in get_language(lang).seeds}
    assert not seeds & {_norm(a) for a in atoms}
    # nor does any sentence of a benchmark / held-out prompt occur inside a pool prompt, except the
    # instruction wording the templates share with the benchmark on purpose
    shared = "\x00".join(
        list(tasks.templates.rag)
        + list(tasks.templates.summarization)
        + [tasks.templates.translation_into, tasks.templates.translation_out_of or ""]
    )
    pool_text = "\x00".join(_norm(t) for t in raw)
    for turn in forbidden:
        for piece in re.split(r"(?<=[.!?。！？])\s*|\n+|[:：]\s", turn):
            piece = _norm(piece)
            if len(piece) >= 12 and piece not in shared and piece not in STEP_BY_STEP:
                assert piece not in pool_text, f"{lang}: {piece!r} of {turn!r} is in the pool"
    # the guard: benchmark and held-out prompts coming in through synth data (or the seeds) are
    # dropped
    bench = sorted(benchmark_turns())[0]
    held = load_heldout(lang)[0]["turns"][0]
    _write_synth(
        tmp_path, lang, [bench, held, "  " + held.replace(" ", "  ") + " ", "A fresh instruction."]
    )
    texts = {_norm(m["content"]) for msgs in build_pool(lang, str(tmp_path)) for m in msgs}
    assert not texts & forbidden
    assert "A fresh instruction." in texts


def test_heldout_has_twenty_four_valid_prompts_per_language():
    lines = [
        json.loads(x) for x in pool.HELDOUT.read_text(encoding="utf-8").splitlines() if x.strip()
    ]
    assert len(lines) == 24 * len(LANGS) and len({r["id"] for r in lines}) == len(lines)
    for lang in LANGS:
        recs = load_heldout(lang)
        assert len(recs) == 24
        assert all(
            HeldoutPrompt.model_validate(r).lang == lang and r["id"].startswith(f"{lang}-heldout-")
            for r in recs
        )
        assert {"qa", "rag", "translation", "summarization", "code", "math"} <= {
            r["category"] for r in recs
        }
    # held-out prompts are not benchmark prompts either
    assert not _heldout_turns() & benchmark_turns()


def _chat_turns() -> list[str]:
    return [t for r in load_heldout_chat("en") for t in r["turns"]]


def test_chat_heldout_has_thirty_two_valid_two_turn_prompts():
    lines = [
        json.loads(x)
        for x in pool.HELDOUT_CHAT.read_text(encoding="utf-8").splitlines()
        if x.strip()
    ]
    assert len(lines) == 32 and len({r["id"] for r in lines}) == 32
    recs = load_heldout_chat("en")
    assert recs == [heldout.HeldoutChatPrompt.model_validate(r).model_dump() for r in lines]
    assert [r["id"] for r in recs] == [f"en-chat-{i:02d}" for i in range(1, 33)]
    assert all(len(r["turns"]) == 2 and all(t.strip() for t in r["turns"]) for r in recs)
    assert all(len(t) < 400 for t in _chat_turns())
    cats = [r["category"] for r in recs]
    assert {c: cats.count(c) for c in set(cats)} == {c: 4 for c in heldout.CHAT_CATEGORIES}
    assert len(heldout.CHAT_CATEGORIES) == 8
    assert load_heldout_chat("de") == []


def test_chat_heldout_is_disjoint_from_heldout_benchmark_and_pool():
    chat = {_norm(t) for t in _chat_turns()}
    assert len(chat) == 64, "a turn repeats within the chat held-out set"
    assert not chat & _heldout_turns()
    assert not chat & benchmark_turns()
    # the pool before the guard (task file prompts and seeds) and after it
    raw = {_norm(t) for ps in pool.task_prompts("en").values() for p in ps for t in p.turns}
    raw |= {_norm(s.instruction) for s in get_language("en").seeds}
    assert not chat & raw
    assert not chat & {_norm(m["content"]) for msgs in build_pool("en", None) for m in msgs}


def test_pool_drops_chat_heldout_turns_from_synth_data(tmp_path):
    """The guard: chat held-out turns (first or follow-up, whitespace varied) coming in through
    synth data never reach the pool."""
    recs = load_heldout_chat("en")
    first, follow = recs[0]["turns"][0], recs[5]["turns"][1]
    spaced = "  " + recs[12]["turns"][0].replace(" ", "   ") + "\n"
    _write_synth(tmp_path, "en", [first, follow, spaced, "A fresh instruction."])
    items = pool_items("en", str(tmp_path))
    texts = {_norm(t) for p in items for t in p.turns}
    assert not texts & {_norm(t) for t in _chat_turns()}
    assert [p.turns for p in items if p.kind == "instruction"] == [("A fresh instruction.",)]
    assert {_norm(first), _norm(follow), _norm(spaced)} <= pool.forbidden_turns()


def test_distill_loads_chat_heldout_prompts_turn_by_turn():
    from synth.config import DistillConfig
    from synth.distill import load_prompts

    prompts = load_prompts(DistillConfig(lang="en", prompts="heldout-chat"))
    assert len(prompts) == 32
    assert all(len(p) == 2 and all(m["role"] == "user" for m in p) for p in prompts)
    assert [[m["content"] for m in p] for p in prompts] == [
        r["turns"] for r in load_heldout_chat("en")
    ]
    assert len(load_prompts(DistillConfig(lang="en", prompts="heldout-chat", limit=5))) == 5
    with pytest.raises(PolyspecError, match="no heldout-chat prompts"):
        load_prompts(DistillConfig(lang="de", prompts="heldout-chat"))


def test_malformed_chat_heldout_is_a_one_line_error(tmp_path, monkeypatch):
    bad = tmp_path / "heldout-chat.jsonl"
    rec = {"id": "en-chat-01", "lang": "en", "category": "poetry", "turns": ["x", "y"]}
    bad.write_text(json.dumps(rec) + "\n")
    monkeypatch.setattr(heldout, "HELDOUT_CHAT", bad)
    heldout.heldout_chat_all.cache_clear()
    try:
        with pytest.raises(PolyspecError) as e:
            load_heldout_chat("en")
        assert "\n" not in str(e.value) and "category" in str(e.value)
    finally:
        heldout.heldout_chat_all.cache_clear()


def test_order_is_stable_and_interleaved(tmp_path):
    _write_synth(tmp_path, "de", [f"Erkläre Thema Nummer {i}." for i in range(40)])
    a, b = build_pool("de", str(tmp_path)), build_pool("de", str(tmp_path))
    assert a == b
    items = pool_items("de", str(tmp_path))
    assert [p.kind for p in items[:9]] == list(pool.KINDS)  # one of each kind first: round robin
    explicit = build_pool("de", None, synth_file=str(tmp_path / "synth" / "de" / "data.jsonl"))
    assert explicit == a


@pytest.mark.parametrize("limit", [len(pool.KINDS), 30])
def test_limit_keeps_every_kind(tmp_path, limit):
    _write_synth(tmp_path, "ja", [f"テーマ{i}について説明してください。" for i in range(500)])
    items = pool_items("ja", str(tmp_path), limit=limit)
    assert len(items) == limit
    assert {p.kind for p in items} == set(pool.KINDS)
    assert build_pool("ja", str(tmp_path), limit=limit) == [p.messages for p in items]


@pytest.fixture
def broken_tasks(tmp_path, monkeypatch):
    """A copy of the task files in tmp_path that a test may break (the cache is cleared around
    it)."""
    shutil.copytree(pool.TASKS_DIR, tmp_path / "tasks")
    monkeypatch.setattr(pool, "TASKS_DIR", tmp_path / "tasks")
    load_tasks.cache_clear()
    yield tmp_path / "tasks"
    load_tasks.cache_clear()


@pytest.mark.parametrize(
    "breakage", ["not yaml", "few passages", "template", "unknown key", "lang"]
)
def test_malformed_task_file_is_a_one_line_error(broken_tasks, breakage):
    path = broken_tasks / "fr.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if breakage == "few passages":
        data["passages"] = data["passages"][:3]
    elif breakage == "template":
        data["templates"]["rag"] = ["Réponds : {passage}"]  # no {question}
    elif breakage == "unknown key":
        data["qestions"] = ["?"]
    elif breakage == "lang":
        data["lang"] = "es"
    text = (
        "passages: [unclosed\n"
        if breakage == "not yaml"
        else yaml.safe_dump(data, allow_unicode=True)
    )
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PolyspecError) as e:
        build_pool("fr", None)
    msg = str(e.value)
    assert "\n" not in msg and "fr.yaml" in msg, msg


def test_malformed_heldout_is_a_one_line_error(tmp_path, monkeypatch):
    bad = tmp_path / "heldout.jsonl"
    bad.write_text(
        json.dumps({"id": "de-heldout-01", "lang": "de", "category": "poetry", "turns": ["x"]})
        + "\n"
    )
    monkeypatch.setattr(heldout, "HELDOUT", bad)
    heldout.heldout_all.cache_clear()
    try:
        with pytest.raises(PolyspecError) as e:
            load_heldout("de")
        assert "\n" not in str(e.value) and "category" in str(e.value)
    finally:
        heldout.heldout_all.cache_clear()


def test_corpus_paragraphs_become_prompts_after_the_pool(tmp_path):
    """``corpus_prompts``: the corpus stage's paragraphs of 200–1,200 characters, each in one of the
    language's summarization templates, follow the pool's own prompts (the pool's order and content
    unchanged); short and long paragraphs are left out; held-out text never gets in; a missing
    corpus is one line."""
    tpl = load_tasks("en").templates.summarization
    good = [
        (f"Paragraph {i}: " + "the quick brown fox jumps over the lazy dog. " * 6).strip()
        for i in range(5)
    ]
    held = load_heldout("en")[0]["turns"][0]
    docs = [
        {"id": "a", "text": "\n\n".join([good[0], "too short", good[1], "x" * 1300])},
        {"id": "b", "text": "\n\n".join(good[2:])},
    ]
    (tmp_path / "corpus" / "en").mkdir(parents=True)
    (tmp_path / "corpus" / "en" / "data.jsonl").write_text(
        "".join(json.dumps(d) + "\n" for d in docs)
    )
    base = build_pool("en", str(tmp_path))
    more = build_pool("en", str(tmp_path), corpus=4)
    assert more[: len(base)] == base and len(more) == len(base) + 4
    added = [p[0]["content"] for p in more[len(base) :]]
    assert all(any(t.replace("{passage}", g) == a for t in tpl for g in good) for a in added)
    assert {a for a in added} != {tpl[0].replace("{passage}", g) for g in good[:4]}, (
        "the templates alternate"
    )
    assert held not in added
    with pytest.raises(PolyspecError, match="corpus prompts: .* not found"):
        build_pool("en", str(tmp_path / "nowhere"), corpus=2)
