"""``python -m engines.vllm``'s bookkeeping on a fake vLLM process with known costs and acceptance
(the real vLLM runs in tests/engines/test_vllm_real.py): speedups, α per position, the step cost
fit, the draft length, agreement with its margins, engines.json, a target vLLM serves no EAGLE-3
for, and the one-line errors before any engine starts."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import engines.vllm.run as vb
from conftest import make_tiny_bundle
from engines.vllm.__main__ import main
from export.bundle import load_bundle
from export.interop import write_speculators
from polyspec.errors import PolyspecError
from polyspec.targets import load_target

# the fake's costs: a step of k drafts costs STEP_S · (1 + A + C·k)
PREFILL_S, STEP_S, A, C = 0.005, 0.01, 0.1, 0.2
ACCEPT = [0.8, 0.5, 0.2, 0.1]  # the fake's α_i


class FakeProcess:
    """vLLM's worker as the bench uses it. Plain greedy output follows the prompt's last token; a
    speculative engine returns the same tokens (one divergence can be planted) and counts drafts as
    a chain with α_i = ACCEPT[i]."""

    eagle3 = True
    # (mode name, batch): the first prompt's 6th token differs there, once
    diverge: tuple[str, int] | None = None
    started: list[dict] = []
    fail: dict[str, int] = {}  # mode name → how many of its next starts fail
    envs: list[tuple[str, dict | None]] = []  # (mode name, the extra environment) of each start
    cost = None  # (speculative config, batch size) → a factor on the seconds of a generate call

    def __init__(self, llm, log=None, python=None, env=None):
        self.llm, self.python, self.version, self.load_seconds = llm, python, "fake", 0.0
        self.spec = (llm or {}).get("speculative_config")
        if self.spec:
            FakeProcess.envs.append((_mode(self.spec), env))
        if self.spec and self.fail.get(_mode(self.spec), 0) > 0:
            self.fail[_mode(self.spec)] -= 1
            raise PolyspecError("vLLM failed: RuntimeError: cancelled — log: x.log")
        self.counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "pos": [0] * 8}
        if llm is not None:
            FakeProcess.started.append(llm)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def probe(self, archs):
        return {
            "vllm": "fake",
            "architectures": {a: {"known": True, "eagle3": self.eagle3} for a in archs},
        }

    # greedy and autoregressive: the next token is a function of the last one
    def _tokens(self, ids, n):
        out, cur = [], ids[-1]
        for _ in range(n):
            cur = (cur * 7 + 3) % 97 + 3
            out.append(cur)
        return out

    def generate(self, prompts, params):
        outs, seconds = [], 0.0
        for ids, p in zip(prompts, params):
            toks = self._tokens(ids, p["max_tokens"])
            out = {
                "token_ids": toks,
                "text": "",
                "finish_reason": "length",
                "cumulative_logprob": None,
                "logprobs": None,
            }
            # the margin probe: plain's own token at −0.1, the planted other one at −0.4
            if p.get("logprobs"):
                out["logprobs"] = [[[toks[0], -0.1], [99, -0.4], [98, -2.0]]]
            seconds += PREFILL_S
            if self.spec is None:
                seconds += STEP_S * (len(toks) - 1)
            else:
                k = self.spec["num_speculative_tokens"]
                acc = (ACCEPT if self.spec["method"] == "eagle3" else [0.5] * 8)[:k]
                steps = round((len(toks) - 1) / (1 + sum(acc)))
                seconds += STEP_S * steps * (1 + A + C * k)
                self.counts["drafts"] += steps
                self.counts["draft_tokens"] += steps * k
                for i, a in enumerate(acc):
                    self.counts["pos"][i] += round(steps * a)
                    self.counts["accepted"] += round(steps * a)
                if (
                    self.diverge
                    and self.diverge[0] == _mode(self.spec)
                    and len(prompts) == self.diverge[1]
                    # not the 8-token warm-up
                    and not self.counts.get("diverged")
                    and len(toks) > 8
                ):
                    toks[5] = 99
                    self.counts["diverged"] = True
            outs.append(out)
        if FakeProcess.cost is not None:
            seconds *= FakeProcess.cost(self.spec, len(prompts))
        return outs, seconds

    def metrics(self):
        k = (self.spec or {}).get("num_speculative_tokens", 0)
        return {
            "vllm:spec_decode_num_drafts": self.counts["drafts"],
            "vllm:spec_decode_num_draft_tokens": self.counts["draft_tokens"],
            "vllm:spec_decode_num_accepted_tokens": self.counts["accepted"],
            "vllm:spec_decode_num_accepted_tokens_per_pos": self.counts["pos"][:k],
        }


def _mode(spec):
    return f"{spec['method'].replace('draft_model', 'draft')}@{spec['num_speculative_tokens']}"


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(vb, "VLLMProcess", FakeProcess)
    monkeypatch.setattr(vb, "vllm_python", lambda: "/fake/python")
    FakeProcess.eagle3, FakeProcess.diverge, FakeProcess.started, FakeProcess.fail = (
        True,
        None,
        [],
        {},
    )
    FakeProcess.envs, FakeProcess.cost = [], None
    return FakeProcess


@pytest.fixture(scope="module")
def drafters(tmp_path_factory, tiny_llama_dir):
    root = tmp_path_factory.mktemp("vb")
    target = load_target(str(tiny_llama_dir), device="cpu")
    bundle = make_tiny_bundle(
        root / "bundle", target, langs=("en",), drafter="eagle3", sizes=(64, 256)
    )
    write_speculators(load_bundle(bundle), target, root / "speculators")
    return root / "speculators"


def vllm_cli(target_dir, out, options: str, drafters=None, engines=None, draft_models=None) -> int:
    """``python -m engines.vllm`` into ``out``: ``options`` (split at spaces), the paths given."""
    paths = {"--drafters": drafters, "--engines": engines, "--draft-models": draft_models}
    given = [x for flag, p in paths.items() if p is not None for x in (flag, str(p))]
    return main(["--target", str(target_dir), "--out", str(out), *options.split(), *given])


def _engines(path):
    path.write_text(
        json.dumps(
            {
                "drafters": {"en": {"heldout_alpha": [0.5, 0.25]}},
                "engines": {
                    "vllm": {
                        "command": (
                            'vllm serve t --speculative-config \'{"method": "eagle3", '
                            '"num_speculative_tokens": 3}\''
                        )
                    }
                },
            }
        )
    )
    return path


def test_bench_measures_speedup_acceptance_step_cost_and_draft_length(
    fake, drafters, tiny_llama_dir, tmp_path
):
    engines = _engines(tmp_path / "engines.json")
    rc = vllm_cli(
        tiny_llama_dir,
        tmp_path / "out",
        "--prompts 4 --n 80 --batch 1,2 --hybrid-min=",
        drafters,
        engines,
    )
    assert rc == 0
    rep = json.loads((tmp_path / "out" / "vllm.json").read_text())
    modes = {m["mode"]: m for m in rep["modes"]}
    assert set(modes) == {"ngram", "eagle3@1", "eagle3@2", "eagle3@3", "eagle3@4"}
    e4 = modes["eagle3@4"]["by_batch"]["1"]
    assert e4["alpha"] == pytest.approx(ACCEPT, abs=1e-3)
    assert e4["tokens_per_step"] == pytest.approx(1 + sum(ACCEPT), abs=0.05)
    assert e4["identical"] == e4["prompts"] == 4
    # speedup = plain seconds / spec seconds on the same tokens:
    # (P + 79·S) / (P + steps·S·(1 + A + 4C))
    steps = round(79 / (1 + sum(ACCEPT)))
    want = (PREFILL_S + 79 * STEP_S) / (PREFILL_S + steps * STEP_S * (1 + A + 4 * C))
    assert e4["speedup"] == pytest.approx(want, rel=1e-3)
    d = rep["draft_length"]["en"]
    assert d["step_cost"]["a"] == pytest.approx(A, abs=0.01) and d["step_cost"][
        "c"
    ] == pytest.approx(C, abs=0.005)
    predicted = {int(k): v for k, v in d["predicted_speedup"].items()}
    assert set(predicted) == {1, 2, 3, 4}  # no length past the sweep's longest is predicted
    expect = {k: (1 + sum(ACCEPT[:k])) / (1 + A + C * k) for k in range(1, 5)}
    assert max(expect, key=expect.get) == 2 == d["draft_n"]
    for k in range(1, 5):
        assert predicted[k] == pytest.approx(expect[k], rel=0.03)
    assert d["polyspec_alpha"] == [0.5, 0.25] and "heldout_alpha" in d["polyspec_alpha_from"]
    rec = json.loads(engines.read_text())
    assert rec["drafters"]["en"]["draft_n"]["vllm"] == 2
    # the draft length by batch size: each measured size's best measured length (or 0)
    by_b = {
        b: {
            int(m["mode"][7:]): m["by_batch"][str(b)]["speedup"]
            for m in modes.values()
            if m["mode"].startswith("eagle3@")
        }
        for b in (1, 2)
    }
    want = [[1, 1, max(by_b[1], key=by_b[1].get)], [2, 2, max(by_b[2], key=by_b[2].get)]]
    want = [[a, b, k if by_b[b][k] > 1 else 0] for a, b, k in want]
    assert d["schedule"] == want and want[0][2] > 0
    assert rec["drafters"]["en"]["num_speculative_tokens_per_batch_size"]["vllm"] == want
    assert '"num_speculative_tokens": <draft_n>' in rec["engines"]["vllm"]["command"]
    assert rep["plain_again"]["identical"] == 4 and rep["plain_again"]["drift"] == pytest.approx(
        1.0
    )
    md = (tmp_path / "out" / "vllm.md").read_text()
    assert (
        "## Draft length for en: 2" in md
        and "| eagle3@4 | en |" in md
        and "polyspec's held-out α 0.50, 0.25" in md
    )
    assert "tau" not in modes["ngram"]["by_batch"]["1"] and e4["tau"] == pytest.approx(
        4 * 80 / (4 * steps + 4), rel=1e-3
    )
    started = [c.get("speculative_config") for c in fake.started]
    assert (
        started[0] is None
        and {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        }
        in started
    )


def test_a_divergence_in_fp32_fails_with_its_margin(
    fake, drafters, tiny_llama_dir, tmp_path, capsys
):
    fake.diverge = ("eagle3@2", 1)
    rc = vllm_cli(
        tiny_llama_dir, tmp_path / "out", "--prompts 3 --n 12 --sweep 1,2 --batch 1", drafters
    )
    assert rc == 1 and "eagle3@2(en)@b1" in capsys.readouterr().err
    rep = json.loads((tmp_path / "out" / "vllm.json").read_text())
    b1 = next(m for m in rep["modes"] if m["mode"] == "eagle3@2")["by_batch"]["1"]
    assert b1["identical"] == 2 and b1["prompts"] == 3
    (div,) = b1["divergences"].values()
    assert div["at"] == 5 and div["mode"] == 99 and div["margin"] == pytest.approx(0.3)


def test_a_target_without_eagle3_in_vllm_runs_plain_and_ngram(
    fake, drafters, tiny_llama_dir, tmp_path
):
    fake.eagle3 = False
    engines = _engines(tmp_path / "engines.json")
    assert (
        vllm_cli(tiny_llama_dir, tmp_path / "out", "--prompts 2 --n 8 --batch 1", drafters, engines)
        == 0
    )
    table = json.loads(engines.read_text())["engines"]["vllm"]
    assert (
        table["loads"] == [] and "SupportsEagle3" in table["why"] and "ngram" in table["measured"]
    )
    rep = json.loads((tmp_path / "out" / "vllm.json").read_text())
    assert [m["mode"] for m in rep["modes"]] == ["ngram"] and rep["draft_length"] == {}
    assert (
        "does not implement SupportsEagle3" in rep["refused"]["en"]
        and rep["vllm"]["eagle3_for_target"] is False
    )
    assert all(
        (c.get("speculative_config") or {"method": "ngram"})["method"] == "ngram"
        for c in fake.started
    )


def test_bad_input_is_one_line_before_any_engine(
    fake, drafters, tiny_llama_dir, tmp_path, monkeypatch, capsys
):
    bad = tmp_path / "bad" / "en"
    bad.mkdir(parents=True)
    for f in (drafters / "en").iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((bad / "config.json").read_text())
    cfg["draft_vocab_size"] = 7
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PolyspecError, match="lm_head.weight has shape"):
        vb.bench(str(tiny_llama_dir), tmp_path / "out", bad.parent, s=vb.Settings(prompts=1, n=4))
    assert fake.started == [] and not (tmp_path / "out" / "vllm.json").exists()
    with pytest.raises(SystemExit) as e:
        main(["--target", str(tiny_llama_dir), "--sweep", "0,x"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: --sweep") and err.count("\n") == 1

    def no_vllm():
        raise PolyspecError("vLLM is not installed: make setup-vllm")

    monkeypatch.setattr(vb, "vllm_python", no_vllm)
    with pytest.raises(PolyspecError, match="make setup-vllm"):
        vb.bench(str(tiny_llama_dir), tmp_path / "out", drafters)
    assert fake.started == []


def test_the_run_report_carries_the_vllm_table(fake, drafters, tiny_llama_dir, tmp_path):
    from pipelines.report import measured_engines

    run = tmp_path / "run"
    options = "--prompts 2 --n 12 --sweep 1,2 --batch 1"
    assert vllm_cli(tiny_llama_dir, run / "vllm", options, drafters) == 0
    lines = measured_engines(run)
    assert lines[0] == "### vLLM (`vllm/vllm.md`)"
    # a heading one level down
    assert any(ln.startswith("### Draft length for en: ") for ln in lines)
    assert any(ln.startswith("| eagle3@2 | en |") for ln in lines) and not any(
        "Definitions" in ln for ln in lines
    )


def test_an_engine_that_fails_to_start_is_tried_again_then_recorded(
    fake, drafters, tiny_llama_dir, tmp_path
):
    """vLLM's start-up can fail on its own (its compile cache): one failure is retried; a mode
    failing twice is recorded with vLLM's line and the other draft lengths still run."""
    # eagle3@2 is also the chosen length: run again, failing again
    fake.fail = {"eagle3@2": 4, "eagle3@3": 1}
    options = "--prompts 2 --n 12 --batch 1 --hybrid-min="
    assert vllm_cli(tiny_llama_dir, tmp_path / "out", options, drafters) == 0
    rep = json.loads((tmp_path / "out" / "vllm.json").read_text())
    assert [m["mode"] for m in rep["modes"]] == ["ngram", "eagle3@1", "eagle3@3", "eagle3@4"]
    assert (
        rep["failed"] == {"en: eagle3@2": "RuntimeError: cancelled — log: x.log"}
        and rep["refused"] is None
    )
    assert "**en: eagle3@2 failed in vLLM (twice):**" in (tmp_path / "out" / "vllm.md").read_text()
    # a retry starts vLLM without its compile cache; a first start keeps it
    tries = [env for mode, env in fake.envs if mode == "eagle3@3"]
    assert tries == [None, vb.NO_COMPILE_CACHE]
    assert all(env is None for mode, env in fake.envs if mode == "eagle3@1")


