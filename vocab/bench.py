"""Benchmark: token counting throughput of the ``files`` source, end to end (reading the jsonl with
``polyspec.io.read_jsonl``, batched Rust tokenization, ``np.bincount``), on the target tokenizer.

Writes a corpus of running text (the built-in seeds' sentences, shuffled into documents, in all
languages) to a temporary jsonl file unless ``--file`` is given, then counts it like ``make vocab
SOURCES=files=…`` does and prints tokens/s.

    python -m vocab.bench [--target gemma3-270m] [--documents 50000] [--file corpus.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import tempfile
from pathlib import Path

from polyspec.errors import cli_entry
from polyspec.languages import builtin_codes, get_language
from polyspec.targets import load_target
from vocab.config import SourceConfig
from vocab.count import count_documents
from vocab.sources import documents


def write_corpus(path: Path, n_docs: int, seed: int = 0) -> None:
    sentences = []
    for code in builtin_codes():
        lang = get_language(code)
        for text in [lang.system_prompt] + [
            t for s in lang.seeds for t in (s.instruction, s.response)
        ]:
            sentences += [x for x in re.split(r"(?<=[.!?。！？])\s*", text) if x.strip()]
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n_docs):
            f.write(
                json.dumps(
                    {"id": i, "text": " ".join(rng.choices(sentences, k=rng.randint(4, 16)))},
                    ensure_ascii=False,
                )
                + "\n"
            )


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vocab.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--documents", type=int, default=50000)
    ap.add_argument("--file", default=None)
    ap.add_argument("--batch-size", type=int, default=1000)
    args = ap.parse_args(argv)
    target = load_target(args.target, device="cpu", with_model=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.file) if args.file else Path(tmp) / "corpus.jsonl"
        if not args.file:
            write_corpus(path, args.documents)
        size_mb = path.stat().st_size / 1e6
        # the files source ignores the language except for {lang} in paths
        lang = get_language("en")
        c = count_documents(
            documents(SourceConfig(name="files", path=str(path)), lang, tmp),
            target.tokenizer,
            target.vocab_size,
            batch_size=args.batch_size,
        )
    rate = c.tokens / c.seconds
    print(
        f"files source: {c.documents} documents, {size_mb:.1f} MB, {c.tokens:,} tokens in "
        f"{c.seconds:.2f}s "
        f"= {rate:,.0f} tokens/s (target {target.spec.name}, batch {args.batch_size})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
