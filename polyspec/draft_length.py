"""The choice of a draft length from predicted speeds, shared by the decoder's γ calibration
(UNISPEC, ``decoder.calibrate.run.choose``: predicted tokens/s on this device) and an engine's
``draft_n`` (``engines.draft_length.choose``: predicted speedup over plain decoding in the engine).
Each caller predicts its own speeds; the rule that picks a length from them is this one: the
shortest length predicted within ``tolerance`` of the best, overruled by a measured best when the
predicted pick measured more than 5 % slower than it.
"""

from __future__ import annotations

from typing import NamedTuple

# Predicted speeds closer than this count as equal, and the shortest such length is chosen (cheaper,
# and as fast within the noise): on the 2-core CPU verify(k)/forward(1) moved by up to 0.05 between
# two calibrations of one bundle (a calibration's ``curve_noise`` records its pass-to-pass spread),
# which moves predictions by a few per cent, and the pick with them where the optimum is flat.
TOLERANCE = 0.02


class LengthChoice(NamedTuple):
    length: int  # the chosen draft length
    predicted: int  # the shortest length predicted within the tolerance of the best
    # the measurements overruled the prediction (``length`` is then the best measured)
    overruled: bool


def shortest_within(speeds: dict[int, float], tolerance: float) -> int:
    """The shortest length whose speed is within ``tolerance`` (a fraction) of the best of
    ``speeds`` {length: speed}."""
    best = max(speeds.values())
    return min(k for k, s in speeds.items() if s >= (1 - tolerance) * best)


def choose_length(
    predicted: dict[int, float], tolerance: float, measured: dict[int, float] | None = None
) -> LengthChoice:
    """The length to run from ``predicted`` speeds {length: speed} (:func:`shortest_within`
    ``tolerance``), or the best of ``measured`` speeds {length: speed} (the first of equal ones)
    when the predicted pick was measured and ran more than 5 % slower than that best."""
    k = shortest_within(predicted, tolerance)
    if measured:
        top = max(measured, key=measured.get)
        if k in measured and measured[k] < 0.95 * measured[top]:
            return LengthChoice(top, k, True)
    return LengthChoice(k, k, False)