def test_draft_models_run_as_vllms_draft_model_on_the_runs_languages(
    fake, drafters, tiny_llama_dir, tmp_path
):
    """A small-LM folder (hf-assistant export) named for no language runs on the plan's languages
    (en here)."""
    small = tmp_path / "small" / "untrained"
    small.mkdir(parents=True)
    (small / "config.json").write_text("{}")
    options = "--prompts 2 --n 12 --sweep 1,2 --batch 1"
    assert vllm_cli(tiny_llama_dir, tmp_path / "o", options, draft_models=small.parent) == 0
    rep = json.loads((tmp_path / "o" / "vllm.json").read_text())
    got = {m["mode"]: m for m in rep["modes"]}
    d = rep["draft_length"]["untrained (draft_model)"]
    assert set(got) == {"ngram", "draft@1", "draft@2", f"draft@{d['draft_n']}"} and got["draft@2"][
        "langs"
    ] == ["en"]
    assert got["draft@2"]["speculative_config"] == {
        "method": "draft_model",
        "model": str(small),
        "num_speculative_tokens": 2,
    }


def test_the_hybrid_modes_serve_the_drafter_with_the_plugins_settings(
    fake, drafters, tiny_llama_dir, tmp_path
):
    """--hybrid-min 2,3 --hybrid-drafter 1: one hybrid engine per match length, each on a folder of
    links to the drafter's files and the plugin's settings, drafting --ngram-k tokens; the hybrid's
    modes stay out of the draft-length choice (they are not a sweep of the drafter's length)."""
    from polyspec_vllm.settings import Hybrid, read

    rc = vllm_cli(
        tiny_llama_dir,
        tmp_path / "out",
        "--prompts 2 --n 16 --batch 1 --sweep 1,2 --ngram-k 4 --ngram-n 3 --hybrid-min 2,3 "
        "--hybrid-drafter 1",
        drafters,
    )
    assert rc == 0
    rep = json.loads((tmp_path / "out" / "vllm.json").read_text())
    hybrid = {m["mode"]: m for m in rep["modes"] if m["mode"].startswith("hybrid")}
    assert set(hybrid) == {"hybrid-m2@1", "hybrid-m3@1"}
    for m, entry in ((2, hybrid["hybrid-m2@1"]), (3, hybrid["hybrid-m3@1"])):
        spec = entry["speculative_config"]
        assert spec["method"] == "eagle3" and spec["num_speculative_tokens"] == 4
        folder = Path(spec["model"])
        assert read(folder).hybrid == Hybrid(ngram_min=m, ngram_max=3, drafter_tokens=1)
        assert (folder / "model.safetensors").resolve() == (
            drafters / "en" / "model.safetensors"
        ).resolve()
        assert entry["drafter"] == "en" and entry["by_batch"]["1"]["identical"] == 2
    assert set(rep["draft_length"]["en"]["measured_speedup"]) == {"1", "2"}


