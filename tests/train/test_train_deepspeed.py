"""train/: DeepSpeed ZeRO-2/3 through `accelerate launch` with the shipped CPU configs (2 processes,
gloo) on a tiny target — kill then resume equals an uninterrupted run; ZeRO-3's sharded weights are
gathered into a drafter folder that `load_drafter` rebuilds."""

import importlib.util
import json
import shutil

import pytest
import torch

from conftest import REPO, drafter_argv, prepare_run, run_cli
from polyspec.config import apply_overrides, validate
from polyspec.drafter_models import load_drafter
from polyspec.errors import PolyspecError
from polyspec.targets import load_target
from train.config import TrainConfig
from train.drafter import DrafterRecipe

needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (the [deepspeed] extra; `make setup` installs it)",
)


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory, tiny_llama_dir):
    return prepare_run(tmp_path_factory.mktemp("run-llama-ds"), tiny_llama_dir)


def launch(config: str, run_dir, target_dir, *extra: str, env: dict | None = None):
    """``accelerate launch --config_file configs/accelerate/<config> train/drafter.py …`` (8
    finetune steps)."""
    return run_cli(
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(REPO / "configs" / "accelerate" / config),
        *drafter_argv(run_dir, target_dir, *extra),
        env=env,
    )


def losses(run_dir) -> dict[int, float]:
    rows = [
        json.loads(x)
        for x in (run_dir / "train/vi/finetune/metrics.jsonl").read_text().splitlines()
    ]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.mark.slow
@needs_deepspeed
def test_zero2_kill_then_resume_reaches_the_loss_of_an_uninterrupted_run(
    tmp_path, llama_run, tiny_llama_dir
):
    for name in ("ref", "crash"):
        shutil.copytree(llama_run, tmp_path / name)
    ref = launch("zero2-cpu.yaml", tmp_path / "ref", tiny_llama_dir)
    assert ref.returncode == 0, ref.stderr[-3000:]
    ck = tmp_path / "ref/train/vi/finetune/checkpoint-8"
    # DeepSpeed really ran (use_cpu: true would silently fall back to one plain process): one
    # optimizer shard a rank
    assert sorted(p.name for p in (ck / "pytorch_model").glob("*optim_states.pt")) == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    assert json.loads((ck / "trainer_state.json").read_text())["step"] == 8
    crashed = launch(
        "zero2-cpu.yaml",
        tmp_path / "crash",
        tiny_llama_dir,
        env={"POLYSPEC_TEST_KILL_AT_STEP": "5"},
    )
    # rank 0 died right after step 5
    assert crashed.returncode != 0 and max(losses(tmp_path / "crash")) == 5
    resumed = launch(
        "zero2-cpu.yaml", tmp_path / "crash", tiny_llama_dir, env={"POLYSPEC_TEST_KILL_AT_STEP": ""}
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed vi/finetune from checkpoint-4" in resumed.stdout + resumed.stderr
    a, b = losses(tmp_path / "ref"), losses(tmp_path / "crash")
    assert [b[s] for s in (5, 6, 7, 8)] == pytest.approx([a[s] for s in (5, 6, 7, 8)], rel=1e-6)
    assert a[1] != a[8]  # it trained


@pytest.mark.slow
@needs_deepspeed
def test_zero3_trains_and_saves_gathered_weights(tmp_path, llama_run, tiny_llama_dir):
    shutil.copytree(llama_run, tmp_path / "run")
    proc = launch(
        "zero3-cpu.yaml", tmp_path / "run", tiny_llama_dir, "eagle.arch=eagle3", "finetune.steps=4"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ck = tmp_path / "run/train/vi/finetune/checkpoint-4/pytorch_model"
    assert len(list(ck.glob("zero_pp_rank_*_mp_rank_00_model_states.pt"))) == 2, (
        "parameters sharded over 2 ranks"
    )
    # NaN-initialised: a missing shard fails here
    model, meta = load_drafter(tmp_path / "run/train/vi/final")
    assert meta["step"] == 4 and model.arch_name == "eagle3"
    head = load_target(str(tiny_llama_dir)).model.get_output_embeddings().weight[model.draft_ids]
    assert not torch.equal(model.lm_head.weight, head), (
        "the trained head, not its initial copy of the target's rows"
    )
    assert all(
        torch.isfinite(v).all() for v in model.state_dict().values() if v.is_floating_point()
    )


def test_the_train_config_owns_gradient_accumulation(tmp_path, tiny_llama_dir, monkeypatch):
    # what `gradient_accumulation_steps: 4` in an accelerate config sets; the loop feeds
    # optim.grad_accum micro-batches
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    cfg = validate(
        TrainConfig,
        apply_overrides(
            {}, [f"run={tmp_path}", f"target={tiny_llama_dir}", "stage=finetune", "report_to=none"]
        ),
    )
    with pytest.raises(
        PolyspecError, match="set to 4 gradient accumulation steps, the train config to 1"
    ):
        DrafterRecipe(cfg, "finetune").setup()
