"""Resumable training state of one stage: ``<run>/<train_dir>/<lang>/<stage>/checkpoint-<step>/``.

``accelerator.save_state`` writes the model, the optimizer (DeepSpeed's own sharded files under
ZeRO) and every process's RNG; ``trainer_state.json`` follows, written last, so a folder without it
is incomplete and never resumed from. It holds the layout, the step (= the data position:
``train.data.step_indices``), the best held-out score, the scheduler, the config hash — a resume
with another config, other data or another process layout is refused — and the stage's progress
(tokens read and seconds trained over every launch so far), so a resumed stage reports its whole
run. A damaged file is a one-line error naming it.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

from safetensors import safe_open

from polyspec.errors import PolyspecError, first_line
from polyspec.io import atomic_write_json
from train.config import LK_ETA

# 2: accelerate's save_state + trainer_state.json (1: hand-written model/optimizer/RNG files)
CHECKPOINT_LAYOUT = 2
TRAINER_STATE = "trainer_state.json"
# options added after checkpoints were written, hashed only when off their defaults: a checkpoint
# written before them (the same training) still resumes
_HASHED_OFF_DEFAULT = {"eagle": {"token_loss": "kl", "lk_eta": LK_ETA}}
# what a truncated or overwritten checkpoint file raises from torch.load / pickle / accelerate
_DAMAGE = (OSError, RuntimeError, ValueError, EOFError, KeyError, pickle.UnpicklingError)


def config_hash(
    cfg,
    stage: str,
    tokenizer_sha256: str,
    vocab_meta: dict,
    data_files: list[str],
    init_from: str | None,
    acc,
) -> str:
    """What a checkpoint must agree with to be resumed: the config (without logging/checkpointing
    options), the stage, the tokenizer, the draft vocabulary, the data files (and sizes), the
    starting weights and the process layout."""
    relevant = cfg.model_dump(
        exclude={"report_to", "log_every", "checkpoint_every", "keep_checkpoints", "device"}
    )
    for section, defaults in _HASHED_OFF_DEFAULT.items():
        for key, default in defaults.items():
            if relevant[section].get(key, default) == default:
                relevant[section].pop(key, None)
    relevant.update(
        stage=stage,
        tokenizer=tokenizer_sha256,
        vocab=vocab_meta,
        data_files=[(p, Path(p).stat().st_size) for p in data_files],
        init_from=init_from,
        processes=acc.num_processes,
        distributed=str(acc.distributed_type),
        zero_stage=getattr(acc.state.deepspeed_plugin, "zero_stage", None),
    )
    return hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode()).hexdigest()[
        :16
    ]


def checkpoints(out: Path) -> list[Path]:
    """The stage's complete checkpoints (with ``trainer_state.json``), oldest first."""
    found = sorted(Path(out).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return [c for c in found if (c / TRAINER_STATE).is_file()]


def save_checkpoint(
    acc,
    out: Path,
    step: int,
    best: float,
    scheduler,
    cfg_hash: str,
    keep: int,
    progress: dict | None = None,
) -> Path:
    """``accelerator.save_state`` (every process takes part), then ``trainer_state.json``; keeps the
    last ``keep``."""
    ck = Path(out) / f"checkpoint-{step}"
    if acc.is_main_process:
        # a save torn by a crash before a resume re-reached this step
        shutil.rmtree(ck, ignore_errors=True)
    acc.wait_for_everyone()
    acc.save_state(str(ck))  # collective under DeepSpeed: every process saves its shard
    acc.wait_for_everyone()
    if acc.is_main_process:
        atomic_write_json(
            ck / TRAINER_STATE,
            {
                "layout": CHECKPOINT_LAYOUT,
                "step": step,
                "best": best,
                "scheduler": scheduler.state_dict(),
                "config_hash": cfg_hash,
                "progress": progress,
            },
        )
        for old in checkpoints(out)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()
    return ck


def resume(acc, out: Path, scheduler, cfg_hash: str) -> tuple[Path, int, float, dict | None] | None:
    """Load the latest checkpoint into the prepared model/optimizer (``acc``) and ``scheduler``:
    → (its folder, step, best held-out score, progress: ``{"tokens", "seconds"}`` so far or None
    for a checkpoint written before it was kept), or None when the stage has none."""
    found = checkpoints(out)
    if not found:
        return None
    ck = found[-1]
    state = _trainer_state(ck)
    if state.get("layout") != CHECKPOINT_LAYOUT:
        raise PolyspecError(
            f"{ck} is in an older checkpoint layout; use another RUN or delete {out}"
        )
    if state.get("config_hash") != cfg_hash:
        raise PolyspecError(
            f"{ck} was written with another config or data; use another RUN or delete {out}"
        )
    # the header names a damaged file before accelerate reads it
    for weights in sorted(ck.rglob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt"):
                pass
        # safetensors raises its own error type on a damaged file
        except Exception as e:  # noqa: BLE001
            raise _corrupt(weights, e, ck) from None
    try:
        # model, optimizer (DeepSpeed: this process's shard), this process's RNG
        acc.load_state(str(ck))
    except _DAMAGE as e:
        raise _corrupt(ck, e, ck) from None
    scheduler.load_state_dict(state["scheduler"])
    return ck, int(state["step"]), float(state["best"]), state.get("progress")


def _trainer_state(ck: Path) -> dict[str, Any]:
    path = ck / TRAINER_STATE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise _corrupt(path, e, ck) from None
    if not isinstance(state, dict):
        raise _corrupt(path, ValueError(f"a JSON {type(state).__name__}, not an object"), ck)
    return state


def _corrupt(path: Path, e: BaseException, ck: Path) -> PolyspecError:
    return PolyspecError(
        f"corrupt checkpoint {path}: {first_line(e)}; delete {ck} and rerun train "
        "(it resumes from the checkpoint before)"
    )
