"""pipelines.onpolicy_curve: a point's share of the distilled answers (whole prompts, nested), and
the points' table, slope per decade, seed spread and plot from made-up training logs."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
from test_learning_curve import _stage

from pipelines import onpolicy_curve as oc
from polyspec.errors import PolyspecError


def _distill(folder, answers, temps=3):
    """answers[i]: the answer tokens of attempt i (prompt i // temps)."""
    folder.mkdir(parents=True)
    (folder / "stats.json").write_text(json.dumps({"temperatures": [0.0, 0.7, 1.0][:temps]}))
    with open(folder / "data.jsonl", "w") as fh:
        for a, n in enumerate(answers):
            rec = {
                "id": f"en-distill-s0-{a // temps:06d}-t{a % temps}",
                "attempt": a,
                "tokens": {"instruction": 0, "response": n},
                "features_file": f"features/a{a - a % 8:07d}.safetensors",
            }
            fh.write(json.dumps(rec) + "\n")
    return folder / "data.jsonl"


def test_answers_prefix_keeps_whole_prompts_nests_and_refuses_too_few(tmp_path):
    src = _distill(tmp_path / "synth" / "en-distill", [10, 20, 30, 40, 50, 60, 5, 5, 5])
    dst, n, total = oc.answers_prefix(src, 15)  # reached inside prompt 0: its three answers
    assert (dst.name, n, total) == ("data-15.jsonl", 3, 60)
    dst, n, total = oc.answers_prefix(src, 61)
    assert (n, total) == (6, 210)
    small = (tmp_path / "synth" / "en-distill" / "data-15.jsonl").read_text().splitlines()
    assert dst.read_text().splitlines()[:3] == small  # nested: the larger holds the smaller
    assert json.loads(small[0])["features_file"] == "features/a0000000.safetensors"
    with pytest.raises(PolyspecError, match="fewer than"):
        oc.answers_prefix(src, 10_000)


def test_a_point_takes_round_one_whole_before_round_two_and_the_cli_prints_its_files(
    tmp_path, capsys
):
    run = tmp_path / "run"
    r1 = _distill(run / "synth" / "en-distill", [10, 20, 30, 40, 50, 60])  # 60 + 150
    r2 = _distill(run / "synth" / "en-distill-r2", [1, 2, 3, 7, 8, 9])  # 6 + 24
    _distill(run / "synth" / "en-distill-r10", [1, 1, 1])
    assert oc.distill_rounds(run, "en") == [r1.parent, r2.parent, run / "synth" / "en-distill-r10"]
    parts = oc.answers_across([r1, r2], 100)  # inside round 1: round 2 untouched
    assert [(p.name, n, t) for p, n, t in parts] == [("data-100.jsonl", 6, 210)]
    assert not (r2.parent / "data-100.jsonl").exists()
    assert oc.main(["answers", "--src", str(r1), "--src", str(r2), "--tokens", "215"]) == 0
    out = capsys.readouterr().out.split()
    assert out == [str(r1.parent / "data-215.jsonl"), str(r2.parent / "data-215.jsonl")]
    assert len((r1.parent / "data-215.jsonl").read_text().splitlines()) == 6  # round 1 whole
    assert len((r2.parent / "data-215.jsonl").read_text().splitlines()) == 3  # + a prompt of r2
    _stage(run / "oc-215" / "en" / "finetune", 1000.0, 1.8, [(8, 1.4, [0.4, 0.1, 0, 0])], 9)
    chat = run / "oc-215-chat" / "en" / "finetune"
    chat.mkdir(parents=True)
    ev = {"tau": 1.3, "alpha": [0.3, 0.0, 0.0, 0.0], "sequences": 32}
    (chat / "eval_only.json").write_text(json.dumps({"stage": "finetune", "eval": ev}))
    rows = oc.collect(run, oc.distill_rounds(run, "en"), [215], [], "en")
    assert rows[0]["answer_tokens"] == 210 + 6  # both rounds' shares
    with pytest.raises(PolyspecError, match="add a data round"):
        oc.answers_across([r1, r2], 10_000)


def test_fit_reads_unseen_and_seen_top1_by_epoch(tmp_path):
    folder = tmp_path / "oc-300" / "en" / "finetune"
    (folder / "final").mkdir(parents=True)
    (folder / "final" / "config.json").write_text(
        json.dumps({"train_config": {"finetune": {"epochs": 2.0}}})
    )
    # 40 steps, 20 an epoch: steps 15 and 20 are epoch 1's second half, 30 and 40 the last epoch
    logged = [(5, 0.1), (10, 0.2), (15, 0.3), (20, 0.4), (30, 0.6), (40, 0.7)]
    logged = [{"step": s, "top1_0": t} for s, t in logged]
    with open(folder / "metrics.jsonl", "w") as fh:
        fh.write(json.dumps({"event": "start", "step": 0}) + "\n")
        for rec in [*logged, {"step": 40, "eval": {"tau": 1.0}}]:
            fh.write(json.dumps(rec) + "\n")
    got = oc.fit(folder)
    assert got == {"epochs": 2.0, "train_top1_unseen": pytest.approx(0.35), "train_top1_seen": 0.65}
    row = {"answer_tokens": 300, "seed": 0, "fit": got, "finetune": {}, "chat": {}}
    assert oc.fit_table([row])[2] == "| 300 | 0 | 2.0 | 0.350 | 0.650 | – | – |"
    (folder / "final" / "config.json").unlink()
    assert oc.fit(folder) is None  # no epochs known: no guess


def test_slope_per_decade():
    assert oc.slope_per_decade([1e5, 1e6, 1e7], [1.4, 1.5, 1.6]) == pytest.approx(0.1)
    assert oc.slope_per_decade([1e5, 1e5], [1.0, 2.0]) == 0.0


def test_table_reads_both_held_out_sets_the_decoders_alpha_and_the_seed_spread(tmp_path):
    run = tmp_path / "run"
    _distill(run / "synth" / "en-distill", [100] * 30)
    points = [300, 1200]
    for n in points:
        oc.answers_prefix(run / "synth" / "en-distill" / "data.jsonl", n)
    for n, seed, tau in ((300, 0, 1.40), (1200, 0, 1.50), (300, 1, 1.44)):
        name = f"oc-{n}" + (f"-s{seed}" if seed else "")
        _stage(run / name / "en" / "finetune", 900.0, 2.0, [(8, tau, [tau - 1, 0.1, 0.0, 0.0])], 10)
        chat = run / f"{name}-chat" / "en" / "finetune"
        chat.mkdir(parents=True)
        ev = {"tau": tau - 0.1, "alpha": [tau - 1.1, 0.05, 0.0, 0.0], "sequences": 32}
        ev["top1_teacher_forced"] = tau - 1.12
        (chat / "eval_only.json").write_text(json.dumps({"stage": "finetune", "eval": ev}))
    # pipelines.score_check --drafter ran for the 1,200 point, on the default held-out set only
    check = {
        "decoder_tau": 1.49,
        "decoder_alpha": [0.48, 0.1, 0.0, 0.0],
        "score_tau": 1.5,
        "score_alpha": [0.5, 0.1, 0.0, 0.0],
        "answers_identical_to_captured": "24/24",
        "dtype": "bfloat16",
    }
    (run / "oc-1200" / "en" / "finetune" / "score_check-heldout.json").write_text(json.dumps(check))
    args = ["table", "--run", str(run), "--points", "300 1200", "--seeds", "1"]
    assert oc.main(args) == 0
    got = json.loads((run / "onpolicy-curve.json").read_text())
    rows = got["points"]
    assert [(r["point"], r["seed"]) for r in rows] == [(300, 0), (300, 1), (1200, 0)]
    assert [r["answer_tokens"] for r in rows] == [300, 300, 1200]
    s = got["summary"]
    assert s["finetune"]["tau_per_decade"] == pytest.approx(0.1 / math.log10(4), abs=1e-4)
    assert s["chat"]["alpha1_per_decade"] == pytest.approx(0.1 / math.log10(4), abs=1e-4)
    assert s["seed_spread"]["300"] == {"seeds": 2, "tau_range": 0.04, "alpha1_range": 0.04}
    assert rows[2]["decoded"]["finetune"]["alpha"][0] == 0.48 and rows[2]["decoded"]["chat"] is None
    assert rows[0]["decoded"] == {"finetune": None, "chat": None}
    md = (run / "onpolicy-curve.md").read_text()
    head = [c.strip() for c in md.splitlines()[0].strip("|").split("|")]
    assert [i for i, c in enumerate(head) if c in ("decoded α1", "decoded τ")] == [9, 10, 17, 18]
    row = (
        "| 1,200 | 0 | 1,800 (8) | **1.500** | 0.500 | 0.100 | 0.000 | 0.000 | – | 0.480 | 1.490 | "
        "**1.400** | 0.400 | 0.050 | 0.000 | 0.000 | 0.380 | – | – |"
    )
    assert row in md
    assert "| 300 | 0 | 1,800 (8) | **1.400** | 0.400 | 0.100 | 0.000 | 0.000 | – | – | – |" in md
    assert md.splitlines()[1] == "|" + "---|" * 19
    assert (run / "onpolicy-curve.png").stat().st_size > 1000


def test_table_says_which_point_is_not_scored(tmp_path):
    run = tmp_path / "run"
    _distill(run / "synth" / "en-distill", [100] * 6)
    _stage(run / "oc-300" / "en" / "finetune", 900.0, 2.0, [(8, 1.4, [0.4, 0.1, 0.0, 0.0])], 10)
    with pytest.raises(PolyspecError, match="not scored yet"):
        oc.collect(run, [run / "synth" / "en-distill"], [300], [], "en")


def _point(run, name, tau):
    _stage(run / name / "en" / "finetune", 900.0, 2.0, [(8, tau, [tau - 1, 0.1, 0.0, 0.0])], 10)
    chat = run / f"{name}-chat" / "en" / "finetune"
    chat.mkdir(parents=True)
    ev = {"tau": tau - 0.1, "alpha": [tau - 1.1, 0.05, 0.0, 0.0], "sequences": 32}
    (chat / "eval_only.json").write_text(json.dumps({"stage": "finetune", "eval": ev}))


def test_the_recipe_arms_are_tabled_against_their_point_and_its_seed_spread(tmp_path, capsys):
    run = tmp_path / "run"
    _distill(run / "synth" / "en-distill", [100] * 30)
    oc.answers_prefix(run / "synth" / "en-distill" / "data.jsonl", 300)
    runs = {"oc-300": 1.40, "oc-300-s1": 1.43, "oc-300-lk": 1.50, "oc-300-l2": 1.41}
    for name, tau in runs.items():
        _point(run, name, tau)
    args = ["table", "--run", str(run), "--points", "300", "--seeds", "1", "--ab-point", "300"]
    assert oc.main([*args, "--arms", "lk l2"]) == 0
    got = json.loads((run / "onpolicy-curve.json").read_text())
    lk, l2 = got["recipe_vs_point"]
    assert lk["arm"] == "lk" and lk["finetune"]["d_tau"] == pytest.approx(0.1)
    assert lk["chat"]["d_alpha1"] == pytest.approx(0.1)
    # the seeds differ by 0.03 there: lk's +0.10 is beyond it, l2's +0.01 is not
    assert (lk["beats_seed_spread"], l2["beats_seed_spread"]) == (True, False)
    md = (run / "onpolicy-curve.md").read_text()
    assert "| lk | 1.500 (+0.100) | 0.500 (+0.100) | 0.100 | – | 1.400 (+0.100) |" in md
    with pytest.raises(SystemExit):
        oc.main([*args[:-1], "999", "--arms", "lk"])
    assert "--ab-point 999 is not one of --points [300]" in capsys.readouterr().err
    # without a second seed at the point the table cannot say
    deltas = oc.recipe(got["points"][:1], got["recipe_ab"][:1], {})
    assert deltas[0]["beats_seed_spread"] is None


def test_merge_pools_two_runs_curves_into_one_slope_table_and_plot(tmp_path, capsys):
    # a curve continued in a second run (another disk or host): its top point pooled with the first
    files = []
    for name, points in (("a", {300: 1.40, 1200: 1.50}), ("b", {4800: 1.60})):
        run = tmp_path / name
        _distill(run / "synth" / "en-distill", [100] * 60)
        for n, tau in points.items():
            oc.answers_prefix(run / "synth" / "en-distill" / "data.jsonl", n)
            _point(run, f"oc-{n}", tau)
        args = ["table", "--run", str(run), "--points", " ".join(map(str, points))]
        assert oc.main([*args, "--label", f"host {name}"]) == 0
        files.append(run / "onpolicy-curve.json")
    got = json.loads(files[0].read_text())
    assert got["label"] == "host a"
    out = tmp_path / "docs" / "merged"
    curves = ["--curve", str(files[1]), "--curve", str(files[0])]
    assert oc.main(["merge", *curves, "--out", str(out)]) == 0
    merged = json.loads(out.with_suffix(".json").read_text())
    assert [(r["answer_tokens"], r["curve"]) for r in merged["points"]] == [
        (300, "host a"),
        (1200, "host a"),
        (4800, "host b"),
    ]
    # 1.40 → 1.50 → 1.60 at ×4 steps: one least-squares line through all three points
    slope = merged["summary"]["finetune"]["tau_per_decade"]
    assert slope == pytest.approx(0.1 / math.log10(4), abs=1e-4)
    md = out.with_suffix(".md").read_text()
    assert "| 4,800 | 0 | 1,800 (8) | **1.600** |" in md
    assert "- host b: 4,800" in md and "- host a: 300, 1,200" in md
    assert out.with_suffix(".png").stat().st_size > 1000
    capsys.readouterr()
    with pytest.raises(SystemExit):
        oc.main(["merge", "--curve", str(tmp_path / "none.json"), "--out", str(out)])
    assert "none.json: no such curve" in capsys.readouterr().err


def test_a_language_without_the_chat_set_is_tabled_on_its_one_held_out_set(tmp_path):
    run = tmp_path / "run"
    _distill(run / "synth" / "de-distill", [100] * 30)
    for n in (300, 3000):
        oc.answers_prefix(run / "synth" / "de-distill" / "data.jsonl", n)
    for name, tau in (("oc-300", 1.30), ("oc-3000", 1.50), ("oc-3000-lk", 1.45)):
        _stage(run / name / "de" / "finetune", 900.0, 2.0, [(8, tau, [tau - 1, 0.1, 0.0, 0.0])], 10)
    args = ["table", "--run", str(run), "--points", "300 3000", "--lang", "de"]
    with pytest.raises(SystemExit):  # the chat set is expected by default
        oc.main(args)
    assert oc.main([*args, "--no-chat", "--ab-point", "3000", "--arms", "lk"]) == 0
    got = json.loads((run / "onpolicy-curve.json").read_text())
    assert [r["chat"] for r in got["points"]] == [None, None]
    assert set(got["summary"]) == {"finetune", "seed_spread"}
    assert got["summary"]["finetune"]["tau_per_decade"] == pytest.approx(0.2)
    assert got["recipe_vs_point"][0]["finetune"]["d_tau"] == pytest.approx(-0.05)
    md = (run / "onpolicy-curve.md").read_text()
    row = "| 3,000 | 0 | 1,800 (8) | **1.500** | 0.500 | 0.100 | 0.000 | 0.000 | – | – | – |"
    assert row + " – |" * 8 in md.splitlines()  # the chat set's eight cells empty
    assert "| lk | 1.450 (-0.050) | 0.450 (-0.050) | 0.100 | – | – | – | – |" in md
    assert (run / "onpolicy-curve.png").stat().st_size > 1000


def _plan(**env):
    """The curve script's STEP=plan output under ``env`` (unset: the script's defaults)."""
    script = Path(__file__).resolve().parents[2] / "scripts/experiments/onpolicy-curve.sh"
    base = {k: v for k, v in os.environ.items() if k not in {"SEEDS", "SEED_POINTS", "ARMS"}}
    out = subprocess.run(
        ["bash", str(script)],
        env={**base, **env, "STEP": "plan"},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


def test_the_curve_script_runs_no_seeds_or_arms_when_they_are_set_empty():
    # make chat-large passes SEEDS= SEED_POINTS= ARMS=: empty means none, not the defaults
    assert "0 seed runs + 0 arms" in _plan(SEEDS="", SEED_POINTS="", ARMS="", POINTS="3000000")
    assert "seeds=[1] seed_points=[140000 700000]" in _plan()
    assert "2 seed runs + 4 arms" in _plan()


def test_the_curve_script_names_the_packs_it_unpacks_first(tmp_path):
    (tmp_path / "synth+en.tar.xz").write_bytes(b"")
    assert f"packs: 1 in {tmp_path}" in _plan(PACKS=str(tmp_path))
    assert "packs:" not in _plan()


def test_plot_marks_every_curve_past_the_fifth(tmp_path, monkeypatch):
    import matplotlib.axes

    labels, real = [], matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        labels.append(kwargs.get("label"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    sets = {"finetune": {"tau": 1.5, "alpha": [0.4]}, "chat": {"tau": 1.7, "alpha": [0.5]}}
    curves = [
        (f"curve {i}", [{"seed": 0, "answer_tokens": 1000 * (i + 1), **sets}]) for i in range(7)
    ]
    oc.plot(curves, tmp_path / "seven.png")
    # one legend entry per curve and held-out set: none dropped when the markers run out
    assert sum(1 for x in labels if x and x.endswith("— curve 6")) == 2
    assert len({x for x in labels if x}) == 14
    assert (tmp_path / "seven.png").stat().st_size > 1000
