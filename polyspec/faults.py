"""Crash points for the kill-and-resume tests: a stage calls :func:`maybe_kill` where a crash hurts
most, and an environment variable makes the process SIGKILL itself there. Unset (normal use),
nothing happens.

    POLYSPEC_TEST_KILL_AT_STEP=k     train: once optimizer step k is logged (before its checkpoint)
    POLYSPEC_TEST_KILL_AT_COMMIT=k   synth: during the k-th commit, after data.jsonl got its lines
                                     and half a torn line, before rejected.jsonl and the commit
                                     point
"""

from __future__ import annotations

import os
import signal
from typing import IO

KILL_AT = {"step": "POLYSPEC_TEST_KILL_AT_STEP", "commit": "POLYSPEC_TEST_KILL_AT_COMMIT"}


def maybe_kill(point: str, count: int, torn: IO[str] | None = None) -> None:
    """SIGKILL this process when ``count`` is the number the environment names for ``point`` (see
    above). ``torn``: an open text file that first gets half a JSON line, as a writer killed
    mid-line leaves it."""
    at = os.environ.get(KILL_AT[point])
    if not at or int(at) != count:
        return
    if torn is not None:
        torn.write('{"torn": ')
        torn.flush()
    os.kill(os.getpid(), signal.SIGKILL)
