"""Hygiene of synthesized pairs: strip template leakage, check lengths, dedup, and the fastText
language-ID gate of ADASPEC Alg. 1 lines 15–19. Each check returns a rejection reason or None."""

from __future__ import annotations

import hashlib
import re
import unicodedata

from datasketch import MinHash, MinHashLSH

from polyspec.lid import identify
from synth.config import FilterConfig

# Turn markers a base model invents after the few-shot layout ("### Feedback:", "### Answer:") and
# chat role tags that leak into text: everything from the first one on is dropped.
_LEAK = re.compile(
    r"(^|\n)\s*###\s*[^\n#]{1,40}:"  # "### Feedback:" on a line of its own
    r"|<\|(im_start|im_end|user|assistant|system|end|eot_id|start_header_id)\|>"
    r"|<(start|end)_of_turn>"
)


def strip_leakage(text: str, stop: list[str]) -> str:
    """Cut at the first stop string or template marker, then trim whitespace."""
    cut = len(text)
    for s in stop:
        i = text.find(s) if s else -1
        if i >= 0:
            cut = min(cut, i)
    m = _LEAK.search(text)
    if m:
        cut = min(cut, m.start())
    return text[:cut].strip()


def normalize(text: str) -> str:
    """Dedup key text: NFKC, lower case, letters and digits only, single spaces."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(ch if (ch.isalnum() or ch.isspace()) else " " for ch in text)
    return " ".join(text.split())


def dedup_keys(instruction: str, response: str) -> tuple[str, str]:
    """(exact key, normalized key) of a pair."""
    exact = hashlib.sha1(f"{instruction}\x00{response}".encode()).hexdigest()
    norm = hashlib.sha1(f"{normalize(instruction)}\x00{normalize(response)}".encode()).hexdigest()
    return exact, norm


class NearDuplicates:
    """Texts too like an earlier one: Jaccard similarity of their word-bigram sets at or above
    ``threshold``, found with MinHash LSH (datasketch; the near-duplicate removal of large
    instruction sets). Deterministic: the same texts added in the same order give the same answers,
    so a resumed run that re-adds its kept texts equals one made in one go."""

    def __init__(self, threshold: float, num_perm: int = 128):
        self.num_perm = num_perm
        self.lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
        self.size = 0

    def _signature(self, text: str) -> MinHash:
        words = normalize(text).split() or [""]
        shingles = {" ".join(words[i : i + 2]) for i in range(max(1, len(words) - 1))}
        sig = MinHash(num_perm=self.num_perm, seed=1)
        sig.update_batch([w.encode() for w in sorted(shingles)])
        return sig

    def seen(self, text: str) -> bool:
        return bool(self.lsh.query(self._signature(text)))

    def add(self, text: str) -> None:
        self.lsh.insert(str(self.size), self._signature(text))
        self.size += 1


def check_instruction(instruction: str, finished: bool, cfg: FilterConfig) -> str | None:
    """Checked before a response is generated: a bad instruction is not worth answering."""
    if not instruction:
        return "empty_instruction"
    if not finished and not cfg.keep_unfinished_instructions:
        return "instruction_unfinished"  # ran into max_new_tokens: a runaway few-shot continuation
    if len(instruction) < cfg.min_instruction_chars:
        return "instruction_too_short"
    if len(instruction) > cfg.max_instruction_chars:
        return "instruction_too_long"
    return None


def check_response(response: str, finished: bool, cfg: FilterConfig) -> str | None:
    if not response:
        return "empty_response"
    if not finished and not cfg.keep_unfinished_responses:
        return "response_unfinished"
    if len(response) < cfg.min_response_chars:
        return "response_too_short"
    if len(response) > cfg.max_response_chars:
        return "response_too_long"
    return None


def check_language(
    instruction: str, response: str, lid_code: str, threshold: float
) -> tuple[str | None, dict]:
    """Alg. 1 line 16: LID on I ⊕ R; keep only label ℓ with probability ≥ θ."""
    label, prob = identify(instruction + "\n" + response)
    lid = {"label": label, "prob": round(prob, 4)}
    if label != lid_code:
        return "lid_other_language", lid
    if prob < threshold:
        return "lid_low_confidence", lid
    return None, lid
