"""pipelines/: the whole chain on a tiny target — stage records and skipping, kill + resume giving
the same bundle, the final report; and the GPU profile's dry run."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from conftest import REPO, TINY_SYNTH, run_cli


def train_overrides(steps: str, eval_every: int, *extra: str) -> list[str]:
    """A tiny profile's train stage: ``steps``, checkpoints every 2 steps, ``extra``, 48 tokens."""
    return [
        steps,
        "checkpoint_every=2",
        f"eval_every={eval_every}",
        *extra,
        "eagle.vocab_size=64",
        "data.max_length=48",
        "optim.batch_size=2",
        "data.eval_max_examples=1",
        "eval_depth=2",
        "report_to=none",
    ]


def tiny_profile(path, target_dir) -> str:
    prof = {
        "name": "tiny",
        "description": "test profile on a tiny random target",
        "langs": ["vi"],
        "target": str(target_dir),
        "synth": {
            "n": 6,
            "overrides": [*TINY_SYNTH, "engine.batch_size=8"],
        },
        "distill": {
            "temperatures": [0.0, 1.0],
            "limit": 10,
            "overrides": ["sampling.max_new_tokens=24", "engine.batch_size=8"],
        },
        "vocab": {"sources": "synth", "overrides": ["heldout=seeds"]},
        "train": {
            "pretrain_overrides": train_overrides("pretrain.steps=4", 2, "log_every=1"),
            "finetune_overrides": train_overrides("finetune.steps=3", 3, "log_every=1"),
            # the EAGLE-3 drafters engines load, beside the default recipe's hinted EAGLE-1 ones
            "engine": {
                "pretrain_overrides": train_overrides("pretrain.steps=2", 2),
                "finetune_overrides": train_overrides("finetune.steps=2", 2),
            },
        },
        "export": {"sizes": [64, 128]},
        "calibrate": {"sizes": [1, 2], "prompts": 1, "max_new_tokens": 8},
        "eval": {"methods": ["ar", "adaspec", "eagle3", "pld"], "per_cell": 1, "max_new_tokens": 8},
        "eta_minutes": {"synth": 0.2, "train": 0.2},
    }
    path.write_text(yaml.safe_dump(prof))
    return str(path)


def pipeline(profile, run, *extra, env=None):
    return run_cli(
        "-m",
        "pipelines",
        "run",
        "--profile",
        profile,
        "--langs",
        "vi",
        "--run",
        str(run),
        *extra,
        env=env,
    )


def assert_eval_is_its_answers(eval_dir):
    """The eval's τ is recomputed from the per-answer counts it wrote (answers/<method>.jsonl),
    those counts agree with the per-step accept lengths, every method is identical to ar, and prompt
    lookup's drafts were kept: the tiny target's answers to the eval questions repeat themselves, so
    pld and adaspec (whose loop runs are prompt lookup's) must reach τ > 1 — a decoder that never
    keeps a draft, or miscounts, fails here."""
    ev = json.loads((eval_dir / "report.json").read_text())
    for m, res in ev["methods"].items():
        answers = [
            json.loads(line)
            for line in (eval_dir / "answers" / f"{m}.jsonl").read_text().splitlines()
        ]
        assert answers and all(a["identical"] for a in answers) and res["overall"]["identical"], m
        tokens, forwards = (
            sum(a["new_tokens"] for a in answers),
            sum(a["target_forwards"] for a in answers),
        )
        assert res["overall"]["tau"] == pytest.approx(tokens / forwards), m
        # each turn: a prefill forward that gives one token, then one forward per step
        for a in answers:
            turns = len(a["turns"])
            assert (len(a["accept_lengths"]) + turns, sum(a["accept_lengths"]) + turns) == (
                a["target_forwards"],
                a["new_tokens"],
            ), (m, a)
    assert (
        ev["methods"]["pld"]["overall"]["tau"] > 1.0
        and ev["methods"]["adaspec"]["overall"]["tau"] > 1.0
    ), ev


