"""What kind of drafter a model, a drafter folder's ``config.json`` or a train recipe holds:
EAGLE-1, EAGLE-3 or a small LM (``polyspec.drafter_models``). Code compares kinds; the strings stay
on disk only: a drafter ``config.json``'s ``drafter_type`` ("eagle", "small-lm") and ``arch``
("eagle3"; absent for EAGLE-1), a train recipe's ``drafter_type`` and ``eagle.arch`` ("eagle1",
"eagle3"). Light (no torch), so configs may import it.
"""

from __future__ import annotations

from enum import Enum


class DrafterKind(str, Enum):
    """A kind's value is its name on disk; ``str()`` and f-strings give that name on every Python
    version."""

    # fc over [embedding ‖ last target feature]; the target's head restricted to the top-s ids
    EAGLE1 = "eagle1"
    # three target layers fused; its own head over the draft vocabulary (the form engines load)
    EAGLE3 = "eagle3"
    SMALL_LM = "small-lm"  # a tiny causal LM with the target's tokenizer

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, drafter) -> DrafterKind:
        """A drafter model's kind (a DDP wrapper's ``module`` unwrapped): its class's ``arch_name``;
        a model without one (a small LM, or no drafter: None) is ``SMALL_LM``."""
        return cls(getattr(getattr(drafter, "module", drafter), "arch_name", cls.SMALL_LM))

    @classmethod
    def of_config(cls, cfg: dict) -> DrafterKind | None:
        """A drafter ``config.json``'s kind: ``drafter_type`` eagle is EAGLE-3 when its ``arch``
        says so, else EAGLE-1; None for a ``drafter_type`` polyspec does not know."""
        kind = cfg.get("drafter_type")
        if kind == "eagle":
            return cls.EAGLE3 if cfg.get("arch") == cls.EAGLE3.value else cls.EAGLE1
        return cls.SMALL_LM if kind == cls.SMALL_LM.value else None