def test_the_batch_schedule_drafts_each_measured_size_its_best_length_and_none_where_all_lose():
    from engines.vllm.report import batch_schedule

    got = batch_schedule({16: {1: 0.8, 2: 0.7}, 1: {1: 1.3, 2: 1.5, 3: 1.5}, 4: {1: 1.1, 2: 1.05}})
    # batch 1: 2 and 3 tie, the shorter; 2-4: 1; 5-16: nothing beats plain
    assert got == [[1, 1, 2], [2, 4, 1], [5, 16, 0]]
    assert batch_schedule({}) == []


def test_questions_files_replace_the_held_out_prompts(fake, drafters, tiny_llama_dir, tmp_path):
    """--questions: a user's own prompts (the decoder bench's question format), --prompts of each
    language; a file without the language is one error line."""
    qs = tmp_path / "mine.jsonl"
    qs.write_text(
        "\n".join(
            json.dumps({"question_id": f"q{i}", "category": "qa", "language": lang, "turns": [t]})
            for i, (lang, t) in enumerate(
                [("en", "Name three rivers."), ("de", "Nenne drei Flüsse."), ("en", "Why?")]
            )
        )
    )
    options = f"--prompts 5 --n 8 --batch 1 --sweep 1 --hybrid-min= --questions {qs}"
    assert vllm_cli(tiny_llama_dir, tmp_path / "out", options, drafters) == 0
    rep = json.loads((tmp_path / "out" / "vllm.json").read_text())
    plain = next(m for m in rep["modes"] if m["mode"] == "eagle3@1")
    assert plain["by_batch"]["1"]["prompts"] == 2  # the two English questions, not de's
    assert rep["settings"]["prompts"] == {"en": 2}
    (tmp_path / "de.jsonl").write_text(qs.read_text().splitlines()[1])
    with pytest.raises(SystemExit) as e:
        vllm_cli(tiny_llama_dir, tmp_path / "o2", f"--questions {tmp_path / 'de.jsonl'}", drafters)
    assert e.value.code == 2