@pytest.mark.slow
def test_pipeline_end_to_end_skips_done_stages_and_resumes_after_kill(
    tmp_path, tiny_llama_dir, tiny_gemma_dir
):
    profile = tiny_profile(tmp_path / "tiny.yaml", tiny_llama_dir)
    run = tmp_path / "run"
    first = pipeline(profile, run)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "report: " in first.stdout and (run / "report" / "report.md").is_file()
    report = (run / "report" / "report.md").read_text()
    for part in (
        "## 1 synth",
        "## 2 vocab",
        "## 3 training",
        "## 4 calibration",
        "## 5 evaluation",
        "## Provenance",
        "adaspec",
        "| language | adaspec τ | α₁ | adaspec speedup (τ) | eagle3 speedup (τ) | "
        "pld speedup (τ) |",
    ):
        assert part in report, part
    assert (run / "report" / "training.png").is_file() and (
        run / "report" / "speedup.png"
    ).is_file()
    assert_eval_is_its_answers(run / "eval")
    # languages, not synth folders
    assert " · languages vi · " in report and "| vi-distill | " in report
    # the same metrics in an offline wandb run
    assert list((run / "report" / "wandb").glob("offline-run-*"))
    for stage in (
        "synth/vi",
        "synth/vi-distill",
        "synth/vi-heldout",
        "vocab",
        "train/vi/pretrain",
        "train/vi",
        "export",
        "train-eagle3/vi/pretrain",
        "train-eagle3/vi",
        "export/engines",
        "export/engines-score",
        "calibrate",
        "eval",
        "report",
    ):
        assert (run / stage / "DONE.json").is_file(), stage
    engines = json.loads((run / "export" / "engines" / "engines.json").read_text())
    assert (
        set(engines["drafters"]) == {"vi", "multilingual"} and engines["engines"]["vllm"]["loads"]
    )
    # score:engines, on the held-out answers
    assert engines["drafters"]["vi"]["heldout_tau_by_lang"]["vi"] >= 1.0
    assert "## Drafters for engines" in report and "**vllm** loads multilingual, vi" in report
    assert "eagle3" in report  # the engines' drafter alone, beside the decoder's own methods
    assert (run / "logs" / "train-pretrain.log").is_file()
    files = json.loads((run / "export" / "bundle" / "manifest.json").read_text())["files"]
    # the training score recomputed for the bundle's drafter beside the decoder's τ on the same
    # held-out prompts
    check = run_cli(
        "-m",
        "pipelines.score_check",
        "--run",
        str(run),
        "--gamma",
        "2",
        "--target",
        str(tiny_llama_dir),
    )
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    [row] = json.loads((run / "score_check.json").read_text())
    heldout = [
        r
        for r in map(
            json.loads, (run / "synth" / "vi-heldout" / "data.jsonl").read_text().splitlines()
        )
        if r.get("features_file")
    ]
    assert row["lang"] == "vi" and "| vi | " in check.stdout
    # the decoder reproduced every captured greedy answer, and its τ is its own tokens over its own
    # forwards
    assert (
        len(heldout) > 0
        and row["answers_identical_to_captured"] == f"{len(heldout)}/{len(heldout)}"
    ), row
    assert row["decoder_tau"] == pytest.approx(row["tokens"] / row["forwards"], abs=1e-4), row
    assert row["score_tau"] == pytest.approx(row["decoder_tau"], rel=0.1), row
    wrong = run_cli(
        "-m", "pipelines.score_check", "--run", str(run), "--target", str(tiny_gemma_dir)
    )
    assert wrong.returncode != 0 and "bundle" in wrong.stderr and "Traceback" not in wrong.stderr, (
        wrong.stderr[-2000:]
    )

    again = pipeline(profile, run)  # nothing changed: every stage is skipped
    assert again.returncode == 0 and again.stdout.count("skipped") == 14, again.stdout

    # a changed eval setting redoes eval (and report) only
    changed = yaml.safe_load(open(profile))
    changed["eval"]["max_new_tokens"] = 6
    (tmp_path / "tiny2.yaml").write_text(yaml.safe_dump(changed))
    third = pipeline(str(tmp_path / "tiny2.yaml"), run)
    assert third.returncode == 0 and third.stdout.count("skipped") == 12, third.stdout

    # the same run directory without its training and everything after it (the data stages stay
    # done: running them again from scratch, as until 2026-11-28, cost a minute more and tested no
    # more), killed (kill -9) inside the pretrain stage, then the same command
    for later in (
        "train",
        "train-eagle3",
        "export",
        "calibrate",
        "eval",
        "report",
        "score_check.json",
    ):
        shutil.rmtree(run / later) if (run / later).is_dir() else (run / later).unlink()
    killed = pipeline(profile, run, env={"POLYSPEC_TEST_KILL_AT_STEP": "3"})
    assert killed.returncode != 0 and "train:pretrain failed" in killed.stderr
    assert not (run / "train" / "vi" / "pretrain" / "DONE.json").exists()
    resumed = pipeline(profile, run)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    for stage in ("synth:vi", "distill:vi", "heldout:vi", "vocab"):
        assert f"{stage}: done before" in resumed.stdout  # no finished work is redone
    assert "train:pretrain: running" in resumed.stdout
    assert json.loads((run / "export" / "bundle" / "manifest.json").read_text())["files"] == files


