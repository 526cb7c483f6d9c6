"""decoder.bench (evaluation harness) and decoder.calibrate (UNISPEC draft-size calibration) on tiny
targets."""

from __future__ import annotations

import json
import random

import pytest
import torch

from conftest import DEFAULT_BENCH_METHODS, make_tiny_bundle, run_cli
from polyspec.errors import PolyspecError
from polyspec.targets import load_target


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    return load_target(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def small_lm_bundle(tmp_path_factory, llama):
    """Small-LM drafters, so that transformers' assisted generation (hf-assisted) runs as well."""
    from export.bundle import load_bundle

    return load_bundle(
        make_tiny_bundle(tmp_path_factory.mktemp("bench") / "bundle", llama, drafter="small-lm")
    )


def test_builtin_benchmark_covers_seven_languages_seven_tasks_and_mixed():
    from decoder.bench.run import load_questions

    qs = load_questions(None)
    cells = {}
    for q in qs:
        cells[(q["language"], q["category"])] = cells.get((q["language"], q["category"]), 0) + 1
    tasks = {"qa", "rag", "translation", "summarization", "code", "math", "multiturn"}
    for lang in ("en", "de", "fr", "es", "zh", "ja", "vi"):
        for task in tasks:
            assert cells.get((lang, task), 0) >= 3, (lang, task)
    mixed = [q for q in qs if q["category"] == "mixed"]
    assert len(mixed) >= 6 and all(q["prompt_language"] != q["language"] for q in mixed)
    assert all(len(q["turns"]) == 2 for q in qs if q["category"] == "multiturn")
    assert len({q["question_id"] for q in qs}) == len(qs)
    few = load_questions(None, ["vi", "de"], per_cell=1)
    assert len([q for q in few if q["category"] != "mixed"]) == 2 * 7  # one per (language, task)
    assert {q["language"] for q in few if q["category"] == "mixed"} >= {"vi", "de"}


def test_malformed_question_file_is_a_one_line_error(tmp_path):
    from decoder.bench.run import load_questions

    bad = tmp_path / "q.jsonl"
    bad.write_text(
        '{"question_id": 1, "turns": ["ok"]}\n{"question_id": 2, "turns": "not a list"}\n'
    )
    with pytest.raises(PolyspecError, match=r"q.jsonl:2: not a Spec-Bench question"):
        load_questions(bad)


def test_every_method_runs_in_one_harness_and_lossless_ones_are_identical(
    tmp_path, llama, small_lm_bundle
):
    from decoder.bench.run import load_questions, run_bench

    qs = load_questions(None, ["vi", "de"], per_cell=1, categories=["qa", "multiturn", "mixed"])
    # the default ones, adaspec-fixsize after adaspec
    methods = [*DEFAULT_BENCH_METHODS[:3], "adaspec-fixsize", *DEFAULT_BENCH_METHODS[3:]]
    notes = []
    report = run_bench(
        llama, small_lm_bundle, qs, methods, 16, 2, tmp_path / "eval", log=notes.append
    )
    assert set(report["methods"]) == set(methods)
    out = tmp_path / "eval"
    for m, d in report["methods"].items():
        assert d["overall"]["identical"], m  # every method is lossless: same greedy tokens as ar
        assert set(d["by_language"]) >= {"vi", "de", "mixed"}
        # τ and tok/s as reported = recomputed from the per-question answer records (first repeat)
        rows = [json.loads(x) for x in (out / "answers" / f"{m}.jsonl").read_text().splitlines()]
        toks, fwd = sum(r["new_tokens"] for r in rows), sum(r["target_forwards"] for r in rows)
        # the answers are the first repeat's
        assert d["overall"]["tau_repeats"][0] == pytest.approx(toks / fwd), m
        # greedy: both repeats make the same steps (the hybrid's arms follow measured times)
        if m != "hybrid":
            assert d["overall"]["tau"] == pytest.approx(toks / fwd), m
        if m not in ("hf-generate", "hf-pld", "hf-assisted"):  # our loop counts its forwards itself
            assert (
                sum(len(r["accept_lengths"]) for r in rows) + sum(len(q["turns"]) for q in qs)
                == fwd
            ), m
            # where the steps and tokens went: every step counted once, under who proposed it
            for r in rows:
                assert sum(x["steps"] for x in r["by_source"].values()) == len(
                    r["accept_lengths"]
                ), m
                assert sum(x["tokens"] for x in r["by_source"].values()) == sum(
                    r["accept_lengths"]
                ), m
            # the report's per-language totals are the answers' (first repeat)
            per = d["steps_by_source"]
            assert sum(x["steps"] for lang in per.values() for x in lang.values()) == sum(
                len(r["accept_lengths"]) for r in rows
            ), m
        if m != "ar":
            ag = report["agreement"][m]
            assert all(g["identical"] == g["answers"] for g in ag.values()), m
    assert report["methods"]["ar"]["overall"]["tau"] == 1.0
    # the training-free sources really drafted and were kept at least once (steps emitting > 1
    # token)
    for m in ("pld", "spectra", "hybrid"):
        assert max(int(k) for k in report["methods"][m]["accept_hist"]) > 1, m
    # no English vocabulary in the bundle: said, not hidden
    assert any("fr-spec" in n for n in notes)
    for f in (
        "report.md",
        "report.json",
        "speedup.png",
        "tau.png",
        "accept_hist.png",
        "adaptive_trace.png",
    ):
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    lines = [json.loads(x) for x in (out / "answers" / "adaspec.jsonl").read_text().splitlines()]
    assert len(lines) == len(qs) and all(x["identical"] for x in lines)
    assert any(len(x["turns"]) == 2 for x in lines)  # multi-turn: both turns answered
    md = (out / "report.md").read_text()
    assert "| adaspec |" in md and "vi Spd." in md
    steps_section = md.split("## Where the steps went")[1].split("\n## ")[0]
    assert "| hybrid | vi |" in steps_section  # its arms: more than one source of steps
    assert report["trace"]["steps"] and {"lang", "vocab_size"} <= set(report["trace"]["steps"][0])


def test_methods_are_interleaved_per_question_and_a_failing_one_is_dropped(
    tmp_path, monkeypatch, llama, small_lm_bundle
):
    import decoder.bench.run as bench

    calls, real = [], bench.build_methods

    def recording(names, *a, **kw):
        def wrap(name, run):
            def rec(ids, n):
                calls.append((name, n))
                if name == "pld" and sum(1 for c in calls if c == ("pld", 20)) == 2:
                    raise RuntimeError("broken on its second question\nsecond line")
                return run(ids, n)

            return rec

        return {m: wrap(m, r) for m, r in real(names, *a, **kw).items()}

    monkeypatch.setattr(bench, "build_methods", recording)
    qs = bench.load_questions(None, ["vi"], per_cell=3, categories=["qa"])
    notes = []
    report = bench.run_bench(
        llama, small_lm_bundle, qs, ["spectra", "ar", "pld"], 20, 1, tmp_path, log=notes.append
    )
    assert calls[:3] == [("ar", 16), ("spectra", 16), ("pld", 16)]  # warm-ups, AR first
    # each question answered by every live method before the next, AR first then last
    assert [m for m, _ in calls[3:]] == [
        "ar",
        "spectra",
        "pld",
        "pld",
        "spectra",
        "ar",
        "ar",
        "spectra",
    ]
    assert report["failed"] == [
        {
            "method": "pld",
            "question_id": qs[1]["question_id"],
            "phase": "answer",
            "error": "RuntimeError: broken on its second question",
            "answered": 1,
        }
    ]
    assert set(report["methods"]) == {"ar", "spectra"} and any("pld failed" in n for n in notes)
    # its answer before the failure is kept, and report.md names the method, the question and the
    # error
    assert len((tmp_path / "answers" / "pld.jsonl").read_text().splitlines()) == 1
    md = (tmp_path / "report.md").read_text()
    assert (
        "## Failed methods" in md
        and f"`pld` failed on question {qs[1]['question_id']}: RuntimeError" in md
    )
    assert report["methods"]["spectra"]["overall"]["identical"]
    assert report["methods"]["spectra"]["overall"]["questions"] == 3


def test_cli_reads_any_spec_bench_file(tmp_path, tiny_llama_dir, small_lm_bundle):
    q = tmp_path / "question.jsonl"
    q.write_text(
        "\n".join(
            json.dumps({"question_id": i, "category": "writing", "turns": [t]})
            for i, t in enumerate(["Write a poem.", "Explain gravity."])
        )
        + "\n"
    )
    r = run_cli(
        "-m",
        "decoder.bench",
        "--target",
        str(tiny_llama_dir),
        "--bundle",
        str(small_lm_bundle.root),
        "--questions",
        str(q),
        "--methods",
        "ar,adaspec,pld",
        "--max-new-tokens",
        "8",
        "--langs",
        "en",
        "--out",
        str(tmp_path / "eval"),
        "--device",
        "cpu",
    )
    assert r.returncode == 0, r.stderr
    assert "report:" in r.stdout and (tmp_path / "eval" / "report.md").is_file()


def test_gamma_sets_the_drafter_methods_depth_and_leaves_prompt_lookups(
    tmp_path, llama, small_lm_bundle
):
    """``--gamma`` (``make eval GAMMA=``): the drafter methods draft that many tokens a step instead
    of the bundle's calibrated γ; pld keeps transformers' 10; the report says which γ it ran."""
    from decoder.bench.run import build_methods, load_questions, render_markdown, run_bench
    from polyspec.prompts import encode, render

    fmt = llama.spec.prompt_format
    ids = encode(
        fmt,
        llama.tokenizer,
        render(fmt, llama.tokenizer, [{"role": "user", "content": "Xin chào, bạn"}]),
    )
    depth = {}
    for g in (None, 2, 5):
        runs = build_methods(
            ["ar", "eagle-full", "pld"], llama, small_lm_bundle, None, lambda m: None, gamma=g
        )
        depth[g] = {
            m: max(s.drafted for s in runs[m](ids, 24).steps) for m in ("eagle-full", "pld")
        }
    assert depth[2]["eagle-full"] == 2 and depth[5]["eagle-full"] == 5
    assert depth[None]["eagle-full"] == 4  # the default γ (the tiny bundle has no calibration)
    assert depth[2]["pld"] == depth[5]["pld"] == depth[None]["pld"]
    qs = load_questions(None, ["vi"], per_cell=1, categories=["qa"])
    report = run_bench(
        llama,
        small_lm_bundle,
        qs,
        ["ar", "eagle-full"],
        8,
        1,
        tmp_path,
        log=lambda m: None,
        gamma=3,
    )
    assert report["gamma"] == 3 and "Drafter γ: 3 (`--gamma`)" in render_markdown(report)


# ------------------------------------------------------------------------------------ calibration


def synthetic(
    verify_a: float, verify_b: float, alpha: float, draft: float, sizes, noise: float, seed: int
):
    """Measurements from a known cost model: s(g) = a + b·g, τ(g) geometric in α, with
    multiplicative noise."""
    rng = random.Random(seed)
    verify = {g: (verify_a + verify_b * g) * (1 + rng.uniform(-noise, noise)) for g in sizes}
    tau = {
        g: (1 - alpha ** (g + 1)) / (1 - alpha) * (1 + rng.uniform(-noise, noise)) for g in sizes
    }
    tok_s = {g: tau[g] / (verify[g] + draft * g) for g in sizes}
    return verify, tau, tok_s


@pytest.mark.parametrize("seed", range(5))
def test_calibration_follows_the_verify_cost_curve_and_stays_near_the_best_measured(seed):
    from decoder.calibrate.run import choose

    sizes = [1, 2, 3, 4, 6, 8]
    picks = {}
    # GPU-like (verification almost free) vs CPU-like
    for name, b in (("flat", 0.002), ("steep", 0.05)):
        verify, tau, tok_s = synthetic(0.06, b, 0.8, 0.003, sizes, 0.03, seed)
        pick = choose(sizes, verify, tau, 0.003, tok_s)
        picks[name] = pick["g_star"]

        # the noiseless cost model: any pick, measured or not, is judged by it
        def true_tok_s(g, b=b):
            return ((1 - 0.8 ** (g + 1)) / (1 - 0.8)) / (0.06 + b * g + 0.003 * g)

        best = max(true_tok_s(g) for g in range(1, max(sizes) + 1))
        assert true_tok_s(pick["g_star"]) >= 0.95 * best, (name, pick)
    assert picks["flat"] > picks["steep"]


def test_calibration_follows_a_flat_then_rising_cost_curve():
    """bf16 on this CPU: verifying up to 8 tokens costs one forward, then the cost rises. A straight
    line through the sizes would predict the middle wrong; the measured curve makes g* land at the
    knee."""
    from decoder.calibrate.costs import tree_budget
    from decoder.calibrate.run import choose

    sizes = [1, 2, 3, 4, 6, 8, 12, 16]

    # k verified tokens: flat to 8, then +50 % of a forward per token (as steep as measured here)
    def cost(k):
        return 0.033 if k <= 8 else 0.033 * (1 + 0.5 * (k - 8))

    # calibration measures the whole curve, τ at the sizes
    verify = {g: cost(g + 1) for g in range(1, 17)}
    tau = {g: (1 - 0.85 ** (g + 1)) / (1 - 0.85) for g in sizes}
    pick = choose(sizes, verify, tau, 0.0005)
    # 8 verified tokens, the last flat point (a straight-line fit says 3)
    assert pick["g_star"] == 7, pick
    ratio = {k: cost(k) / 0.033 for k in range(1, 17)}
    assert tree_budget(ratio, 0.15) == 8 and tree_budget(ratio, 0.6) == 9


def test_the_cost_curve_takes_its_repetitions_in_turns_so_a_burst_of_interference_hits_every_k(
    monkeypatch,
):
    """verify(k) costs 40 ms + 1 ms a token on a fake clock; calls 8–13 after the warm-ups run 50 ms
    slower (another process on the cores). Taken k by k, five of k = 2's seven repetitions fall in
    the burst and its median with them; taken in turns, two of every k's do, and every median stays
    the device's cost."""
    import types

    import decoder.calibrate.costs as costs
    import decoder.loop.runner

    clock, calls = [0.0], [0]

    class Runner:
        head = types.SimpleNamespace(weight=torch.zeros(1))

        def __init__(self, target):
            pass

        def reset(self):
            pass

        def forward(self, ids, **kw):
            # a timed verification (the context's prefill passes logits_for)
            if kw.get("logits_for") is None:
                calls[0] += 1
                clock[0] += 0.040 + 0.001 * len(ids) + (0.050 if 8 <= calls[0] - 3 < 14 else 0.0)

        def rollback(self, n):
            pass

    monkeypatch.setattr(decoder.loop.runner, "TargetRunner", Runner)
    monkeypatch.setattr(costs.time, "perf_counter", lambda: clock[0])
    c = costs.verify_curve(None, list(range(200)), [2, 4], reps=7)
    assert c["verify_s"] == pytest.approx({1: 0.041, 2: 0.042, 4: 0.044})
    assert c["ratio"][4] == pytest.approx(0.044 / 0.041)


def test_the_cost_curve_keeps_each_ks_smallest_median_over_passes(monkeypatch):
    import decoder.calibrate.costs as costs

    # one noisy row in each pass
    passes = iter([{1: 0.040, 2: 0.053, 4: 0.041}, {1: 0.041, 2: 0.040, 4: 0.060}])
    monkeypatch.setattr(
        costs, "verify_curve", lambda target, ctx, ks, reps: {"verify_s": next(passes)}
    )
    c = costs.stable_curve(None, [0] * 200, [1, 2, 4], reps=12, passes=2)
    assert (
        c["verify_s"] == {1: 0.040, 2: 0.040, 4: 0.041} and c["context"] == 200 and c["passes"] == 2
    )
    # either pass alone: 1 (1.32 at k = 2) or 2 (1.46 at k = 4)
    assert costs.tree_budget(c["ratio"], 0.15) == 4
    # the passes' ratios verify(k)/forward(1) disagree: k = 2 1.325 against 0.976, k = 4 1.025
    # against 1.463; the noise is the larger of the two ks' 0.36, 0.43
    assert c["noise"] == pytest.approx((0.060 / 0.041) / (0.041 / 0.040) - 1)
    # three passes, one 1.8× slower at every k (the host's speed drifting), one off at k = 2 only:
    # their ratios agree at k = 4, and at k = 2 the second-lowest ratio equals the lowest, so no
    # noise (the slowest pass's spread in seconds, the rule before, reads 0.80)
    passes = iter(
        [
            {1: 0.040, 2: 0.042, 4: 0.044},
            {1: 0.072, 2: 0.0756, 4: 0.0792},
            {1: 0.040, 2: 0.046, 4: 0.044},
        ]
    )
    c = costs.stable_curve(None, [0] * 200, [1, 2, 4], reps=12, passes=3)
    assert c["verify_s"] == {1: 0.040, 2: 0.042, 4: 0.044}
    assert c["noise"] == pytest.approx(0.0, abs=1e-9)
    # one row's bump on a flat curve
    bumpy = {1: 1.0, 2: 1.08, 3: 1.30, 4: 1.12, 5: 1.14, 6: 1.15, 7: 1.30}
    assert costs.tree_budget(bumpy, 0.15) == 2  # cut at the bump (1.30 > 1.15 · verify(2) = 1.24)
    fit = costs.monotone(bumpy)
    # pooled away
    assert all(fit[k] <= fit[k + 1] for k in range(1, 7)) and costs.tree_budget(fit, 0.15) == 6


def test_the_tree_budget_reads_past_a_gpus_fixed_multi_token_step():
    """On an H100 (8B-shaped, bf16; scripts/gpu/gpu-check.sh) a forward of 2+ tokens costs a fixed
    15 % over a 1-token decode, then stays flat: the budget measures from verify(2), not forward(1)
    (which would give 1)."""
    from decoder.calibrate.costs import tree_budget

    h100 = {
        1: 1.0,
        **{k: 1.15 + 0.001 * k for k in range(2, 49)},
        **{k: 1.65 for k in range(49, 65)},
    }
    assert tree_budget(h100, 0.15) == 48
    # every token costs (no flat region): the smallest step only
    avx2 = {1: 1.0, 2: 1.35, 3: 1.7, 4: 2.05}
    assert tree_budget(avx2, 0.15) == 2


def test_calibration_walk_gives_each_draft_lengths_tau_exactly(tmp_path, llama):
    """One profiled answer at γ = 4 predicts what decoding at γ = 1…4 keeps, step for step: the
    walk's (tokens, drafter steps) equal those of real decodes (fp32, a fixed language, greedy),
    with a drafter the target mostly but not always accepts (the target with noise on its weights),
    so that γ truncates real runs."""
    from decoder.calibrate.run import profile, walk
    from decoder.core import Decoder
    from export.bundle import load_bundle

    bundle = load_bundle(
        make_tiny_bundle(tmp_path / "bundle", llama, drafter="oracle", noise=0.1, sizes=(256, 768))
    )
    ids = llama.tokenizer("Xin chào các bạn")["input_ids"]
    opts = dict(method="chain", lang="vi", size="full")
    prof = profile(Decoder(llama, bundle, gamma=4, **opts), ids, 24, 4)
    assert len(prof["acc"]) == prof["length"] - prof["prompt_len"] - 1 and not any(prof["loop"])
    assert prof["drafted"] > 0 and prof["draft_s"] > 0
    # some chains kept whole, some cut short
    assert 0 < sum(a == 4 for a in prof["acc"]) < len(prof["acc"])
    kept = []
    for g in (1, 2, 3, 4):
        out = Decoder(llama, bundle, gamma=g, **opts).generate(ids, 24, stop=[])
        # lossless: the same answer at every γ
        assert list(out.tokens) == list(prof["decode"].tokens)
        real = (sum(s.new_tokens for s in out.steps), len(out.steps))
        assert walk(prof, g) == real, g
        kept.append(sum(s.accepted for s in out.steps))
    assert kept[-1] > 0  # drafts were kept: the walk had acceptance to predict


def test_calibrate_measures_saves_and_the_decoder_uses_it(tmp_path, llama, small_lm_bundle):
    import shutil

    from decoder.calibrate.run import CALIBRATION, choose, device_key, measure, save, stability
    from decoder.core import Decoder
    from export.bundle import load_bundle

    root = tmp_path / "bundle"
    shutil.copytree(small_lm_bundle.root, root)
    bundle = load_bundle(root)
    prompts = [
        llama.tokenizer(t)["input_ids"]
        for t in ("Xin chào các bạn", "Guten Morgen", "Hôm nay trời đẹp")
    ]
    m = measure(
        llama, bundle, prompts, [1, 2, 3], max_new_tokens=12, reps=1, log=lambda *_: None, max_k=6
    )
    assert set(m["verify_s"]) == {1, 2, 3} and set(m["cost_curve"]) == set(range(1, 7))
    assert m["cost_curve"][1] == 1.0 and 1 <= m["tree_budget"] <= 6 and m["curve_context"] == 200
    # what g* and the budget read: never decreasing
    mono = [m["cost_curve_monotone"][k] for k in range(1, 7)]
    assert all(a <= b + 1e-12 for a, b in zip(mono, mono[1:])) and m["curve_noise"] >= 0
    assert set(m["tau"]) == {1, 2, 3} and all(1.0 <= m["tau"][g] <= g + 1 for g in (1, 2, 3)), m[
        "tau"
    ]
    assert (
        len(m["per_prompt"]) == 3
        and m["prompts"] == 3
        and m["drafted"] > 0
        and m["draft_s_per_token"] > 0
    )
    # pooled τ = the prompts' tokens over their drafter steps; the spread is over prompts
    for g in (1, 2, 3):
        k, n = (sum(x[g][i] for x in m["per_prompt"]) for i in (0, 1))
        assert n == m["drafter_steps"][g] > 0 and m["tau"][g] == pytest.approx(k / n)
        assert m["tau_spread"][g]["min"] <= m["tau"][g] <= m["tau_spread"][g]["max"]
    # the real decode at γ 3 (adaptive switching happens per token in the walk, per step in the
    # decode)
    assert m["decode_tau"] == pytest.approx(m["tau"][3], rel=0.25)
    grid = [1, 2, 3]
    pick = choose(grid, m["verify_s_all"], m["tau"], m["draft_s_per_token"])
    predicted = pick["predicted_tok_s"]
    assert (
        pick["g_star"] == max(predicted, key=predicted.get)
        and pick["chosen_by"] == "measured τ(g) for every g"
    )
    # τ measured at every g: the prediction divides it by the measured cost, no fitted curve
    for g in grid:
        cost = m["verify_s_all"][g] + m["draft_s_per_token"] * g
        assert predicted[g] == pytest.approx(m["tau"][g] / cost)
    per = [{g: tuple(x[g]) for g in grid} for x in m["per_prompt"]]
    own = choose(
        grid,
        m["verify_s_all"],
        {g: per[0][g][0] / per[0][g][1] for g in grid},
        m["draft_s_per_token"],
    )
    st = stability([per[0]] * 4, m["verify_s_all"], m["draft_s_per_token"], own["g_star"])
    # one prompt resampled: always the same pick, nothing lost
    assert st["same"] == 1.0 and st["loss_p95"] == 0.0
    worst = min(grid, key=lambda g: own["predicted_tok_s"][g])
    if worst != own["g_star"]:  # another pick loses exactly its predicted shortfall
        st = stability([per[0]] * 4, m["verify_s_all"], m["draft_s_per_token"], worst)
        assert st["same"] == 0.0 and st["loss_median"] == pytest.approx(
            1 - own["predicted_tok_s"][worst] / own["predicted_tok_s"][own["g_star"]]
        )
    st = stability(per, m["verify_s_all"], m["draft_s_per_token"], pick["g_star"])
    assert 0.0 <= st["same"] <= 1.0 and 0.0 <= st["loss_median"] <= st["loss_p95"] < 1.0
    key = device_key(llama.device, llama.dtype)
    save(root, key, {**m, **pick})
    assert json.loads((root / CALIBRATION).read_text())[key]["g_star"] == pick["g_star"]
    dec = Decoder(llama, load_bundle(root), method="chain")  # calibration.json is not checksummed
    assert dec.gamma == pick["g_star"]
    # an explicit γ wins
    assert Decoder(llama, load_bundle(root), method="chain", gamma=5).gamma == 5
    # the tree budget too: it counts the verified tokens, the pending one among them
    assert Decoder(llama, load_bundle(root), method="hybrid").nodes == max(1, m["tree_budget"] - 1)


def test_a_flat_optimum_gives_the_smallest_draft_length_within_the_tolerance():
    from decoder.calibrate.run import choose

    verify = {g: 0.040 for g in range(1, 9)}  # flat verification: τ(g) / (s + d·g) decides
    tau = {1: 1.50, 2: 1.72, 3: 1.86, 4: 2.00, 5: 2.11, 6: 2.16}
    exact = choose(list(tau), verify, tau, 0.0025)
    pred = exact["predicted_tok_s"]
    assert exact["g_star"] == max(pred, key=pred.get)
    flat = choose(list(tau), verify, tau, 0.0025, tolerance=0.02)
    assert (
        flat["g_star"]
        == min(g for g in tau if pred[g] >= 0.98 * max(pred.values()))
        < exact["g_star"]
    )
    # everything "equal": the cheapest
    assert choose(list(tau), verify, tau, 0.0025, tolerance=0.5)["g_star"] == 1


def test_measured_throughput_still_overrules_a_pick_it_contradicts():
    from decoder.calibrate.run import choose

    verify = {g: 0.03 + 0.001 * g for g in range(1, 7)}
    tau = {1: 1.8, 2: 2.4, 4: 3.0}  # sizes only: the fit fills the rest
    pick = choose([1, 2, 4], verify, tau, 0.002)
    assert pick["chosen_by"] == "fit" and 1 <= pick["g_star"] <= 4
    other = 1 if pick["g_fit"] != 1 else 4
    rigged = {g: (2.0 if g == other else 1.0) for g in range(1, 5)}
    assert choose([1, 2, 4], verify, tau, 0.002, rigged)["g_star"] == other


def test_transformers_peers_stop_at_the_prompt_formats_stop_strings(tmp_path, tiny_gemma_dir):
    """A base-model target (completion format with stop strings): transformers' generate, prompt
    lookup and assisted generation run under the same stopping rule as ours, with identical
    tokens."""
    from decoder.bench.run import load_questions, run_bench
    from export.bundle import load_bundle

    gemma = load_target(str(tiny_gemma_dir))
    # the case that broke transformers' own stop_strings in assisted decoding
    assert gemma.spec.prompt_format.stop
    bundle = load_bundle(make_tiny_bundle(tmp_path / "b", gemma, drafter="small-lm"))
    qs = load_questions(None, ["de"], per_cell=1, categories=["qa", "math"])
    notes = []
    report = run_bench(
        gemma,
        bundle,
        qs,
        ["ar", "hf-generate", "hf-pld", "hf-assisted", "adaspec"],
        24,
        1,
        tmp_path / "eval",
        log=notes.append,
    )
    assert not report["failed"], report["failed"]
    assert all(d["overall"]["identical"] for d in report["methods"].values())


def test_heldout_prompts_load_as_questions():
    from decoder.bench.run import load_questions
    from polyspec.paths import REPO_ROOT

    qs = load_questions(REPO_ROOT / "synth" / "data" / "heldout.jsonl", ["en"])
    assert len(qs) == 24 and all(
        q["language"] == "en" and q["question_id"].startswith("en-heldout") for q in qs
    )


def test_the_heldout_and_its_mixed_questions_load_as_one_benchmark(tmp_path):
    """``--questions a,b``: the held-out prompts of every language plus the held-out mixed-language
    questions (a prompt in one language, the answer asked for in another), one mixed question per
    answer language at per-cell 1; an id repeated across the files is a one-line error."""
    import pytest

    from decoder.bench.questions import read_question_files, select_questions
    from polyspec.errors import PolyspecError
    from polyspec.paths import REPO_ROOT

    files = (
        f"{REPO_ROOT / 'synth/data/heldout.jsonl'},{REPO_ROOT / 'decoder/data/heldout_mixed.jsonl'}"
    )
    qs = select_questions(
        read_question_files(files), ["en", "de", "fr", "es", "zh", "ja", "vi"], per_cell=1
    )
    mixed = [q for q in qs if q["category"] == "mixed"]
    assert len(qs) == 7 * 6 + 7 and sorted(q["language"] for q in mixed) == sorted(
        ["de", "en", "es", "fr", "ja", "vi", "zh"]
    )
    assert all(q["prompt_language"] != q["language"] for q in mixed)
    dup = tmp_path / "dup.jsonl"
    dup.write_text(
        '{"question_id": "mixed-heldout-01", "category": "qa", '
        '"language": "en", "turns": ["Hi?"]}\n'
    )
    with pytest.raises(PolyspecError, match="mixed-heldout-01"):
        read_question_files(f"{REPO_ROOT / 'decoder/data/heldout_mixed.jsonl'},{dup}")


def test_eagle3_method_runs_the_engine_bundle_losslessly(tmp_path, llama):
    """``eagle3``: the engines' EAGLE-3 drafter alone (chain γ 4, no prompt lookup) from
    --engine-bundle, beside a main bundle of another form; identical to ar, and it really drafted
    with the engine bundle's drafters."""
    from decoder.bench.run import load_questions, run_bench
    from export.bundle import load_bundle

    main = load_bundle(make_tiny_bundle(tmp_path / "b1", llama, langs=("vi",), drafter="eagle"))
    engines = load_bundle(make_tiny_bundle(tmp_path / "b3", llama, langs=("vi",), drafter="eagle3"))
    qs = load_questions(None, ["vi"], per_cell=1, categories=["qa"])
    rep = run_bench(
        llama,
        main,
        qs,
        ["ar", "eagle3"],
        12,
        1,
        tmp_path / "out",
        log=lambda *_: None,
        engine_bundle=engines,
    )
    assert not rep["failed"] and "eagle3" in rep["methods"]
    answers = [
        json.loads(x)
        for x in (tmp_path / "out" / "answers" / "eagle3.jsonl").read_text().splitlines()
    ]
    assert all(a["identical"] for a in answers)
    assert sum(len(a["accept_lengths"]) for a in answers) > 0  # it ran speculative steps
    # without EAGLE-3 drafters anywhere the method is skipped with the reason, not failed
    notes = []
    rep = run_bench(llama, main, qs, ["ar", "eagle3"], 8, 1, tmp_path / "out2", log=notes.append)
    assert "eagle3" not in rep["methods"] and any("eagle3 skipped" in n for n in notes)


# ------------------------------------------------------------------------------ failures and inputs


def bench_args(tmp_path, tiny_llama_dir, methods: str, *extra: str) -> list[str]:
    return [
        "--target",
        str(tiny_llama_dir),
        "--device",
        "cpu",
        "--methods",
        methods,
        "--langs",
        "en",
        "--per-cell",
        "1",
        "--categories",
        "qa",
        "--max-new-tokens",
        "8",
        "--out",
        str(tmp_path / "eval"),
        *extra,
    ]


@pytest.mark.parametrize("keep_going", [False, True])
def test_a_failing_method_is_reported_and_fails_the_run_unless_keep_going(
    tmp_path, monkeypatch, tiny_llama_dir, keep_going
):
    from decoder.bench.__main__ import main
    from decoder.drafts.ngram import PromptLookup

    def broken(self, ctx):
        raise RuntimeError("prompt lookup broke\nsecond line")

    monkeypatch.setattr(PromptLookup, "propose", broken)
    rc = main(
        bench_args(
            tmp_path, tiny_llama_dir, "ar,pld,ngram-tree", *(["--keep-going"] if keep_going else [])
        )
    )
    assert rc == (0 if keep_going else 1)
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert set(report["methods"]) == {"ar", "ngram-tree"}  # the others' results are kept
    [f] = report["failed"]
    assert (
        f["method"] == "pld"
        and f["phase"] == "warm-up"
        and f["error"] == "RuntimeError: prompt lookup broke"
    )
    md = (tmp_path / "eval" / "report.md").read_text()
    assert (
        "## Failed methods" in md
        and f"`pld` failed on question {f['question_id']} (warm-up): RuntimeError" in md
    )


def test_a_method_that_cannot_be_built_is_recorded_and_skipped_ones_are_listed(
    tmp_path, monkeypatch, llama, small_lm_bundle
):
    import decoder.bench.run as bench
    from decoder.drafts.ngram import TokenRecycling

    def broken(self, *a, **kw):
        raise ValueError("no adjacency matrix")

    monkeypatch.setattr(TokenRecycling, "__init__", broken)
    qs = bench.load_questions(None, ["vi"], per_cell=1, categories=["qa"])
    notes = []
    report = bench.run_bench(
        llama,
        None,
        qs,
        ["ar", "ngram-tree", "adaspec", "hf-assisted"],
        8,
        1,
        tmp_path,
        log=notes.append,
    )
    assert set(report["methods"]) == {"ar"}
    assert report["failed"] == [
        {
            "method": "ngram-tree",
            "question_id": None,
            "phase": "build",
            "error": "ValueError: no adjacency matrix",
            "answered": 0,
        }
    ]
    assert report["skipped"] == {
        "adaspec": "it needs --bundle",
        "hf-assisted": report["skipped"]["hf-assisted"],
    }
    assert "small-LM drafter" in report["skipped"]["hf-assisted"]
    md = (tmp_path / "report.md").read_text()
    assert "`ngram-tree` failed while being built: ValueError: no adjacency matrix" in md
    assert "## Skipped methods" in md and "- `adaspec`: it needs --bundle" in md


def test_a_bad_questions_file_fails_before_any_model_loads(tmp_path, monkeypatch, tiny_llama_dir):
    """Every problem of the file in one error, before the target loads (the loader must never be
    called)."""
    import time

    import polyspec.targets
    from decoder.bench.__main__ import main

    def no_model(*a, **kw):
        raise AssertionError("a model was loaded before the questions were checked")

    monkeypatch.setattr(polyspec.targets, "load_target", no_model)
    # the PolyspecError itself, not cli_entry's exit 2
    monkeypatch.setenv("POLYSPEC_TRACEBACK", "1")
    q = tmp_path / "q.jsonl"
    q.write_text(
        "\n".join(
            [
                json.dumps({"question_id": 1, "turns": ["ok"]}),
                json.dumps({"category": "qa", "turns": ["no id"]}),  # line 2
                json.dumps({"question_id": 1, "turns": ["again"]}),  # line 3: repeats line 1
                json.dumps({"question_id": 4, "language": "xx", "turns": ["?"]}),  # line 4
                json.dumps({"question_id": 5, "turns": ["", "second"]}),  # line 5: an empty turn
                json.dumps({"turns": []}),  # line 6: no id, no turns
            ]
        )
        + "\n"
    )
    t0 = time.perf_counter()
    with pytest.raises(PolyspecError) as e:
        main(["--questions", str(q), "--target", str(tiny_llama_dir), "--methods", "ar"])
    assert time.perf_counter() - t0 < 5
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(
        f"{q}:2,6: not a Spec-Bench question (no question_id)"
    )
    for part in (
        "line 3: question_id 1 repeats line 1",
        "line 4: unknown language 'xx'",
        "lines 5, 6: turns must be a non-empty list of non-empty strings",
    ):
        assert part in msg, msg
    # method names: checked first too
    with pytest.raises(PolyspecError, match="unknown method\\(s\\) 'adaspek'"):
        main(["--target", str(tiny_llama_dir), "--methods", "ar,adaspek"])


def test_a_torn_line_in_a_questions_file_is_skipped_and_counted(tmp_path):
    from decoder.bench.run import load_questions

    q = tmp_path / "q.jsonl"
    good = [
        json.dumps({"question_id": i, "language": "de", "turns": [f"Frage {i}"]}) for i in range(3)
    ]
    q.write_text(
        good[0] + "\n\n" + good[1] + "\n" + good[2] + '\n{"question_id": 3, "turns": ["abgeschn'
    )
    notes = []
    qs = load_questions(q, log=notes.append)
    assert [x["question_id"] for x in qs] == [0, 1, 2] and all(x["language"] == "de" for x in qs)
    assert len(notes) == 1 and "skipped 1 torn or malformed line(s) (line 5)" in notes[0]
    # line numbers in errors still count blank and torn lines
    q.write_text(good[0] + "\n\n{torn\n" + json.dumps({"question_id": 0, "turns": ["x"]}) + "\n")
    with pytest.raises(
        PolyspecError,
        match=r"q.jsonl:4: not a Spec-Bench question \(question_id 0 repeats line 1\)",
    ):
        load_questions(q, log=notes.append)


def test_the_verify_curve_feeds_k_tokens_for_every_k_and_leaves_the_cache_as_it_found_it(
    llama, monkeypatch
):
    from decoder.calibrate import costs
    from decoder.loop.runner import TargetRunner

    fed, runners = [], []
    forward, init = TargetRunner.forward, TargetRunner.__init__

    def spy_init(self, *a, **kw):
        init(self, *a, **kw)
        runners.append(self)

    def spy(self, ids, *a, **kw):
        fed.append(len(ids))
        return forward(self, ids, *a, **kw)

    monkeypatch.setattr(TargetRunner, "__init__", spy_init)
    monkeypatch.setattr(TargetRunner, "forward", spy)
    context = list(range(5, 17))  # 12 tokens: far fewer than the largest k
    c = costs.verify_curve(llama, context, [1, 8, 40, 64], reps=1)
    assert set(c["ratio"]) == {1, 8, 40, 64}
    assert fed[0] == len(context) and {40, 64} <= set(fed[1:])  # each k really verifies k tokens
    assert runners[0].length == len(context)  # every rollback removed exactly what it added


def test_answer_records_say_where_steps_went_and_what_drafting_beside_the_verification_hid():
    from decoder.bench.run import by_source, parallel_stats
    from decoder.core import StepStat

    steps = [
        StepStat(3, 2, 4, "en", None, "chain", 0.002, 0.030, "drafter", "hit", 0.004, 0.003),
        StepStat(1, 0, 4, "en", None, "chain", 0.002, 0.031, "drafter", "drop", 0.004, 0.004),
        StepStat(5, 4, 10, "en", None, "chain", 0.0, 0.035, "pld"),
        StepStat(1, 0, 0, "en", None, "chain", 0.0, 0.029, ""),
    ]
    assert by_source(steps) == {
        "drafter": {"steps": 2, "tokens": 4, "seconds": 0.065},
        "pld": {"steps": 1, "tokens": 5, "seconds": 0.035},
        "none": {"steps": 1, "tokens": 1, "seconds": 0.029},
    }
    assert parallel_stats(steps) == {
        "parallel": {"hits": 1, "drops": 1, "spec_s": 0.008, "overlap_s": 0.007}
    }
    assert parallel_stats(steps[2:]) == {}