def test_the_calibrated_hybrid_runs_at_the_m_this_runs_curves_choose(
    fake, drafters, tiny_llama_dir, tmp_path, monkeypatch
):
    """--hybrid-min auto (the default): after the sweep, prompt lookup's acceptance by match length
    on plain's answers (every answer position counted once) against the drafter's α and step cost
    → m; the hybrid runs there with the drafter at its draft_n, and engines.json records it for
    make serve-vllm."""
    from engines.vllm.calibrate import choose_ngram_min
    from polyspec_vllm.settings import read

    # answers that repeat themselves every 5 tokens: prompt lookup's best case
    def cycling(self, ids, n):
        return [(ids[-1] + i % 5) % 90 + 3 for i in range(n)]

    monkeypatch.setattr(FakeProcess, "_tokens", cycling)
    engines = _engines(tmp_path / "engines.json")
    options = "--prompts 2 --n 80 --batch 1,2 --sweep 1,2"
    assert vllm_cli(tiny_llama_dir, tmp_path / "out", options, drafters, engines) == 0
    rep = json.loads((tmp_path / "out" / "vllm.json").read_text())
    h, d = rep["hybrid"]["en"], rep["draft_length"]["en"]
    assert sum(v["positions"] for v in h["curve"].values()) == 2 * 80
    curve = {int(n): v for n, v in h["curve"].items()}
    want = choose_ngram_min(curve, d["alpha"], d["draft_n"], 3, d["step_cost"]["c"], 6)
    assert h["ngram_min"] == want["ngram_min"] <= h["ngram_max"]
    assert h["ngram_share"] > 0.5  # the cycling answers: most positions match
    assert h["drafter_tokens"] == d["draft_n"]
    (mode,) = [m for m in rep["modes"] if m["mode"].startswith("hybrid")]
    assert mode["mode"] == f"hybrid-m{h['ngram_min']}@{d['draft_n']}"
    got = read(mode["speculative_config"]["model"]).hybrid
    assert (got.ngram_min, got.ngram_max, got.drafter_tokens) == (
        h["ngram_min"],
        h["ngram_max"],
        d["draft_n"],
    )
    # its own length by batch size, from its own runs: served, never below plain where measured
    k = max(3, d["draft_n"])
    sp = {b: mode["by_batch"][str(b)]["speedup"] for b in (1, 2)}
    assert h["schedule"] == [[1, 1, k if sp[1] > 1 else 0], [2, 2, k if sp[2] > 1 else 0]]
    rec = json.loads(engines.read_text())["drafters"]["en"]["hybrid"]["vllm"]
    assert rec == {
        "ngram_min": h["ngram_min"],
        "ngram_max": h["ngram_max"],
        "drafter_tokens": d["draft_n"],
        "ngram_tokens": 3,
        "schedule": h["schedule"],
    }
    from engines.vllm.serve import speculative_config

    folder = Path(mode["speculative_config"]["model"])
    spec = speculative_config("hybrid", drafters / "en", engines, hybrid_dir=tmp_path / "serve")
    assert spec["num_speculative_tokens_per_batch_size"] == h["schedule"]
    assert spec["num_speculative_tokens"] == k and folder.is_dir()


