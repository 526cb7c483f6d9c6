"""train's drafter models are public, in :mod:`polyspec.drafter_models` (export and decoder load them too);
this module keeps ``from train.models import …`` working."""

from polyspec.drafter_models import (
    DRAFTER_FORMAT,
    Eagle3Drafter,
    EagleDrafter,
    build_small_lm,
    copy_target_layer,
    eagle_layer_config,
    load_drafter,
    project_embedding,
    save_drafter,
)

__all__ = ["DRAFTER_FORMAT", "Eagle3Drafter", "EagleDrafter", "build_small_lm", "copy_target_layer",
           "eagle_layer_config", "load_drafter", "project_embedding", "save_drafter"]
