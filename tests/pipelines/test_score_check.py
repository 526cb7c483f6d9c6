"""pipelines.score_check on one trained drafter folder (a learning curve's point, issue 68): the
decoder's α₁..α_γ beside the training score's, through a temporary bundle, for both held-out sets.
The two count acceptance by one rule, so they agree exactly when they read the same features."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from conftest import make_tiny_bundle, run_cli
from decoder.core import GenerationResult, StepStat
from pipelines import score_check as sc
from polyspec.config import apply_overrides, validate
from polyspec.features import FeatureReader, prefill_features, write_shard
from polyspec.targets import load_target
from train.score import summarize, walk

SETS = ("heldout", "heldout-chat")


def _records(run, name, target) -> list[tuple[list[int], int, torch.Tensor]]:
    """(ids, start, aux [n, 3H]) of each captured held-out answer."""
    reader = FeatureReader(target.spec.name, target.tokenizer_sha256)
    out = []
    for rec in sc.heldout_records(run, "en", run / "synth" / f"en-{name}" / "data.jsonl"):
        ids, start = reader.ids(rec["_path"], rec["id"])
        out.append((ids, start, reader.get(rec["_path"], rec["id"], "aux").float()))
    return out


def _fit(records, embed, steps: int = 10):
    """``make_tiny_bundle``'s ``fit``: a few Adam steps of an EAGLE-3 drafter on every other
    held-out answer at draft depths 1 and 2 (the second from its own output, as the chain
    continues), so that its chains are kept in part: α₁ and α₂ between 0 and 1."""
    from polyspec.drafter_models import attention_bias
    from train.objectives import draft_logits

    def fit(model, order):
        row = {int(x): j for j, x in enumerate(model.draft_ids.tolist())}
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(steps):
            loss = 0.0
            for ids, start, aux in records[::2]:
                n = len(ids)
                emb = embed(torch.tensor([ids])).float().detach()
                # depth 1: entry p reads [embed(x_p) ‖ g_{p-1}] and drafts x_{p+1}
                pred, past = model(
                    emb[:, 1:n],
                    aux[None, : n - 1],
                    position_ids=torch.arange(1, n)[None],
                    use_cache=True,
                )
                tgt = torch.tensor([row[t] for t in ids[start + 1 :]])
                loss = loss + torch.nn.functional.cross_entropy(
                    draft_logits(model, pred[0, start - 1 : n - 2], None), tgt
                )
                # depth 2: entry p+1 reads [embed(x_{p+1}) ‖ its own f̂_p], sees entries 1..p
                k = n - 2
                allowed = torch.zeros(k, n - 1 + k, dtype=torch.bool)
                for i in range(k):
                    allowed[i, : i + 1] = True
                    allowed[i, n - 1 + i] = True
                pred2, _ = model(
                    emb[:, 2:n],
                    pred[:, : n - 2],
                    position_ids=torch.arange(2, n)[None],
                    attention_mask=attention_bias(allowed[None, None], torch.float32),
                    past_key_values=past,
                    use_cache=True,
                )
                loss = loss + torch.nn.functional.cross_entropy(
                    draft_logits(model, pred2[0, start - 1 : n - 3], None), tgt[1:]
                )
            opt.zero_grad()
            loss.backward()
            opt.step()

    return fit


@pytest.fixture(scope="module")
def point(tmp_path_factory, tiny_llama_dir):
    """A learning curve's layout for the tiny target: ``<run>/synth/en-{heldout,heldout-chat}/``
    (greedy answers, EAGLE-3 features captured), ``<run>/vocab/en.*`` and an EAGLE-3 drafter at
    ``<run>/oc-100/en/finetune/final``."""
    from synth.config import DistillConfig
    from synth.distill import run_distill

    root = tmp_path_factory.mktemp("score-check")
    run = root / "b-run"  # make_tiny_bundle's run folder for root / "b"
    t = load_target(str(tiny_llama_dir))
    for name in SETS:
        run_distill(
            validate(
                DistillConfig,
                apply_overrides(
                    {},
                    [
                        f"run={run}",
                        f"target={tiny_llama_dir}",
                        "lang=en",
                        f"prompts={name}",
                        f"out_name={name}",
                        "temperatures=[0.0]",
                        "sampling.max_new_tokens=24",
                        "engine.batch_size=16",
                        "capture_features=true",
                        "feature_layers=eagle3",
                    ],
                ),
            )
        )
    records = [r for name in SETS for r in _records(run, name, t)]
    fit = _fit(records, t.model.get_input_embeddings())
    make_tiny_bundle(root / "b", t, langs=("en",), drafter="eagle3", sizes=(t.vocab_size,), fit=fit)
    drafter = run / "oc-100" / "en" / "finetune" / "final"
    drafter.parent.mkdir(parents=True)
    shutil.move(run / "train" / "en" / "final", drafter)
    return run, drafter, t


def _rewrite_features_fp32(run, name, target, aux_layers) -> None:
    """The held-out set's feature shards again, in fp32 from one forward of each captured sequence:
    what the decoder's own forwards compute (captures store bf16)."""
    reader = FeatureReader(target.spec.name, target.tokenizer_sha256)
    folder = run / "synth" / f"en-{name}"
    shards: dict[str, dict] = {}
    for rec in sc.heldout_records(run, "en", folder / "data.jsonl"):
        ids, start = reader.ids(rec["_path"], rec["id"])
        [got] = prefill_features(target, [ids], aux_layers)
        shards.setdefault(rec["features_file"], {})[rec["id"]] = {
            "ids": ids,
            "start": start,
            **{k: v.float() for k, v in got.items()},
        }
    for file, rows in shards.items():
        meta = reader._file(str(folder / file)).metadata()
        write_shard(folder / file, rows, meta, dtype=torch.float32)


