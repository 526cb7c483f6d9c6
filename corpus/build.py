"""The corpus stage: general text per language for the drafters' pretrain (Yi et al. 2024's P step
reads C4 + ShareGPT; here, offline, Debian's translated documentation). Per language, source by
source:

1. fetch the source (a Debian package, unpacked once into the cache; or a local folder) — one line
   and on without it where it cannot be had;
2. read each file's paragraphs (``corpus.extract``: HTML, roff man pages, plain text / reST);
3. keep a paragraph when it is long enough (``min_chars``; ``min_chars_cjk`` for ja/zh), fastText
   says it is in the language (``polyspec.lid``; per paragraph, since translated pages keep
   untranslated strings), and it was not kept before (exact match after case and space folding,
   across every source of the language);
4. cut a file's kept paragraphs into documents of at most ``max_doc_chars``.

Files (``<run>/corpus/<lang>/``):
- ``parts/<source>.jsonl``: that source's documents, written atomically when the source is done (a
  rerun reuses it while the filter and the sources up to it are unchanged);
- ``data.jsonl``: every document, ``{"id", "lang", "source", "text", "tokens"}`` (``tokens``: under
  the target's tokenizer, no special tokens), the sources taken in turns (one document of each, in
  config order), so that any first N tokens mix every source; cut at ``max_tokens`` — what ``train``
  reads as plain text (``data.pretrain``), ``vocab``'s ``files`` source counts, and
  ``python -m corpus prefill`` reads (its first ``--max-tokens``);
- ``manifest.json``: documents, characters and target tokens, per source its package, version,
  licence, files, paragraphs kept and dropped (short, language, duplicate), and the sources that
  could not be had, with why.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from itertools import chain, zip_longest
from pathlib import Path

from tqdm import tqdm

from corpus import extract, sources
from corpus.config import CorpusConfig, SourceConfig
from polyspec.errors import PolyspecError
from polyspec.io import atomic_write_json, atomic_write_text, read_jsonl
from polyspec.languages import Language, get_language
from polyspec.paths import cache_dir

CJK = ("Jpan", "Hani", "Hans", "Hant", "Kore")


def document_ids(
    tokenizer, docs: list[dict], batch: int = 1000
) -> Iterator[tuple[dict, list[int]]]:
    """(document, its target token ids without special tokens), encoded in batches by the Rust
    tokenizer."""
    backend = tokenizer.backend_tokenizer
    for i in range(0, len(docs), batch):
        part = docs[i : i + batch]
        yield from zip(
            part,
            (
                e.ids
                for e in backend.encode_batch([d["text"] for d in part], add_special_tokens=False)
            ),
        )


def _key(paragraph: str) -> bytes:
    return hashlib.blake2b(" ".join(paragraph.split()).casefold().encode(), digest_size=12).digest()


def _files(root: Path, globs: list[str], exclude: list[str]) -> list[Path]:
    found = {p for g in globs for p in root.glob(g) if p.is_file()}
    return sorted(p for p in found if not any(x in str(p.relative_to(root)) for x in exclude))


def _documents(paragraphs: list[str], max_chars: int) -> Iterator[str]:
    doc: list[str] = []
    size = 0
    for p in paragraphs:
        if doc and size + len(p) > max_chars:
            yield "\n\n".join(doc)
            doc, size = [], 0
        doc.append(p)
        size += len(p) + 2
    if doc:
        yield "\n\n".join(doc)


class ParagraphFilter:
    """Step 3: length, language and first occurrence; counts what it drops."""

    def __init__(
        self,
        lang: Language,
        min_chars: int,
        threshold: float,
        identify: Callable[[str], tuple[str, float]],
    ):
        self.code, self.min_chars, self.threshold, self.identify = (
            lang.lid_code,
            min_chars,
            threshold,
            identify,
        )
        self.seen: set[bytes] = set()
        self.counts = {"paragraphs": 0, "kept": 0, "short": 0, "language": 0, "duplicate": 0}

    def __call__(self, p: str) -> bool:
        self.counts["paragraphs"] += 1
        if len(p) < self.min_chars:
            self.counts["short"] += 1
            return False
        key = _key(p)
        if key in self.seen:
            self.counts["duplicate"] += 1
            return False
        label, prob = self.identify(p)
        if label != self.code or prob < self.threshold:
            self.counts["language"] += 1
            return False
        self.seen.add(key)
        self.counts["kept"] += 1
        return True


def _locate(src: SourceConfig, lang: str, cache: Path) -> tuple[Path, dict]:
    """Step 1: the folder holding the source's files for ``lang``, and what the manifest says of
    it."""
    where = src.location(lang)
    if src.kind == "folder":
        root = Path(where)
        if not root.is_dir():
            raise sources.SourceMissing(f"folder {root} not found")
        return root, {"folder": str(root), "licence": src.licence}
    root = sources.unpacked(where, cache)
    return root, {
        "package": where,
        "version": sources.version(where, root),
        "licence": sources.licence(where, root) or src.licence,
    }


def build_source(
    src: SourceConfig,
    lang: Language,
    cache: Path,
    keep: ParagraphFilter,
    max_doc_chars: int,
    log: Callable[[str], None],
) -> tuple[list[dict], dict]:
    """Steps 1–4 for one source: its documents and its manifest entry (``SourceMissing`` where it
    cannot be had)."""
    root, info = _locate(src, lang.code, cache)
    files = _files(root, src.paths[lang.code], src.exclude)
    before = dict(keep.counts)
    docs = []
    for f in tqdm(
        files, desc=f"corpus {lang.code} {src.name}", unit="file", leave=False, mininterval=2.0
    ):
        kept = [p for p in extract.blocks(f, src.format) if keep(p)]
        rel = f.relative_to(root).as_posix()
        docs += [
            {"id": f"{src.name}:{rel}#{k}", "lang": lang.code, "source": src.name, "text": text}
            for k, text in enumerate(_documents(kept, max_doc_chars))
        ]
    counts = {k: keep.counts[k] - before[k] for k in keep.counts}
    log(
        f"corpus {lang.code}: {src.name}: {len(files)} files, {counts['kept']:,} of "
        f"{counts['paragraphs']:,} "
        f"paragraphs kept, {len(docs):,} documents"
    )
    return docs, {**info, "files": len(files), **counts, "documents": len(docs)}


def build_language(
    cfg: CorpusConfig, code: str, tokenizer, log: Callable[[str], None] = print
) -> dict:
    """The whole stage for one language; returns its manifest."""
    from polyspec.lid import identify

    lang = get_language(code)
    out = Path(cfg.run) / "corpus" / code
    cache = Path(cfg.cache) if cfg.cache else cache_dir() / "corpus"
    min_chars = cfg.min_chars_cjk if lang.script in CJK else cfg.min_chars
    keep = ParagraphFilter(
        lang,
        min_chars,
        cfg.lid_threshold if cfg.lid_threshold is not None else lang.lid_threshold,
        identify,
    )
    t0 = time.time()
    per_source, missing, parts = {}, {}, []
    # a source's part depends on the filter and, through the duplicates it drops, on every source
    # before it: it is reused only where that whole prefix is what built it (a resumed corpus equals
    # one built in one go)
    prefix = hashlib.sha256(json.dumps([min_chars, keep.threshold, cfg.max_doc_chars]).encode())
    for src in cfg.sources:
        if src.location(code) is None:
            continue
        prefix.update(src.model_dump_json().encode())
        part = out / "parts" / f"{src.name}.jsonl"
        done = out / "parts" / f"{src.name}.json"
        info = (
            json.loads(done.read_text(encoding="utf-8"))
            if done.is_file() and part.is_file()
            else {}
        )
        if info.get("settings") == prefix.hexdigest():  # resumed: its paragraphs count as seen
            got = list(read_jsonl(part))
            for d in got:
                keep.seen.update(_key(p) for p in d["text"].split("\n\n"))
        else:
            try:
                got, info = build_source(src, lang, cache, keep, cfg.max_doc_chars, log)
            except sources.SourceMissing as e:
                log(f"corpus {code}: {src.name} skipped: {e}")
                missing[src.name] = str(e)
                prefix.update(b"missing")
                continue
            info["settings"] = prefix.hexdigest()
            atomic_write_text(part, "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in got))
            atomic_write_json(done, info)
        per_source[src.name] = info
        parts.append(got)
    # the sources in turns
    docs = [d for d in chain.from_iterable(zip_longest(*parts)) if d is not None]
    if not docs:
        raise PolyspecError(
            f"corpus {code}: no document from any source"
            + (f" ({'; '.join(missing.values())})" if missing else "")
        )
    return _write(cfg, out, code, docs, per_source, missing, tokenizer, time.time() - t0, log)


def _write(
    cfg: CorpusConfig,
    out: Path,
    code: str,
    docs: list[dict],
    per_source: dict,
    missing: dict,
    tokenizer,
    seconds: float,
    log: Callable[[str], None],
) -> dict:
    """Target tokens per document, the ``max_tokens`` cut (whole documents), ``data.jsonl`` and
    ``manifest.json``."""
    total, kept = 0, []
    for d, ids in document_ids(tokenizer, docs):
        if cfg.max_tokens is not None and total >= cfg.max_tokens:
            break
        d["tokens"] = len(ids)
        total += d["tokens"]
        kept.append(d)
    for name, info in per_source.items():
        mine = [d for d in kept if d["source"] == name]
        info.update(documents_used=len(mine), tokens=sum(d["tokens"] for d in mine))
    atomic_write_text(
        out / "data.jsonl", "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in kept)
    )
    manifest = {
        "lang": code,
        "target": cfg.target,
        "documents": len(kept),
        "chars": sum(len(d["text"]) for d in kept),
        "tokens": total,
        "max_tokens": cfg.max_tokens,
        "sources": per_source,
        "missing": missing,
        "seconds": round(seconds, 1),
    }
    atomic_write_json(out / "manifest.json", manifest)
    log(
        f"corpus {code}: {len(kept):,} documents, {manifest['chars']:,} characters, {total:,} "
        "target tokens "
        f"→ {out / 'data.jsonl'}"
    )
    return manifest