def test_gpu_profile_dry_run_prints_and_validates_the_plan():
    r = run_cli("make", "all", "PROFILE=gpu-paper", "DRY_RUN=1", "LANGS=vi", cwd=REPO)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "target llama-3.1-8b-instruct" in out and "dry run: 12 stages validated" in out
    for piece in (
        "engine.name=vllm",
        "fineweb2",
        "configs/deepspeed/zero2.yaml",
        "decoder.bench",
        "ok: accelerate config",
    ):
        assert piece in out, piece


def test_bad_profile_is_a_one_line_error(tmp_path, tiny_llama_dir):
    bad = yaml.safe_load(open(tiny_profile(tmp_path / "t.yaml", tiny_llama_dir)))
    bad["train"]["finetune_overrides"].append("optim.lr=-1")
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    r = run_cli(
        "-m",
        "pipelines",
        "run",
        "--profile",
        str(tmp_path / "bad.yaml"),
        "--langs",
        "vi",
        "--dry-run",
    )
    assert r.returncode != 0 and "optim.lr" in r.stderr and r.stderr.strip().count("\n") == 0
    missing = run_cli("-m", "pipelines", "run", "--profile", "nope", "--dry-run")
    assert missing.returncode != 0 and "cpu-demo" in missing.stderr


def test_the_results_table_reads_the_eval_and_the_shipped_drafters_score(tmp_path):
    from pipelines.report import results_table
    from polyspec.io import atomic_write_json

    def x(tok_s, tau):
        return {"tok_s": tok_s, "tau": tau, "speedup": tok_s / 20.0}

    ev = {
        "target": "t",
        "dtype": "bfloat16",
        "device": "cpu",
        "cpu": "x86_64",
        "threads": 2,
        "questions": 4,
        "max_new_tokens": 96,
        "ar_baselines": ["ar", "hf-generate"],
        "methods": {
            "ar": {"overall": x(20.0, 1.0), "by_language": {}},
            "hf-generate": {"overall": x(18.0, 1.0), "by_language": {}},
            "adaspec": {
                "overall": x(40.0, 2.2),
                "by_language": {"vi": x(44.0, 2.4), "mixed": x(30.0, 1.9)},
            },
            "pld": {
                "overall": x(60.0, 3.0),
                "by_language": {"vi": x(50.0, 3.1), "mixed": x(70.0, 2.9)},
            },
            "hybrid": {
                "overall": x(75.0, 4.0),
                "by_language": {"vi": x(65.0, 4.5), "mixed": x(77.0, 3.5)},
            },
        },
        "agreement": {
            m: {"vi": {"answers": 3, "identical": i}, "mixed": {"answers": 1, "identical": 1}}
            for m, i in (("adaspec", 2), ("pld", 3), ("hybrid", 1))
        },
    }
    atomic_write_json(
        tmp_path / "train" / "vi" / "final" / "config.json",
        {"eval": {"tau": 2.5, "alpha": [0.61, 0.4]}},
    )
    lines = results_table(tmp_path, ev)
    assert lines[0] == (
        "| language | adaspec τ | α₁ | adaspec speedup (τ) | pld speedup (τ) | "
        "hybrid speedup (τ) | hybrid ÷ pld | identical to ar: adaspec · pld · hybrid |"
    )
    assert (
        lines[2] == "| vi | 2.40 | 0.61 | 2.20× (2.40) | 2.50× (3.10) | 3.25× (4.50) | "
        "1.30 | 2/3 · 3/3 · 1/3 |"
    )
    assert (
        lines[3] == "| mixed | 1.90 | – | 1.50× (1.90) | 3.50× (2.90) | 3.85× (3.50) | "
        "1.10 | 1/1 · 1/1 · 1/1 |"
    )
    assert (
        lines[4] == "| all | 2.20 | – | 2.00× (2.20) | 3.00× (3.00) | 3.75× (4.00) | "
        "1.25 | 3/4 · 4/4 · 2/4 |"
    )
    assert "fastest AR (`ar`, 20.0 tok/s)" in lines[-1] and "bfloat16" in lines[-1]
    assert results_table(tmp_path, {**ev, "methods": {"ar": ev["methods"]["ar"]}}) == []


