"""One error type for everything a user can get wrong, and the CLI wrapper that prints it as one
line."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., int | None])


class PolyspecError(Exception):
    """A problem the user can fix (bad name, missing file, mismatched tokenizer...).

    CLIs print ``error: <message>`` on one line and exit with status 2, without a traceback.
    """


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def cli_entry(fn: F) -> F:
    """Wrap a CLI ``main``: PolyspecError -> one line on stderr and exit 2; Ctrl-C -> exit 130.

    Set ``POLYSPEC_TRACEBACK=1`` to see the full traceback instead.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PolyspecError as e:
            if os.environ.get("POLYSPEC_TRACEBACK"):
                raise
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise SystemExit(130) from None

    return wrapper  # type: ignore[return-value]