def test_a_pass_keeps_each_languages_seconds_and_counters_and_the_md_shows_them():
    """The aims are per language: a mode over several languages (ngram, a multilingual drafter,
    its hybrid) reports each language's × plain and vLLM α beside the whole."""
    from engines.vllm.report import _by_lang_lines
    from engines.vllm.run import _batch_entry, _lang_part, _subset, run_pass

    rows = [
        {"id": f"{lang}{i}", "lang": lang, "ids": [10 + i + 5 * (lang == "de")]}
        for lang in ("en", "de")
        for i in range(2)
    ]
    params = {"max_tokens": 40}
    plain = run_pass(FakeProcess({"model": "t"}), rows, params, 1)
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    eng = FakeProcess({"model": "t", "speculative_config": spec})
    got = run_pass(eng, rows[:2], params, 1)  # en alone first: the counters start non-zero
    got = run_pass(eng, rows, params, 1)
    by = got["spec_by_lang"]
    assert set(by) == {"en", "de"} and by["en"]["drafts"] > 0 and by["de"]["drafts"] > 0
    assert by["en"]["drafts"] + by["de"]["drafts"] == got["spec"]["drafts"]
    assert [a + b for a, b in zip(by["en"]["accepted_per_pos"], by["de"]["accepted_per_pos"])] == (
        got["spec"]["accepted_per_pos"]
    )
    en = [r for r in rows if r["lang"] == "en"]
    part = _lang_part(got, en, "en")
    assert part["seconds"] == got["seconds_by_lang"]["en"] and part["tokens"] == 80
    ref = _subset(plain, en)
    assert ref["seconds"] == plain["seconds_by_lang"]["en"]
    ctx = SimpleNamespace(plain={1: plain})
    mode = SimpleNamespace(name="ngram", langs=["en", "de"])
    entry = _batch_entry(ctx, mode, 1, got, rows, plain_engine=None)
    assert entry["identical"] == 4 and set(entry["by_lang"]) == {"en", "de"}
    want = ref["seconds"] / got["seconds_by_lang"]["en"]
    assert entry["by_lang"]["en"]["speedup"] == pytest.approx(want, rel=1e-3)
    assert entry["by_lang"]["en"]["alpha"] == [
        round(a / by["en"]["drafts"], 4) for a in by["en"]["accepted_per_pos"]
    ]
    assert "tau" not in entry["by_lang"]["de"]
    report = {
        "modes": [{"mode": "ngram", "drafter": None, "langs": ["en", "de"], "by_batch": {1: entry}}]
    }
    lines = _by_lang_lines(report, [1])
    en = entry["by_lang"]["en"]
    assert (
        f"| ngram | — | en | {en['speedup']:.2f}× | "
        + ", ".join(f"{a:.2f}" for a in en["alpha"])
        + " |"
        in lines
    )