@pytest.mark.parametrize("name", ["cpu-demo", "cpu-full", "cpu-chat", "gpu-paper"])
def test_shipped_profiles_validate(name):
    r = run_cli("-m", "pipelines", "run", "--profile", name, "--dry-run")
    assert r.returncode == 0, r.stderr


def test_the_prompt_files_a_distill_stage_reads_are_in_its_done_hash(tmp_path):
    """A changed held-out set (or task file) redoes the distillation that reads it, and only that,
    with its dependants; stages that read no repository prompt file keep the hash they always
    had."""
    from pipelines.__main__ import load_profile
    from pipelines.plan import build_plan
    from pipelines.run import stage_hash

    stages = {
        s.name: s
        for s in build_plan(load_profile("cpu-demo"), ["vi"], "gemma3-270m", tmp_path / "run")
    }
    assert [p.replace("\\", "/").split("synth/data/")[-1] for p in stages["heldout:vi"].data] == [
        "heldout.jsonl"
    ]
    assert {p.replace("\\", "/").rsplit("/", 1)[-1] for p in stages["distill:vi"].data} == {
        "vi.yaml",
        "heldout.jsonl",
        "heldout-chat.jsonl",
        "mini_multispecbench.jsonl",
    }
    assert stages["synth:vi"].data == [] and stages["vocab"].data == []
    held = tmp_path / "heldout.jsonl"
    shutil.copy(stages["heldout:vi"].data[0], held)
    stages["heldout:vi"].data = [str(held)]
    before = {n: stage_hash(s, {}) for n, s in stages.items()}
    held.write_text(
        held.read_text()
        + json.dumps(
            {"id": "vi-heldout-99", "lang": "vi", "category": "qa", "turns": ["Câu hỏi mới?"]}
        )
        + "\n"
    )
    after = {n: stage_hash(s, {}) for n, s in stages.items()}
    assert [n for n in stages if before[n] != after[n]] == ["heldout:vi"]


def test_an_explicit_redo_starts_the_stage_afresh_and_a_rerun_after_a_crash_resumes(tmp_path):
    """FROM / FORCE clear a stage's resumable work before running it (a finished trainer's last
    checkpoint would otherwise make the redo train nothing); a plain rerun of a stage without a
    record keeps it to resume from; a work path outside the run directory is refused."""
    import sys

    from pipelines.plan import Stage
    from pipelines.run import run_plan
    from polyspec.errors import PolyspecError

    run = tmp_path / "run"
    work = run / "train" / "vi" / "pretrain"
    # the stage "resumes": it counts the checkpoints it finds, then writes one more
    script = (
        "import pathlib, sys; w = pathlib.Path(sys.argv[1]); w.mkdir(parents=True, exist_ok=True); "
        "n = len(list(w.glob('checkpoint-*'))); (w / f'checkpoint-{n}').write_text(str(n))"
    )
    st = Stage(
        "train:pretrain",
        "pretrain",
        [sys.executable, "-c", script, str(work)],
        work / "DONE.json",
        work=[work],
    )
    logs = []
    run_plan([st], run, {}, log=logs.append)
    assert sorted(p.name for p in work.glob("checkpoint-*")) == ["checkpoint-0"]
    run_plan([st], run, {}, log=logs.append)  # done before: skipped, nothing touched
    assert sorted(p.name for p in work.glob("checkpoint-*")) == ["checkpoint-0"]
    # as after a crash: no record, the work stays and the stage resumes from it
    (work / "DONE.json").unlink()
    run_plan([st], run, {}, log=logs.append)
    assert sorted(p.name for p in work.glob("checkpoint-*")) == ["checkpoint-0", "checkpoint-1"]
    # redo: cleared first, so the stage starts from nothing
    for kw in ({"from_stage": "train"}, {"force": True}):
        logs.clear()
        run_plan([st], run, {}, log=logs.append, **kw)
        assert sorted(p.name for p in work.glob("checkpoint-*")) == ["checkpoint-0"], kw
        assert any("cleared" in line for line in logs), logs
    assert not list(work.parent.glob(".pretrain.cleared-*"))
    outside = Stage(
        "x",
        "pretrain",
        [sys.executable, "-c", "pass"],
        run / "x" / "DONE.json",
        work=[tmp_path / "elsewhere"],
    )
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(PolyspecError, match="not inside the run directory"):
        run_plan([outside], run, {}, force=True, log=logs.append)
    assert (tmp_path / "elsewhere").is_dir()


