"""Language registry: ``configs/languages/<code>.yaml``, the one place stages learn about a
language.

Each entry carries the ISO-639-1 code, the fastText label, FineWeb-2 / Wikipedia dataset configs,
the wordfreq code, the script, the language-ID threshold, and a human-written system prompt with
few-shot (instruction, response) seeds in the language (ADASPEC Alg. 1 inputs). Built in: en de fr
es zh ja vi.

CLI::

    python -m polyspec.languages list
    python -m polyspec.languages show vi
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from polyspec.config import StrictModel, read_yaml, validate
from polyspec.errors import PolyspecError, cli_entry
from polyspec.paths import cache_dir, configs_dir

DEFAULT_LANGUAGE = "vi"
TASKS = ("qa", "math", "code", "summarization", "translation", "advice", "rag", "multi-turn")


class DatasetRef(StrictModel):
    """A Hugging Face dataset + config streamed with ``datasets`` by online users."""

    dataset: str
    config: str
    split: str = "train"
    text_field: str = "text"


class Seed(StrictModel):
    task: Literal[TASKS]  # type: ignore[valid-type]
    instruction: str = Field(min_length=1)
    response: str = Field(min_length=1)


class Language(StrictModel):
    code: str = Field(description="ISO-639-1 code")
    name: str
    native_name: str
    fasttext_label: str = Field(description="label of the fastText lid.176 model, e.g. __label__vi")
    script: str = Field(description="ISO-15924 script code, e.g. Latn, Hani, Jpan")
    wordfreq: str = Field(description="wordfreq language code")
    fineweb2: DatasetRef = Field(description="FineWeb-2 config (English: FineWeb)")
    wikipedia: DatasetRef
    lid_threshold: float = Field(
        0.5, ge=0.0, le=1.0, description="min fastText probability to keep a pair"
    )
    system_prompt: str = Field(min_length=1)
    seeds: list[Seed] = Field(min_length=5)
    translation: dict | None = Field(
        None, description="set when the target translated this entry (synth)"
    )

    @field_validator("fasttext_label")
    @classmethod
    def _label_prefix(cls, v: str) -> str:
        if not v.startswith("__label__"):
            raise ValueError("must start with __label__")
        return v

    @property
    def lid_code(self) -> str:
        """The bare fastText label (``vi`` for ``__label__vi``)."""
        return self.fasttext_label.removeprefix("__label__")


def builtin_codes() -> list[str]:
    return sorted(p.stem for p in (configs_dir() / "languages").glob("*.yaml"))


@functools.lru_cache(maxsize=64)
def _load(code: str) -> Language:
    path = configs_dir() / "languages" / f"{code}.yaml"
    lang = validate(Language, read_yaml(path), source=str(path))
    if lang.code != code:
        raise PolyspecError(f"{path}: code {lang.code!r} does not match the file name")
    return lang


def is_valid_code(code: str) -> bool:
    """A two-letter ISO-639-1 code that langcodes knows (e.g. ``sw``), built in or not."""
    import langcodes

    return (
        len(code) == 2
        and code.isalpha()
        and langcodes.tag_is_valid(code)
        and langcodes.Language.get(code).is_valid()
    )


def derived_metadata(code: str) -> dict:
    """Registry fields of a language that is not built in, derived from its ISO code (no
    prompt/seeds)."""
    import langcodes

    lang = langcodes.Language.get(code)
    script = lang.maximize().script or "Latn"
    return {
        "code": code,
        "name": lang.display_name(),
        "native_name": lang.autonym(),
        "fasttext_label": f"__label__{code}",
        "script": script,
        "wordfreq": code,
        "fineweb2": {
            "dataset": "HuggingFaceFW/fineweb-2",
            "config": f"{lang.to_alpha3()}_{script}",
        },
        "wikipedia": {"dataset": "wikimedia/wikipedia", "config": f"20231101.{code}"},
        "lid_threshold": 0.5,
    }


def translated_path(code: str, target_name: str) -> Path:
    """Where the synth stage caches a language translated by ``target_name`` (ADASPEC Alg. 1 lines
    2–10)."""
    return cache_dir() / "languages" / target_name.replace("/", "--") / f"{code}.yaml"


def get_language(code: str, target: str | None = None) -> Language:
    """Registry entry for ``code``: built in, or translated earlier by ``target`` (synth stage).

    Anything else is a one-line error listing the supported codes.
    """
    code = (code or "").strip().lower()
    if code in builtin_codes():
        return _load(code)
    if target and is_valid_code(code) and translated_path(code, target).is_file():
        path = translated_path(code, target)
        return validate(Language, read_yaml(path), source=str(path))
    if is_valid_code(code):
        raise PolyspecError(
            f"language {code!r} is not built in (built in: {', '.join(builtin_codes())}); "
            f"`make synth LANG={code}` translates the English seeds with the target first"
        )
    raise PolyspecError(
        f"unsupported language {code!r}; supported: {', '.join(builtin_codes())} or any ISO-639-1 "
        "code via synth"
    )


def parse_languages(spec: str | list[str]) -> list[Language]:
    """``"vi,de,ja"`` or ``["vi", "de"]`` -> registry entries (order kept, duplicates refused)."""
    codes = [c.strip() for c in (spec.split(",") if isinstance(spec, str) else spec) if c.strip()]
    if not codes:
        raise PolyspecError(f"no language given; supported: {', '.join(builtin_codes())}")
    if len(set(codes)) != len(codes):
        raise PolyspecError(f"language list {codes} has duplicates")
    return [get_language(c) for c in codes]


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m polyspec.languages", description="Inspect the language registry."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    show = sub.add_parser("show")
    show.add_argument("code")
    check = sub.add_parser("check", help="validate a comma-separated list of codes")
    check.add_argument("codes")
    args = ap.parse_args(argv)
    if args.cmd == "check":  # built-in codes, or valid ISO codes that synth will translate
        codes = [c.strip().lower() for c in args.codes.split(",") if c.strip()]
        unknown = [c for c in codes if c not in builtin_codes() and not is_valid_code(c)]
        if not codes:
            parse_languages(args.codes)  # raises the one-line error
        if unknown:
            get_language(unknown[0])  # raises the one-line error
        return 0
    if args.cmd == "list":
        for c in builtin_codes():
            lang = get_language(c)
            print(
                f"{c}  {lang.name:11s} {lang.script:5s} {lang.fineweb2.config:12s} "
                f"{len(lang.seeds)} seeds"
            )
        return 0
    lang = get_language(args.code)
    print(lang.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
