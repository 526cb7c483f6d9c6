"""Benchmark: drafter training throughput — the recipe's own optimizer step, timed without
evaluations or checkpoints.

    python -m train.bench --config configs/train/eagle-cpu.yaml run=runs/demo lang=vi stage=finetune
        [--steps 30] [--warmup 3] [--json out.json] [key.path=value …]

Builds the stage exactly as ``train/drafter.py`` does (same data, batches, features path, drafter,
optimizer), runs ``--warmup`` steps, then times ``--steps`` optimizer steps of
:meth:`DrafterRecipe.train_step` and prints tokens/s (every token of the batches, as the training
log counts them), loss tokens/s, ms per step and the batches' padding. Nothing is trained for keeps
and nothing is written into the run: no checkpoint is resumed or saved, no held-out answers are
made, no drafter folder, no tracker.
"""

from __future__ import annotations

import argparse
import time

import torch

from polyspec.config import load_config
from polyspec.errors import PolyspecError, cli_entry
from polyspec.io import atomic_write_json
from train.config import TrainConfig
from train.recipe import DrafterRecipe


class _Counting:
    """The recipe's batch stream, counting the loss tokens and the padded positions it hands out
    (the tokens themselves are what ``train_step`` returns)."""

    def __init__(self, stream):
        self.stream, self.loss, self.padded = stream, 0, 0

    def __iter__(self):
        return self

    def __next__(self):
        b = next(self.stream)
        self.loss += int(b["loss_mask"].sum())
        self.padded += b["attention_mask"].numel()
        return b


def measure(recipe: DrafterRecipe, steps: int, warmup: int) -> dict:
    stream = _Counting(recipe.batches())
    for _ in range(warmup):  # first shapes build their kernels (oneDNN, CUDA)
        recipe.train_step(stream)
    stream.loss = stream.padded = 0
    sync = torch.cuda.synchronize if recipe.acc.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    # every process's, as the training log counts
    tokens = sum(recipe.train_step(stream)[2] for _ in range(steps))
    sync()
    dt = time.perf_counter() - t0
    procs = recipe.acc.num_processes
    return {
        "steps": steps,
        "seconds": round(dt, 6),
        "ms_per_step": round(1000 * dt / steps, 1),
        "tokens": tokens,
        "loss_tokens": stream.loss * procs,
        "tokens_per_s": round(tokens / dt, 1),
        "loss_tokens_per_s": round(stream.loss * procs / dt, 1),
        "padding": round(1 - tokens / procs / max(stream.padded, 1), 3),
    }


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.bench", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--config", default=None, help="configs/train/<recipe>.yaml (as train/drafter.py)"
    )
    ap.add_argument("--steps", type=int, default=30, help="timed optimizer steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps first")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument(
        "overrides",
        nargs="*",
        help="key.path=value, as for train/drafter.py (stage=finetune default)",
    )
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        raise PolyspecError("--steps must be ≥ 1 and --warmup ≥ 0")
    cfg = load_config(
        TrainConfig, args.config, ["stage=finetune", *args.overrides, "report_to=none"]
    )
    if cfg.stage == "both":
        raise PolyspecError("name one stage: stage=pretrain or stage=finetune")
    recipe = DrafterRecipe(cfg, cfg.stage)
    recipe.setup(timing_only=True)
    result = {
        "lang": cfg.lang,
        "stage": cfg.stage,
        "drafter": cfg.drafter_kind.value,
        "features": cfg.features,
        "device": str(recipe.acc.device),
        "threads": torch.get_num_threads(),
        "mixed_precision": recipe.acc.mixed_precision,
        "batch_size": cfg.optim.batch_size,
        "grad_accum": cfg.optim.grad_accum,
        "processes": recipe.acc.num_processes,
        "train_examples": len(recipe.train_set),
        **measure(recipe, args.steps, args.warmup),
    }
    recipe.cleanup()
    if recipe.acc.is_main_process:
        print(
            f"{result['lang']}/{result['stage']} {result['drafter']} ({result['features']} "
            "features, "
            f"{result['device']}, {result['threads']} threads, mixed precision "
            f"{result['mixed_precision']}): "
            f"{result['tokens_per_s']:.0f} tok/s ({result['loss_tokens_per_s']:.0f} loss tok/s), "
            f"{result['ms_per_step']} ms/step over {result['steps']} steps, padding "
            f"{100 * result['padding']:.0f} %"
        )
        if args.json:
            atomic_write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