def test_a_profile_with_the_corpus_prefills_it_for_the_pretrain(tmp_path):
    """corpus.enabled: corpus:<l> and prefill:<l> per language, and the pretrain reads each
    prefill's records beside the distilled answers and waits for them; without it the plan is as
    before."""
    from pipelines.__main__ import load_profile
    from pipelines.plan import build_plan, validate_plan

    prof = load_profile("cpu-demo")
    run = tmp_path / "run"
    plain = {s.name: s for s in build_plan(prof, ["vi", "de"], "gemma3-270m", run)}
    prof.corpus.enabled, prof.corpus.tokens = True, 12345
    stages = build_plan(prof, ["vi", "de"], "gemma3-270m", run)
    by = {s.name: s for s in stages}
    assert set(by) - set(plain) == {"corpus:vi", "corpus:de", "prefill:vi", "prefill:de"}
    assert by["prefill:de"].deps == ["corpus:de"] and "12345" in by["prefill:de"].cmd
    order = [s.name for s in stages]
    for prefix in ("train", "train3"):
        pre = by[f"{prefix}:pretrain"]
        assert {"prefill:vi", "prefill:de"} <= set(pre.deps) and order.index(
            "prefill:de"
        ) < order.index(pre.name)
        data = next(x for x in pre.cmd if x.startswith("data.pretrain="))
        assert (
            data
            == "data.pretrain=["
            + ",".join(
                [
                    f"{run}/synth/vi-distill/data.jsonl",
                    f"{run}/synth/de-distill/data.jsonl",
                    f"{run}/corpus/vi-prefill/data.jsonl",
                    f"{run}/corpus/de-prefill/data.jsonl",
                ]
            )
            + "]"
        )
        assert "features=captured" in pre.cmd
        assert not any(
            x.startswith("data.pretrain=") and "-prefill/" in x
            for x in plain[f"{prefix}:pretrain"].cmd
        )
    assert any(
        "corpus:vi" in line for line in validate_plan(stages, prof, "gemma3-270m", ["vi", "de"])
    )


def test_the_report_counts_the_answers_in_each_sets_language(tmp_path):
    """On-policy answers are kept whatever their language: the synth table says how often the
    target answered in the language it was asked in (fastText, as the self-synthesis filter)."""
    from pipelines.report import answers_in_language, synth_row

    data = tmp_path / "data.jsonl"
    answers = [
        "Le chat dort sur le canapé du salon depuis ce matin.",
        "The cat has been sleeping on the living-room sofa since this morning.",
        "Nous partirons demain matin pour visiter le musée de la ville.",
    ]
    data.write_text(
        "".join(
            json.dumps(
                {"conversations": [{"from": "human", "value": "?"}, {"from": "gpt", "value": a}]}
            )
            + "\n"
            for a in answers
        )
    )
    assert answers_in_language(data, "fr") == (2, 3)
    assert answers_in_language(tmp_path / "none.jsonl", "fr") is None
    row = synth_row("fr-distill", {"accepted": 3, "attempted": 3, "tokens": 40}, (2, 3))
    assert "| 2/3 (67%) | 40 |" in row
