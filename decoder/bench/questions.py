"""The bench's questions: Spec-Bench ``question.jsonl`` lines {question_id, category, language,
turns}.

    # every line checked; all problems in one error
    rows = read_questions(path)
    # filtered by language / category, capped per cell
    qs = select_questions(rows, ["vi", "de"], per_cell=1)

Default file: the built-in mini Multi-SpecBench (``decoder/data/mini_multispecbench.jsonl``: 7
languages × 7 tasks × 3, plus a mixed-language set). polyspec's held-out prompts
(``synth/data/heldout.jsonl``: ``id``, ``lang``) load too, and the held-out mixed-language questions
(``decoder/data/heldout_mixed.jsonl``: a prompt in one language asking for an answer in another,
written apart from the benchmark's); several files are read as one when given comma-separated. The
file is read with the project's tolerant JSONL reader (``polyspec.io.read_jsonl``): a torn line is
skipped and counted, never fatal. Nothing here loads torch, so a bad file fails before any model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from polyspec.errors import PolyspecError
from polyspec.io import read_jsonl
from polyspec.languages import builtin_codes, is_valid_code

# decoder/data/
BUILTIN = Path(__file__).resolve().parent.parent / "data" / "mini_multispecbench.jsonl"


def _problems(q: dict, seen: dict, n: int) -> list[str]:
    """What is wrong with question ``q`` on line ``n`` (``seen``: question id → its first line)."""
    out = []
    qid = q.get("question_id", q.get("id"))
    if qid is None or qid == "":
        out.append("no question_id")
    elif not isinstance(qid, (int, str)) or isinstance(qid, bool):
        out.append("question_id must be a string or an integer")
    elif qid in seen:
        out.append(f"question_id {qid!r} repeats line {seen[qid]}")
    else:
        seen[qid] = n
    turns = q.get("turns")
    if (
        not isinstance(turns, list)
        or not turns
        or not all(isinstance(t, str) and t.strip() for t in turns)
    ):
        out.append("turns must be a non-empty list of non-empty strings")
    for key in ("language", "lang", "prompt_language"):
        code = q.get(key)
        if code is not None and not (
            isinstance(code, str) and (code in builtin_codes() or is_valid_code(code))
        ):
            out.append(
                f"unknown {key} {code!r} (built in: {', '.join(builtin_codes())}, or an ISO-639-1 "
                "code)"
            )
    return out


def read_questions(
    path: str | Path | None = None, log: Callable[[str], Any] | None = None
) -> list[dict]:
    """Every question of a Spec-Bench file (default: the built-in one), checked and normalised
    (``question_id``, ``category`` default ``unknown``, ``language`` default ``lang`` or ``en``).
    Ids must be present and unique, turns non-empty strings, languages known
    (``polyspec.languages``); every problem of the file is listed in one PolyspecError. ``log``:
    where the tolerant reader's note on skipped torn lines goes (default stderr)."""
    path = Path(path) if path else BUILTIN
    if not path.is_file():
        raise PolyspecError(f"questions file not found: {path}")
    records = read_jsonl(path, **({"log": log} if log is not None else {}))
    rows = list(records)
    # the records' line numbers: the non-blank lines the reader did not skip
    with open(path, "rb") as f:
        bad = set(records.bad_lines)
        numbers = [n for n, raw in enumerate(f, 1) if raw.strip() and n not in bad]
    seen, problems = {}, {}  # problems: what → line numbers
    for q, n in zip(rows, numbers):
        for why in _problems(q, seen, n):
            problems.setdefault(why, []).append(n)
    if problems:
        items = [(lines, why) for why, lines in problems.items()]
        first = (
            f"{path}:{','.join(map(str, items[0][0]))}: not a Spec-Bench question ({items[0][1]})"
        )
        rest = "".join(
            f"; line{'s' if len(ls) > 1 else ''} {', '.join(map(str, ls))}: {why}"
            for ls, why in items[1:]
        )
        raise PolyspecError(first + rest)
    if not rows:
        raise PolyspecError(f"{path}: no questions in the file")
    for q in rows:
        q.setdefault("question_id", q.get("id"))
        q.setdefault("category", "unknown")
        q.setdefault("language", q.get("lang", "en"))
    return rows


def read_question_files(
    spec: str | Path | None = None, log: Callable[[str], Any] | None = None
) -> list[dict]:
    """``read_questions`` of each file of a comma-separated list (``synth/data/heldout.jsonl,
    decoder/data/heldout_mixed.jsonl``), in order; ids must be unique across the files too."""
    if spec is None or isinstance(spec, Path) or "," not in str(spec):
        return read_questions(spec, log)
    rows, where = [], {}
    for path in [x.strip() for x in str(spec).split(",") if x.strip()]:
        for q in read_questions(path, log):
            qid = str(q["question_id"])
            if qid in where:
                raise PolyspecError(f"{path}: question_id {qid!r} is also in {where[qid]}")
            where[qid] = path
            rows.append(q)
    return rows


def select_questions(
    rows: list[dict],
    langs: list[str] | None = None,
    per_cell: int | None = None,
    categories: list[str] | None = None,
    source: str | Path = "questions",
) -> list[dict]:
    """The questions in ``langs`` (their language, or for mixed questions the prompt's) and
    ``categories``, at most ``per_cell`` per (language, category), in file order."""
    out, seen = [], {}
    for q in rows:
        if langs and q["language"] not in langs and q.get("prompt_language") not in langs:
            continue
        if categories and q["category"] not in categories:
            continue
        cell = (q["language"], q["category"])
        seen[cell] = seen.get(cell, 0) + 1
        if per_cell and seen[cell] > per_cell:
            continue
        out.append(q)
    if not out:
        raise PolyspecError(
            f"{source}: no questions left for languages {langs} / categories {categories}"
        )
    return out


def load_questions(
    path: str | Path | None = None,
    langs: list[str] | None = None,
    per_cell: int | None = None,
    categories: list[str] | None = None,
    log: Callable[[str], Any] | None = None,
) -> list[dict]:
    """``read_questions`` then ``select_questions``."""
    rows = read_questions(path, log)
    return select_questions(rows, langs, per_cell, categories, Path(path) if path else BUILTIN)
