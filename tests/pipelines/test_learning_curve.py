"""pipelines.learning_curve: a point's share of the prefilled corpus, and the points' table and plot
from made-up training logs (the shapes train/recipe.py writes)."""

from __future__ import annotations

import json

import pytest

from pipelines import learning_curve as lc
from polyspec.errors import PolyspecError


def _prefill(folder, sizes):
    folder.mkdir(parents=True)
    with open(folder / "data.jsonl", "w") as fh:
        for i, n in enumerate(sizes):
            fh.write(
                json.dumps(
                    {
                        "id": f"en-corpus-{i:07d}",
                        "features_file": f"features/a{i:07d}.safetensors",
                        "tokens": n,
                    }
                )
                + "\n"
            )
    return folder / "data.jsonl"


def test_prefix_takes_the_first_chunks_until_the_tokens_and_refuses_a_corpus_too_short(tmp_path):
    src = _prefill(tmp_path / "corpus" / "en-prefill", [100, 100, 50, 256, 256])
    dst, n, total = lc.corpus_prefix(src, 200)
    assert (dst.name, n, total) == ("data-200.jsonl", 2, 200)
    dst, n, total = lc.corpus_prefix(src, 201)
    assert (n, total) == (3, 250)
    rows = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [r["id"] for r in rows] == [
        "en-corpus-0000000",
        "en-corpus-0000001",
        "en-corpus-0000002",
    ]
    # relative to the same folder as the source
    assert rows[2]["features_file"] == "features/a0000002.safetensors"
    with pytest.raises(PolyspecError, match="fewer than"):
        lc.corpus_prefix(src, 10_000)


def _stage(folder, tokens_per_s, seconds, evals, examples):
    folder.mkdir(parents=True)
    lines = [{"event": "start", "stage": folder.name, "step": 0, "train_examples": examples}]
    for step, tau, alpha in evals:
        lines += [
            {"step": step, "loss": 1.0, "top1_0": 0.4},
            {
                "step": step,
                "eval": {
                    "tau": tau,
                    "accept_len": tau - 1,
                    "alpha": alpha,
                    "steps": 10,
                    "sequences": 24,
                    "tokens": 100,
                },
            },
        ]
    lines.append(
        {
            "event": "end",
            "stage": folder.name,
            "train_tokens_per_s": tokens_per_s,
            "seconds": seconds,
        }
    )
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_table_reads_each_points_final_score_and_draws_the_curve(tmp_path):
    run, corpus = tmp_path / "run", tmp_path / "lc"
    _prefill(corpus / "corpus" / "en-prefill", [128] * 10)
    lc.corpus_prefix(corpus / "corpus" / "en-prefill" / "data.jsonl", 500)
    for n, tau in ((0, 1.40), (500, 1.55)):
        base = run / f"lc-{n}" / "en"
        _stage(base / "pretrain", 1000.0, 2.0 + n / 100, [(5, 1.2, [0.2, 0.0, 0.0, 0.0])], 10)
        # the best score came early; the table reports the last (the final weights'), not the best
        _stage(
            base / "finetune",
            900.0,
            3.0,
            [(4, 1.9, [0.6, 0.2, 0.1, 0.0]), (8, tau, [tau - 1, 0.1, 0.0, 0.0])],
            10,
        )
    assert lc.main(["table", "--run", str(run), "--corpus", str(corpus), "--points", "0,500"]) == 0
    got = json.loads((corpus / "learning-curve.json").read_text())["points"]
    assert [p["corpus_tokens"] for p in got] == [0, 512]
    assert [p["pretrain"]["tokens"] for p in got] == [2000, 7000]
    assert [p["finetune"]["tau"] for p in got] == [1.40, 1.55]
    assert got[1]["finetune"]["alpha"][0] == pytest.approx(0.55)
    md = (corpus / "learning-curve.md").read_text()
    assert "| 512 | 7,000 (5) | 2,700 (8) | **1.550** | 0.550 | 0.100 | 0.000 | 0.000 | 24 |" in md
    assert (corpus / "learning-curve.png").stat().st_size > 1000


def test_stage_summary_counts_every_launch_of_a_resumed_stage(tmp_path):
    folder = tmp_path / "finetune"
    _stage(folder, 1000.0, 2.0, [(8, 1.5, [0.5, 0.0])], 10)
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    # a second launch resumed at step 6: its end record holds that launch alone
    resumed = json.dumps({"event": "start", "stage": "finetune", "step": 6, "train_examples": 10})
    (folder / "metrics.jsonl").write_text("\n".join([lines[0], resumed, *lines[1:]]) + "\n")
    old = lc.stage_summary(folder)
    assert old["tokens"] is None and old["seconds"] is None and old["tau"] == 1.5
    # the trainer now writes the stage's totals over every launch
    end = {**json.loads(lines[-1]), "stage_tokens": 5000, "stage_seconds": 4.0}
    new_lines = [lines[0], resumed, *lines[1:-1], json.dumps(end)]
    (folder / "metrics.jsonl").write_text("\n".join(new_lines) + "\n")
    new = lc.stage_summary(folder)
    assert (new["tokens"], new["seconds"], new["tokens_per_s"]) == (5000, 4.0, 1250.0)
    row = {"corpus_tokens": 0, "pretrain": old, "finetune": new}
    assert lc.table([row])[-1].startswith("| 0 | – (8) | 5,000 (8) | **1.500** |")


def test_table_says_which_point_has_not_finished(tmp_path):
    run = tmp_path / "run"
    _stage(run / "lc-0" / "en" / "pretrain", 1000.0, 2.0, [(5, 1.2, [0.2, 0.0])], 10)
    (run / "lc-0" / "en" / "finetune").mkdir(parents=True)
    (run / "lc-0" / "en" / "finetune" / "metrics.jsonl").write_text(
        json.dumps({"event": "start", "step": 0}) + "\n"
    )
    with pytest.raises(PolyspecError, match="has not finished"):
        lc.collect(run, tmp_path, [0], "en")