def test_a_hybrid_below_ngram_at_a_batch_size_runs_again_drafting_only_below_it(
    fake, drafters, tiny_llama_dir, tmp_path, monkeypatch
):
    """The calibrated hybrid ran below ngram at batch 2 (its drafter rows cost more than they
    bring there): it runs again with drafter_max_batch 1 (n-gram rows alone above), measured, and
    that is what engines.json serves, with its own schedule."""
    from engines.vllm.serve import speculative_config
    from polyspec_vllm.settings import read

    monkeypatch.setattr(
        FakeProcess, "_tokens", lambda self, ids, n: [(ids[-1] + i % 5) % 90 + 3 for i in range(n)]
    )

    def cost(spec, batch):  # the unlimited hybrid is twice as slow at batch 2
        model = str((spec or {}).get("model", ""))
        return 2.0 if "/hybrid/" in model and "-b1-" not in model and batch > 1 else 1.0

    FakeProcess.cost = cost
    engines = _engines(tmp_path / "engines.json")
    options = "--prompts 2 --n 80 --batch 1,2 --sweep 1,2"
    assert vllm_cli(tiny_llama_dir, tmp_path / "out", options, drafters, engines) == 0
    rep = json.loads((tmp_path / "out" / "vllm.json").read_text())
    h = rep["hybrid"]["en"]
    modes = {m["mode"]: m for m in rep["modes"]}
    m, d = h["ngram_min"], h["drafter_tokens"]
    assert f"hybrid-m{m}@{d}" in modes and h["unlimited"] == f"hybrid-m{m}@{d}"
    limited = modes[f"hybrid-m{m}-b1@{d}"]
    assert h["drafter_max_batch"] == 1
    assert read(limited["speculative_config"]["model"]).hybrid.drafter_max_batch == 1
    # the schedule is the limited mode's own: it beat plain at both sizes
    k = max(3, d)
    sp = {b: limited["by_batch"][str(b)]["speedup"] for b in (1, 2)}
    assert h["schedule"] == [[1, 1, k if sp[1] > 1 else 0], [2, 2, k if sp[2] > 1 else 0]]
    rec = json.loads(engines.read_text())["drafters"]["en"]["hybrid"]["vllm"]
    assert rec["drafter_max_batch"] == 1 and rec["schedule"] == h["schedule"]
    spec = speculative_config("hybrid", drafters / "en", engines, hybrid_dir=tmp_path / "serve")
    assert read(spec["model"]).hybrid.drafter_max_batch == 1
    assert "drafting in steps of at most 1" in (tmp_path / "out" / "vllm.md").read_text()


