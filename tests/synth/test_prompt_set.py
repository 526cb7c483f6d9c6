"""The on-policy prompt set at scale: Alg. 1's near-duplicate gate and rotating few-shot prompts,
``python -m synth prompts`` (guard, near-duplicates, shares, report) and distill reading it."""

import json

from polyspec.config import apply_overrides, validate
from polyspec.heldout import HELDOUT_CATEGORIES, heldout_all, heldout_chat_all
from polyspec.languages import get_language
from polyspec.targets import load_target
from synth.config import DistillConfig, SynthConfig
from synth.distill import load_prompts
from synth.engines import Result
from synth.filters import NearDuplicates
from synth.prompt_set import build_prompt_set, category_of, distinct_ngrams
from synth.selfsynth import derive_seed, instruction_prompt, run_selfsynth

# Instructions a fake target writes, in turn: two near-copies of the first, one exact copy
INSTRUCTIONS = [
    "How can I relax before going to sleep at night?",
    "Write a short poem about the sea and the wind.",
    "How can I relax before going to sleep at night, please?",
    "Explain why the sky looks blue during the day.",
    "How can I relax before going to sleep at night?",
    "Name three ways to save water at home every day.",
    "What is the capital city of Canada and why?",
    "Give me a recipe for a simple tomato soup.",
]


ATTEMPT = {derive_seed(0, a, "instruction"): a for a in range(64)}


class FakeEngine:
    """For Alg. 1's attempt a (known by its seed) writes INSTRUCTIONS[a] as the instruction (the
    prompt ends in an open user turn), and one English answer to any instruction; records the
    prompts it was given."""

    def __init__(self):
        self.prompts = []

    def generate(self, requests, capture=None):
        out = []
        for r in requests:
            self.prompts.append(r.prompt)
            if r.prompt.endswith("<|user|>\n"):
                text = INSTRUCTIONS[ATTEMPT[r.seed] % len(INSTRUCTIONS)]
            else:
                text = "Here is a clear and friendly answer in plain English for you."
            out.append(Result(text=text, num_tokens=12, finished=True))
        return out


def _cfg(run, target_dir, *extra, n=5):
    data = apply_overrides(
        {},
        [
            "lang=en",
            f"n={n}",
            f"run={run}",
            f"target={target_dir}",
            "engine.batch_size=2",
            "filters.require_language=false",
            *extra,
        ],
    )
    return validate(SynthConfig, data)


def test_near_duplicates_finds_near_copies_only():
    near = NearDuplicates(0.7)
    near.add(INSTRUCTIONS[0])
    assert near.seen(INSTRUCTIONS[0]) and near.seen(INSTRUCTIONS[2])
    assert not near.seen(INSTRUCTIONS[1]) and not near.seen(INSTRUCTIONS[3])
    again = NearDuplicates(0.7)  # deterministic: a rebuilt index answers alike
    again.add(INSTRUCTIONS[0])
    assert [again.seen(t) for t in INSTRUCTIONS] == [near.seen(t) for t in INSTRUCTIONS]


def test_alg1_rejects_near_duplicates_and_resumes_to_the_one_go_result(tmp_path, tiny_llama_dir):
    target = load_target(str(tiny_llama_dir))
    near = ["filters.near_duplicate=0.7"]
    run_selfsynth(_cfg(tmp_path / "one", tiny_llama_dir, *near), target, FakeEngine(), log=print)
    out = tmp_path / "one" / "synth" / "en"
    kept = [json.loads(x)["conversations"][0]["value"] for x in open(out / "data.jsonl")]
    rejected = [json.loads(x) for x in open(out / "rejected.jsonl")]
    assert kept == [INSTRUCTIONS[i] for i in (0, 1, 3, 5, 6)]
    assert [r["reason"] for r in rejected] == ["near_duplicate", "duplicate"]
    # without the gate the near copy is kept (only the exact pair repeat is refused)
    run_selfsynth(_cfg(tmp_path / "off", tiny_llama_dir), target, FakeEngine(), log=print)
    off = [
        json.loads(x)["conversations"][0]["value"]
        for x in open(tmp_path / "off/synth/en/data.jsonl")
    ]
    assert INSTRUCTIONS[2] in off
    # stopped at 2 kept, continued to 5: the index is rebuilt from what was kept
    eng = FakeEngine()
    run_selfsynth(_cfg(tmp_path / "two", tiny_llama_dir, *near, n=2), target, eng, log=print)
    assert len((tmp_path / "two" / "synth" / "en" / "data.jsonl").read_text().splitlines()) == 2
    run_selfsynth(_cfg(tmp_path / "two", tiny_llama_dir, *near), target, eng, log=print)
    for name in ("data.jsonl", "rejected.jsonl"):
        a = (out / name).read_text()
        assert a == (tmp_path / "two" / "synth" / "en" / name).read_text(), name


def test_few_shot_variants_rotate_per_batch(tmp_path, tiny_llama_dir):
    target, en = load_target(str(tiny_llama_dir)), get_language("en")
    v0, v1 = (instruction_prompt(target, en, 3, v) for v in (0, 1))
    assert v0 != v1 and v1 == instruction_prompt(target, en, 3, 1)
    assert sum(s.instruction in v1 for s in en.seeds) == 3
    eng = FakeEngine()
    cfg = _cfg(tmp_path, tiny_llama_dir, "few_shot=3", "few_shot_variants=2", n=4)
    run_selfsynth(cfg, target, eng, log=print)
    asked = [p for p in eng.prompts if p.endswith("<|user|>\n")]
    assert asked[:4] == [v0, v0, v1, v1]  # batch size 2: one variant a batch


