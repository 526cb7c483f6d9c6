"""Append-only, resumable output of a synth job.

Files in the output folder (schemas in DESIGN.md):
- ``data.jsonl`` / ``rejected.jsonl``: one JSON object per line, appended and flushed per batch.
- ``progress.json``: the commit point, written atomically *after* a batch's lines are flushed:
  ``{"next_attempt", "args_hash"}``. Lines of attempts at or past ``next_attempt`` belong to a batch
  that was interrupted; on resume they are dropped (and a torn last line with them), so the
  finished files equal those of an uninterrupted run.
- ``stats.json``: counts derived from the files (attempted = accepted + Σ rejected by reason).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from polyspec.errors import PolyspecError
from polyspec.faults import maybe_kill
from polyspec.io import atomic_write_json, atomic_write_text, read_jsonl


class SynthStore:
    def __init__(self, out_dir: str | Path, args_hash: str):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data_path = self.dir / "data.jsonl"
        self.rejected_path = self.dir / "rejected.jsonl"
        self.progress_path = self.dir / "progress.json"
        self.args_hash = args_hash
        self.next_attempt = 0
        self.accepted: list[dict[str, Any]] = []
        self.rejected: list[dict[str, Any]] = []
        self._commits = 0
        self.seconds = 0.0  # generation time summed over sessions (committed batches only)
        self._recover()

    # -- resume ------------------------------------------------------------------------------------
    def _recover(self) -> None:
        if self.progress_path.exists():
            progress = json.loads(self.progress_path.read_text(encoding="utf-8"))
            if progress.get("args_hash") != self.args_hash:
                raise PolyspecError(
                    f"{self.dir} holds a synth run with other arguments (seed, prompts, sampling); "
                    "use another RUN directory or delete it"
                )
            self.next_attempt = int(progress["next_attempt"])
            self.seconds = float(progress.get("seconds", 0.0))
        self.accepted = self._read_committed(self.data_path)
        self.rejected = self._read_committed(self.rejected_path)
        self.tokens = sum(record_tokens(r) for r in self.accepted + self.rejected)

    def _read_committed(self, path: Path) -> list[dict[str, Any]]:
        """Lines of committed attempts; rewrites the file if an interrupted batch left more
        behind."""
        if not path.exists():
            return []
        kept, dropped = [], False
        records = read_jsonl(path)  # skips (and counts) the torn last line of a killed write
        for rec in records:
            if rec.get("attempt", -1) < self.next_attempt:
                kept.append(rec)
            else:
                dropped = True
        if dropped or records.skipped:
            atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
        return kept

    # -- writing -----------------------------------------------------------------------------------
    def commit(
        self, accepted: list[dict], rejected: list[dict], next_attempt: int, seconds: float = 0.0
    ) -> None:
        """Append a finished batch, flush both files to disk, then move the commit point."""
        self._commits += 1
        for path, recs in ((self.data_path, accepted), (self.rejected_path, rejected)):
            with open(path, "a", encoding="utf-8") as f:
                for r in recs:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
                # crash tests: the worst moment for a resume
                maybe_kill("commit", self._commits, torn=f)
        self.accepted += accepted
        self.rejected += rejected
        self.tokens += sum(record_tokens(r) for r in accepted + rejected)
        self.next_attempt = next_attempt
        self.seconds += seconds
        atomic_write_json(
            self.progress_path,
            {
                "next_attempt": next_attempt,
                "args_hash": self.args_hash,
                "seconds": round(self.seconds, 3),
            },
        )

    def stats(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        reasons = Counter(r["reason"] for r in self.rejected)
        lid_rejects = Counter(
            r["lid"]["label"]
            for r in self.rejected
            if r.get("lid") and r["reason"].startswith("lid_")
        )
        return {
            "attempted": len(self.accepted) + len(self.rejected),
            "accepted": len(self.accepted),
            "rejected": sum(reasons.values()),
            "rejected_by_reason": dict(sorted(reasons.items())),
            "lid_labels_of_rejects": dict(lid_rejects.most_common()),
            "acceptance_rate": round(
                len(self.accepted) / max(1, len(self.accepted) + len(self.rejected)), 4
            ),
            "tokens": self.tokens,
            "seconds": round(self.seconds, 1),
            "tokens_per_second": round(self.tokens / self.seconds, 1) if self.seconds else None,
            **(extra or {}),
        }

    def write_stats(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        stats = self.stats(extra)
        atomic_write_json(self.dir / "stats.json", stats)
        return stats


def record_tokens(rec: dict[str, Any]) -> int:
    """Generated tokens of one record (instruction + response)."""
    return sum((rec.get("tokens") or {}).values())