def test_decoder_alpha_equals_the_score_alpha_on_the_same_features(point, tmp_path, tiny_llama_dir):
    """The decoder's chain (γ 3) and the training score walk the same steps — α₁..α₃, the step count
    and τ equal exactly — when the score reads the features the decoder computes (fp32 shards);
    ``--drafter`` runs end to end from the command line and writes beside the drafter."""
    run, drafter, t = point
    fp32 = tmp_path / "run"  # a copy: the module's captures stay bf16 for the next test
    shutil.copytree(run, fp32)
    d = fp32 / drafter.relative_to(run)
    aux_layers = json.loads((d / "config.json").read_text())["aux_layers"]
    _rewrite_features_fp32(fp32, "heldout", t, aux_layers)
    r = run_cli(
        "-m",
        "pipelines.score_check",
        "--run",
        str(fp32),
        "--drafter",
        str(d),
        "--gamma",
        "3",
        "--target",
        str(tiny_llama_dir),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = json.loads((d.parent / "score_check-heldout.json").read_text())
    assert got["lang"] == "en" and got["prompts"] == 24 and got["dtype"] == "float32", got
    assert got["answers_identical_to_captured"] == "24/24", got
    assert got["decoder_alpha"] == got["score_alpha"], got
    assert got["decoder_steps"] == got["score_steps"] and got["decoder_tau"] == got["score_tau"]
    a = got["decoder_alpha"]
    # partial acceptance, chains that continue past their first draft
    assert 0 < a[0] < 1 and 0 < a[1] <= a[0] and got["top1_teacher_forced"] is not None, got
    assert "| en |" in r.stdout and "α₁..α_γ (decoder)" in r.stdout
    assert not list(d.parent.glob(".*"))  # written atomically: no temporary left beside it


def test_the_chat_held_out_set_goes_to_its_own_file(point, tiny_llama_dir):
    """``--heldout`` reads the chat set's captured (bf16) answers; the result goes to its own file
    beside the drafter, and decoder and score agree within the features' rounding."""
    run, drafter, _ = point
    chat = run / "synth" / "en-heldout-chat" / "data.jsonl"
    argv = ["--run", str(run), "--drafter", str(drafter), "--gamma", "3", "--heldout", str(chat)]
    assert sc.main([*argv, "--target", str(tiny_llama_dir)]) == 0
    got = json.loads((drafter.parent / "score_check-heldout-chat.json").read_text())
    n = sum(1 for line in chat.read_text().splitlines() if json.loads(line).get("features_file"))
    assert got["heldout"] == str(chat) and got["prompts"] == n > 0
    assert got["answers_identical_to_captured"] == f"{n}/{n}", got
    assert got["decoder_alpha"] == pytest.approx(got["score_alpha"], abs=0.05), got
    assert not (drafter.parent / "score_check-heldout.json").exists()
    for bad in (
        ["--run", str(run), "--drafter", str(run)],  # not a drafter folder
        [*argv, "--langs", "en"],  # a bundle's option
        ["--run", str(run), "--heldout", str(chat)],  # a drafter's option without one
    ):
        with pytest.raises(SystemExit) as e:
            sc.main([*bad, "--target", str(tiny_llama_dir)])
        assert e.value.code == 2, bad


def test_a_step_counts_the_drafts_kept_before_the_answers_end():
    """The α rule both sides share: a step whose accepted drafts ran into the answer's end counts
    its last token as the target's own (the score never drafts the last answer token), and steps
    cut short still count in every α_i — the decoder's steps through ``summarize`` equal the
    score's ``walk`` over the same answer."""

    def step(accepted, new):
        return StepStat(new, accepted, 3, "en", None, "chain", 0.0, 0.0)

    # answer x[0..7] (n = 8 + prompt): steps keep 2+1, 0+1, 3 drafts of which the third is the end
    out = GenerationResult(list(range(8)), "", "eos", [step(2, 3), step(0, 1), step(3, 3)], 4)
    assert sc.kept_drafts(out) == [2, 0, 2]
    right = {0: 2, 3: 0, 4: 3}  # prompt of 1 token: start = 1, positions shifted by it
    acc = walk(9, 1, 3, lambda p: [i < right[p - 1] for i in range(3)])
    assert acc == sc.kept_drafts(out)
    assert summarize([(8, sc.kept_drafts(out))], 3)["alpha"] == [0.6667, 0.6667, 0.0]
