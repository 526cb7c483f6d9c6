"""Options of the vocab stage, declared once (YAML `configs/vocab/*.yaml`, then CLI overrides)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from polyspec.config import StrictModel

SourceName = Literal["fineweb2", "wikipedia", "wordfreq", "files", "synth"]


class SourceConfig(StrictModel):
    """One corpus. Counts of all sources of a language are normalised per source and mixed by weight."""

    name: SourceName
    weight: float = Field(1.0, gt=0)
    path: str | None = Field(
        None,
        description="files: a txt/jsonl/parquet file, glob or folder; fineweb2/wikipedia: a local dataset folder "
        "with the same schema instead of the hub (tests, mirrors); may contain {lang}",
    )
    text_field: str | None = Field(None, description="column holding the text (default: the language entry's / 'text')")
    max_documents: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1, description="stop after about this many counted tokens")


class VocabConfig(StrictModel):
    """`make vocab LANGS=vi,de SOURCES=wordfreq` == `python -m vocab --langs vi,de --sources wordfreq`."""

    langs: list[str] = Field(default_factory=lambda: ["vi", "de", "ja"])
    target: str = "gemma3-270m"
    run: str = Field("runs/default", description="output goes to <run>/vocab/")
    sources: list[SourceConfig] = Field(default_factory=lambda: [SourceConfig(name="wordfreq")])
    heldout: Literal["auto", "split", "synth", "seeds"] = Field(
        "auto",
        description="held-out running text for coverage: a split of the text sources, the run's synth output, "
        "or the language seeds; auto = split when a text source is used, else synth, else seeds",
    )
    heldout_every: int = Field(10, ge=2, description="split: every k-th document is held out (not counted)")
    batch_size: int = Field(1000, ge=1, description="documents per tokenizer batch")
    wordfreq_space_share: float = Field(
        0.85, ge=0.0, le=1.0, description="wordfreq: share of a word's occurrences after a space (languages with spaces)"
    )
    coverage_ks: list[int] = Field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384, 32768, 65536])
    overlap_k: int = Field(8192, ge=1)
    mask_sizes: list[int] = Field(default_factory=lambda: [8192, 16384, 32768], description="S of ADASPEC Alg. 2")

    @field_validator("mask_sizes")
    @classmethod
    def _sorted_sizes(cls, v: list[int]) -> list[int]:
        if v != sorted(set(v)) or not v or v[0] < 1:
            raise ValueError("must be distinct positive sizes in increasing order")
        return v