def test_prompt_set_guards_dedups_shuffles_and_reports(tmp_path):
    held = heldout_all()[0]["turns"][0]
    chat = heldout_chat_all()[0]["turns"][0]
    synth = tmp_path / "synth" / "en"
    synth.mkdir(parents=True)
    near_held = held.rstrip("?.") + " please?"  # a near-copy of a held-out prompt
    lines = [*INSTRUCTIONS, held, chat, near_held, "Translate 'good morning' into French."]
    synth.joinpath("data.jsonl").write_text(
        "".join(
            json.dumps(
                {"conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "ok"}]}
            )
            + "\n"
            for t in lines
        )
    )
    report = build_prompt_set("en", str(tmp_path), seed=3)
    path = tmp_path / "synth" / "en-prompts" / "prompts.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    turns = [t for r in recs for t in r["turns"]]
    assert held not in turns and chat not in turns  # the guard
    assert near_held not in turns and report["near_heldout_removed_by_kind"]["instruction"] == 1
    assert INSTRUCTIONS[2] not in turns and INSTRUCTIONS[0] in turns  # near copy removed
    assert report["near_duplicates_removed_by_kind"]["instruction"] == 1
    assert report["prompts"] == len(recs) and len({r["id"] for r in recs}) == len(recs)
    assert {r["category"] for r in recs} <= set(HELDOUT_CATEGORIES)
    assert sum(report["by_category"].values()) == len(recs)
    assert report["by_kind"]["instruction"] == 7  # 8 distinct lines (a repeat), one near copy
    assert {"multiturn", "seed", "qa", "code"} <= set(report["by_kind"])
    assert report["distinct_ngrams"]["1"]["distinct"] > 0
    # a seeded shuffle: the same set again is the same file; another seed another order
    assert path.read_text() == (build_prompt_set("en", str(tmp_path), seed=3) and path.read_text())
    build_prompt_set("en", str(tmp_path), seed=4)
    other = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["turns"] for r in other] != [r["turns"] for r in recs]
    # distill reads it: every user turn of each prompt, in order
    prompts = load_prompts(DistillConfig(lang="en", prompts=str(path)))
    assert len(prompts) == len(other)
    assert [[m["content"] for m in p] for p in prompts] == [r["turns"] for r in other]
    assert any(len(p) == 2 for p in prompts) and all(
        m["role"] == "user" for p in prompts for m in p
    )


def test_a_later_round_asks_only_prompts_no_earlier_set_had(tmp_path):
    synth = tmp_path / "synth" / "en"
    synth.mkdir(parents=True)

    def alg1(lines):
        synth.joinpath("data.jsonl").write_text(
            "".join(
                json.dumps({"conversations": [{"from": "human", "value": t}, {"from": "gpt"}]})
                + "\n"
                for t in lines
            )
        )

    old = [INSTRUCTIONS[i] for i in (0, 1, 3, 5)]
    alg1(old)
    one = build_prompt_set("en", str(tmp_path))
    first = tmp_path / "synth" / "en-prompts" / "prompts.jsonl"
    before = [json.loads(x) for x in first.read_text().splitlines()]
    later = ["Describe how a bicycle gear system works.", INSTRUCTIONS[0] + " now"]
    alg1([*old, *later])  # Alg. 1 went on: the old pairs, then new ones
    report = build_prompt_set("en", str(tmp_path), out_name="prompts-r2", exclude=[str(first)])
    recs = [
        json.loads(x)
        for x in (tmp_path / "synth" / "en-prompts-r2" / "prompts.jsonl").read_text().splitlines()
    ]
    assert [r["turns"] for r in recs] == [[later[0]]]  # the near-copy of an old one is out too
    assert report["in_earlier_sets_by_kind"]["instruction"] == 4
    assert report["near_duplicates_removed_by_kind"] == {
        **one["near_duplicates_removed_by_kind"],
        "instruction": 1,
    }
    removed = [
        report[f"{k}_by_kind"]
        for k in ("in_earlier_sets", "near_duplicates_removed", "near_heldout_removed")
    ]
    assert sum(sum(d.values()) for d in removed) + 1 == report["candidates"]
    assert recs[0]["id"] == "en-prompts-r2-000000"
    assert first.read_text().splitlines() == [json.dumps(r, ensure_ascii=False) for r in before]


def test_category_of_and_distinct_ngrams():
    assert category_of("instruction", ("Translate this into German: hello",)) == "translation"
    assert category_of("instruction", ("Write a Python function that sorts a list.",)) == "code"
    assert category_of("instruction", ("What is 12 * 7?",)) == "math"
    assert (
        category_of("instruction", ("Summarize the main points of stoicism.",)) == "summarization"
    )
    assert category_of("instruction", ("Why is the sea salty?",)) == "qa"
    assert category_of("passage", ("Summarise: ...",)) == "summarization"
    assert category_of("seed", ("a", "b")) == "multiturn"
    d = distinct_ngrams(["a b a b", "a b c"], 2)
    assert d == {"distinct": 3, "total": 5, "ratio": 0.6}