def test_adaspec_serves_each_language_drafter_per_request_on_mixed_language_batches(
    fake, drafters, tiny_llama_dir, tmp_path
):
    """With a multilingual drafter and language drafters, ``make check-vllm`` runs the plugin's
    per-request ``adaspec`` (the multilingual folder with ``languages``) after the sweep, and with
    ``--mixed`` every batch of several prompts mixes the languages, each request tagged with its
    own; per-language figures only where a batch held one language."""
    import shutil

    from engines.vllm.run import prompt_groups
    from polyspec_vllm.settings import read

    folders = tmp_path / "speculators"
    for name in ("en", "de", "multilingual"):
        shutil.copytree(drafters / "en", folders / name)
    info = json.loads((folders / "multilingual" / "polyspec.json").read_text())
    (folders / "multilingual" / "polyspec.json").write_text(
        json.dumps({**info, "lang": None, "languages": ["en", "de"]})
    )
    seen = []
    generate = FakeProcess.generate

    def spy(self, prompts, params):
        seen.append((self.spec, [p.get("extra_args") for p in params]))
        return generate(self, prompts, params)

    FakeProcess.generate = spy
    try:
        rc = vllm_cli(
            tiny_llama_dir,
            tmp_path / "out",
            "--prompts 2 --n 40 --batch 1,4 --sweep 2 --mixed",
            folders,
        )
    finally:
        FakeProcess.generate = generate
    assert rc == 0
    rep = json.loads((tmp_path / "out" / "vllm.json").read_text())
    modes = {(m["mode"], m["drafter"]): m for m in rep["modes"]}
    adaspec = [m for (name, _), m in modes.items() if name.startswith("adaspec@")]
    assert len(adaspec) == 1 and adaspec[0]["drafter"] == "multilingual"
    settings = read(adaspec[0]["speculative_config"]["model"])
    assert {k: v.resolve() for k, v in settings.languages.items()} == {
        "en": (folders / "en").resolve(),
        "de": (folders / "de").resolve(),
    }
    b4 = adaspec[0]["by_batch"]["4"]
    assert b4["identical"] == b4["prompts"] == 4 and "by_lang" not in b4
    assert set(adaspec[0]["by_batch"]["1"]["by_lang"]) == {"de", "en"}
    # the choice of the default: one server per language (the language drafters' runs together),
    # the multilingual drafter and adaspec, × plain on the same prompts
    from engines.vllm.report import per_language_choice

    rep["plain"] = {int(k): v for k, v in rep["plain"].items()}
    choice = per_language_choice(rep, [1, 4])
    own = [modes[("eagle3@2", x)]["by_batch"]["1"] for x in ("en", "de")]
    servers = sum(r["tokens"] for r in own) / sum(r["seconds"] for r in own)
    assert choice[1]["one server per language"] == pytest.approx(
        servers / rep["plain"][1]["tok_s"], rel=1e-3
    )
    assert choice[1]["adaspec@2"] == adaspec[0]["by_batch"]["1"]["speedup"]
    assert (
        "| batch | one server per language | ngram | the multilingual drafter |"
        in (tmp_path / "out" / "vllm.md").read_text()
    )
    # the adaspec engine's batches of 4 mix en and de, every request tagged with its language
    mixed = [tags for spec, tags in seen if spec and "adaspec" in str(spec) and len(tags) == 4]
    assert mixed and all({t["lang"] for t in tags} == {"en", "de"} for tags in mixed)
    rows = [{"id": f"{x}{i}", "lang": x} for x in ("vi", "de", "ja") for i in range(3)]
    assert [[r["id"] for r in g] for g in prompt_groups(rows, 4, True)] == [
        ["vi0", "de0", "ja0", "vi1"],
        ["de1", "ja1", "vi2", "de2"],
        ["ja2"],
    ]
    assert [len(g) for g in prompt_groups(rows, 4, False)] == [3, 3, 3]


