"""Write the built-in languages' human-written text (system prompt, few-shot instructions and
responses) as ``configs/vocab/seed-text/<lang>.jsonl`` ({"text": …} per line): a local corpus for
the ``files`` vocab source (profile gpu-smoke), so a vocabulary can be counted offline without
wordfreq or network corpora.

    python scripts/gpu/seed_text.py            (rerun after editing configs/languages/*.yaml)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from polyspec.languages import builtin_codes, get_language  # noqa: E402
from polyspec.paths import configs_dir  # noqa: E402


def seed_texts(code: str) -> list[str]:
    lang = get_language(code)
    return [lang.system_prompt, *(x for s in lang.seeds for x in (s.instruction, s.response))]


def main() -> int:
    out = configs_dir() / "vocab" / "seed-text"
    out.mkdir(parents=True, exist_ok=True)
    for code in builtin_codes():
        lines = "".join(
            json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in seed_texts(code)
        )
        (out / f"{code}.jsonl").write_text(lines, encoding="utf-8")
    print(f"seed text of {len(builtin_codes())} languages in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
