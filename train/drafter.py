"""Drafter training — the entry point: runs a recipe's stages for one language.

    accelerate launch train/drafter.py --config configs/train/eagle-cpu.yaml lang=vi
    accelerate launch --multi_gpu --num_processes 2 train/drafter.py --config … (DDP; gloo on CPU)
    accelerate launch --config_file configs/deepspeed/zero2.yaml train/drafter.py --config … (GPUs)
    accelerate launch --config_file configs/accelerate/zero2-cpu.yaml train/drafter.py --config …
        (2 CPU processes)
    python -m train.drafter --config …   (or python -m train …: one process)

Stages (the pretrain-and-finetune of Yi et al. 2024, "Towards Fast Multilingual LLM Inference"):
``pretrain`` on general text (loss on every token), then ``finetune`` on the language's synth data
(loss on response tokens), starting from the pretrain weights. Outputs under
``<run>/train/<lang>/``: ``<stage>/checkpoint-<step>/`` (train/checkpoint.py: exact resume),
``<stage>/final/``, ``<stage>/best/`` (by the held-out score: the decoder's chain τ,
train/score.py), ``<stage>/metrics.jsonl``, and ``final/`` (the last stage's best/ — its final/ when
no evaluation ran —: what export ships).

Where the parts live: train/recipe.py (one stage: setup and the training loop), train/checkpoint.py,
train/data.py (examples), train/objectives.py (losses), train/score.py (held-out score), and the
drafter models in polyspec/drafter_models.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

if __package__ in (None, ""):  # `accelerate launch train/drafter.py` runs this file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from polyspec.config import load_config
from polyspec.errors import cli_entry
from polyspec.io import atomic_directory, atomic_write_json
from polyspec.languages import get_language
from train.config import TrainConfig
from train.data import expand_paths
from train.recipe import DrafterRecipe, resolve_mixed_precision

__all__ = ["DrafterRecipe", "main", "resolve_mixed_precision", "run"]


def run(cfg: TrainConfig, target=None) -> list[dict]:
    """The stages ``cfg.stage`` names, in order, for ``cfg.lang``; each stage's result (steps,
    losses, held-out score). The finished stage's best (else final) weights become
    ``<run>/<train_dir>/<lang>/final/``."""
    get_language(cfg.lang, target=cfg.target)
    stages = ["pretrain", "finetune"] if cfg.stage == "both" else [cfg.stage]
    for stage in stages:  # missing data is an error before any model is loaded
        expand_paths(
            cfg.data.pretrain if stage == "pretrain" else cfg.data.finetune, cfg.run, cfg.lang
        )
        if stage == "finetune" and cfg.data.eval_file:
            expand_paths(cfg.data.eval_file, cfg.run, cfg.lang)
    results = []
    for stage in stages:
        recipe = DrafterRecipe(cfg, stage)
        recipe.setup(target=target)
        target = recipe.target
        # the starting weights' score, kept beside the stage's metrics (python -m train.compare)
        if cfg.eval_only:
            results.append(
                {
                    "stage": stage,
                    "steps": 0,
                    "init_from": recipe.init_from,
                    "eval": recipe.evaluate(),
                }
            )
            if recipe.acc.is_main_process:
                atomic_write_json(recipe.out / "eval_only.json", results[-1])
            recipe.cleanup()
            continue
        results.append(recipe.train())
        if recipe.acc.is_main_process:
            # what export ships: the stage's best/ by the held-out score (the decoder's chain τ),
            # else its final/
            final, best = Path(cfg.run) / cfg.train_dir / cfg.lang / "final", recipe.out / "best"
            with atomic_directory(final, overwrite=True) as tmp:
                shutil.copytree(
                    best if (best / "model.safetensors").is_file() else recipe.out / "final",
                    tmp,
                    dirs_exist_ok=True,
                )
        recipe.acc.wait_for_everyone()
        recipe.cleanup()
    return results


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="train/drafter.py", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=False, help="configs/train/<recipe>.yaml")
    ap.add_argument("overrides", nargs="*", help="key.path=value (e.g. lang=vi stage=finetune)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    cfg = load_config(TrainConfig, args.config, args.overrides)
    results = run(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(results, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
