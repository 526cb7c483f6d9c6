"""Corpus sources behind one interface: ``documents(source, lang, run) -> iterator of texts``.

- ``fineweb2`` / ``wikipedia``: ``datasets`` streaming (``load_dataset(dataset, name=config,
  split=split, streaming=True)``) of the language's configured dataset and config (FineWeb-2,
  English: FineWeb; Wikipedia ``20231101.<code>``); ``dataset`` names another repo or a local
  snapshot folder laid out like it (same call, offline), ``path`` a local folder of files with the
  same schema instead (read as ``files``). Nothing is downloaded unless the hub is reachable;
  ``max_tokens`` stops the stream (vocab.count).
- ``files``: local txt / parquet (a file, glob or folder) read through ``datasets``; jsonl through
  :func:`polyspec.io.read_jsonl` (a torn or malformed line is skipped and counted, not fatal).
- ``synth``: the text of the run's synth output (``<run>/synth/<lang>*/data.jsonl``: Alg. 1 pairs
  and the distilled answers), read the same way; the held-out answers (``<lang>-heldout``,
  ``<lang>-heldout-chat``) are never counted.
- ``wordfreq``: not running text. :func:`wordfreq_items` gives (text, weight) pairs — each word with
  and without a leading space, weighted by the word's frequency — an *approximation* of running-text
  counts (no context effects, no punctuation, numbers or markup).
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterator
from pathlib import Path

from polyspec.errors import PolyspecError, first_line
from polyspec.io import read_jsonl
from polyspec.languages import Language
from vocab.config import SourceConfig

_SPACELESS_SCRIPTS = {"Hani", "Hans", "Hant", "Jpan", "Thai", "Khmr", "Laoo", "Mymr"}


def documents(src: SourceConfig, lang: Language, run: str | Path) -> Iterator[str]:
    """Texts of one source for one language, in a stable order."""
    if src.name in ("fineweb2", "wikipedia"):
        ref = lang.fineweb2 if src.name == "fineweb2" else lang.wikipedia
        field = src.text_field or ref.text_field
        if src.path:
            yield from _dataset_texts(_load_local(src.path.format(lang=lang.code)), field, src.path)
        else:
            dataset = src.dataset or ref.dataset
            yield from _dataset_texts(
                _load_hub(dataset, ref.config, ref.split), field, f"{dataset}/{ref.config}"
            )
    elif src.name == "files":
        if not src.path:
            raise PolyspecError(
                "source 'files' needs a path (txt, jsonl or parquet file, glob or folder)"
            )
        yield from _dataset_texts(
            _load_local(src.path.format(lang=lang.code)), src.text_field or "text", src.path
        )
    elif src.name == "synth":
        paths = sorted(glob.glob(str(Path(run) / "synth" / f"{lang.code}*" / "data.jsonl")))
        # never counted: the held-out answers (<lang>-heldout, <lang>-heldout-chat)
        for path in [p for p in paths if "-heldout" not in Path(p).parent.name]:
            for rec in read_jsonl(path):
                yield "\n".join(
                    t["value"]
                    for t in rec.get("conversations", [])
                    if isinstance(t.get("value"), str)
                )
    else:
        raise PolyspecError(
            f"source {src.name!r} yields no documents (wordfreq is counted from word lists)"
        )


_CASED_SCRIPTS = {"Latn", "Cyrl", "Grek", "Armn"}
_WORD = re.compile(r"[^\W\d_]+")


def seed_capital_share(lang: Language) -> float:
    """Share of the words of the language's human-written seeds (system prompt, few-shot pairs) that
    start with a capital: ~0.1 where only sentence starts and names are capitalised (en 0.12, vi
    0.08), 0.34 in German, whose nouns all are; 0 for scripts without case."""
    if lang.script not in _CASED_SCRIPTS:
        return 0.0
    words = [
        w
        for t in [lang.system_prompt, *(x for s in lang.seeds for x in (s.instruction, s.response))]
        for w in _WORD.findall(t)
    ]
    return sum(w[0].isupper() for w in words) / len(words) if words else 0.15


def wordfreq_items(
    lang: Language, space_share: float, capital_share: float | None = None
) -> list[tuple[str, float]]:
    """(text, weight) pairs: every listed word of the language, in the forms it takes in running
    text.

    wordfreq lists are lower-cased and unspaced; in running text a word mostly follows a space and
    is sometimes capitalised (sentence starts, names, German nouns: ``capital_share``, default
    :func:`seed_capital_share`). Scripts without spaces keep the bare form.
    """
    import wordfreq

    try:
        freqs = wordfreq.get_frequency_dict(lang.wordfreq, wordlist="best")
    except (LookupError, ValueError):
        raise PolyspecError(
            f"wordfreq has no frequency list for {lang.code!r} ({lang.wordfreq})"
        ) from None
    if lang.script in _SPACELESS_SCRIPTS:
        return list(freqs.items())
    if lang.script not in _CASED_SCRIPTS:
        cap = 0.0
    else:
        cap = seed_capital_share(lang) if capital_share is None else capital_share
    items = []
    for word, f in freqs.items():
        forms = [(word, 1.0 - cap)] + (
            [(word[:1].upper() + word[1:], cap)] if cap and word[:1].islower() else []
        )
        for form, share in forms:
            items.append((" " + form, f * space_share * share))
            items.append((form, f * (1.0 - space_share) * share))
    return items


def _load_local(path: str):
    p = Path(path)
    if p.is_dir():
        files = sorted(
            str(f) for f in p.rglob("*") if f.suffix in (".parquet", ".jsonl", ".json", ".txt")
        )
    else:
        files = sorted(glob.glob(path))
    if not files:
        raise PolyspecError(f"no txt/jsonl/parquet files at {path}")
    files = [f for f in files if Path(f).stat().st_size > 0]
    if not files:
        raise PolyspecError(f"empty corpus: every file at {path} is empty")
    kinds = {Path(f).suffix for f in files}
    if len(kinds) > 1:
        raise PolyspecError(f"{path}: mixed file kinds {sorted(kinds)}; point at one kind")
    kind = kinds.pop()
    # the shared tolerant reader: a torn line (an interrupted download or write) is skipped
    if kind == ".jsonl":
        return (rec for f in files for rec in read_jsonl(f))
    from datasets import load_dataset  # jsonl needs no datasets (the GPU image has none)

    builder = {".parquet": "parquet", ".json": "json", ".txt": "text"}[kind]
    return load_dataset(builder, data_files=files, split="train", streaming=True)


def _load_hub(dataset: str, config: str, split: str):
    from datasets import load_dataset

    try:
        return load_dataset(dataset, name=config, split=split, streaming=True)
    except Exception as e:  # noqa: BLE001 - offline, gated, missing config: one line for the user
        raise PolyspecError(
            f"cannot stream {dataset} ({config}): {first_line(e)}; offline, use SOURCES=wordfreq "
            "or files"
        ) from None


def _dataset_texts(ds, field: str, where: str) -> Iterator[str]:
    for rec in ds:
        if field not in rec:
            raise PolyspecError(
                f"{where}: records have no {field!r} field (fields: {', '.join(rec)})"
            )
        text = rec[field]
        if isinstance(text, str) and text:
            yield text
