"""Options of the vocab stage, declared once (YAML `configs/vocab/*.yaml`, then CLI overrides)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from polyspec.config import StrictModel

SourceName = Literal["fineweb2", "wikipedia", "wordfreq", "files", "synth"]


class SourceConfig(StrictModel):
    """One corpus. Counts of all sources of a language are normalised per source and mixed by
    weight."""

    name: SourceName
    weight: float = Field(1.0, gt=0)
    path: str | None = Field(
        None,
        description="files: a txt/jsonl/parquet file, glob or folder; fineweb2/wikipedia: a local "
        "dataset folder "
        "with the same schema instead of the hub (tests, mirrors); may contain {lang}",
    )
    dataset: str | None = Field(
        None,
        description="fineweb2/wikipedia: the `datasets` repo streamed with the language's config "
        "and split (default: "
        "the language entry's, e.g. HuggingFaceFW/fineweb-2); a local folder laid out like it (a "
        "partial snapshot: "
        "README.md configs + data files) streams through the same load_dataset call, offline",
    )
    text_field: str | None = Field(
        None, description="column holding the text (default: the language entry's / 'text')"
    )
    max_documents: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(
        None,
        ge=1,
        description="stop streaming after this many counted tokens (checked per batch of "
        "documents)",
    )

    @model_validator(mode="after")
    def _dataset_only_for_hub_sources(self) -> SourceConfig:
        if self.dataset is not None and self.name not in ("fineweb2", "wikipedia"):
            raise ValueError(f"dataset is for fineweb2/wikipedia, not {self.name}")
        if self.dataset is not None and self.path is not None:
            raise ValueError(
                "give dataset (a datasets repo or snapshot folder) or path (a folder of files), "
                "not both"
            )
        return self


class VocabConfig(StrictModel):
    """`make vocab LANGS=vi,de SOURCES=wordfreq` == `python -m vocab --langs vi,de --sources
    wordfreq`."""

    langs: list[str] = Field(default_factory=lambda: ["vi", "de", "ja"])
    target: str = "gemma3-270m"
    run: str = Field("runs/default", description="output goes to <run>/vocab/")
    sources: list[SourceConfig] = Field(default_factory=lambda: [SourceConfig(name="wordfreq")])
    heldout: Literal["auto", "answers", "split", "synth", "seeds"] = Field(
        "auto",
        description="held-out running text for coverage: the target's greedy answers to the "
        "held-out prompts "
        "(<run>/synth/<lang>-heldout, never counted), a split of the text sources, the run's "
        "synth output, or the "
        "language seeds; auto = answers when they exist, else split when a text source is used, "
        "else synth, else seeds",
    )
    heldout_every: int = Field(
        10, ge=2, description="split: every k-th document is held out (not counted)"
    )
    batch_size: int = Field(1000, ge=1, description="documents per tokenizer batch")
    wordfreq_space_share: float = Field(
        0.85,
        ge=0.0,
        le=1.0,
        description="wordfreq: share of a word's occurrences after a space (languages with spaces)",
    )
    wordfreq_capital_share: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="wordfreq: share of a word's occurrences that start with a capital (cased "
        "scripts); default: "
        "measured on the language's seeds (en 0.12, de 0.34: German capitalises its nouns)",
    )
    coverage_ks: list[int] = Field(
        default_factory=lambda: [1024, 2048, 4096, 8192, 16384, 32768, 65536]
    )
    overlap_k: int = Field(8192, ge=1)
    mask_sizes: list[int] = Field(
        default_factory=lambda: [8192, 16384, 32768], description="S of ADASPEC Alg. 2"
    )

    @field_validator("mask_sizes")
    @classmethod
    def _sorted_sizes(cls, v: list[int]) -> list[int]:
        if v != sorted(set(v)) or not v or v[0] < 1:
            raise ValueError("must be distinct positive sizes in increasing order")
        return v