def test_serve_adaspec_holds_the_multilingual_drafter_and_each_language_drafter_beside_it(
    drafters, tmp_path
):
    """make serve-vllm VLLM_MODE=adaspec: the engines export's multilingual folder, with every
    language drafter beside it in the plugin's settings (each request drafted by its language's);
    adaspec-hybrid adds the n-gram rows; an export without language drafters is one line."""
    import shutil

    from engines.vllm.serve import drafter_of, speculative_config
    from polyspec_vllm.settings import read

    folders = tmp_path / "run" / "export" / "engines" / "speculators"
    for name in ("en", "de", "multilingual"):
        shutil.copytree(drafters / "en", folders / name)
        info = json.loads((folders / name / "polyspec.json").read_text())
        lang = None if name == "multilingual" else name
        (folders / name / "polyspec.json").write_text(json.dumps({**info, "lang": lang}))
    a = SimpleNamespace(run=str(tmp_path / "run"), lang="vi", drafter=None)
    multi, _ = drafter_of(a, "adaspec")
    assert multi == folders / "multilingual"
    spec = speculative_config("adaspec", multi, None, hybrid_dir=tmp_path / "serve")
    got = read(spec["model"])
    assert got.hybrid is None
    assert {k: v.resolve() for k, v in got.languages.items()} == {
        "de": (folders / "de").resolve(),
        "en": (folders / "en").resolve(),
    }
    spec = speculative_config("adaspec-hybrid", multi, None, hybrid_dir=tmp_path / "serve-h")
    assert read(spec["model"]).hybrid is not None and set(read(spec["model"]).languages) == {
        "de",
        "en",
    }
    alone = tmp_path / "alone" / "multilingual"
    shutil.copytree(folders / "multilingual", alone)
    with pytest.raises(PolyspecError, match="has no language drafter folders beside"):
        speculative_config("adaspec", alone, None, hybrid_dir=tmp_path / "s2")
