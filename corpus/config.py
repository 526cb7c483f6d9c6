"""Options of the corpus stage, declared once (YAML ``configs/corpus/*.yaml``, then dotted CLI
overrides)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from polyspec.config import StrictModel


class SourceConfig(StrictModel):
    """One kind of document: a Debian package per language (fetched with ``apt-get download``,
    unpacked with ``dpkg -x``, nothing installed) or a local folder per language; ``paths`` are
    globs inside it."""

    name: str = Field(description="the source's name in the manifest and in document ids")
    kind: Literal["debian", "folder"] = "debian"
    format: Literal["html", "roff", "text", "auto"] = Field(
        "auto", description="how its files are read (corpus.extract.blocks)"
    )
    packages: dict[str, str] = Field(
        default_factory=dict, description="debian: language → package name"
    )
    folders: dict[str, str] = Field(
        default_factory=dict, description="folder: language → folder ({lang} allowed)"
    )
    paths: dict[str, list[str]] = Field(
        description="language → globs of its files, relative to the unpacked package or the folder"
    )
    exclude: list[str] = Field(
        default_factory=list, description="substrings of relative paths to skip"
    )
    licence: str | None = Field(
        None, description="the licence when the package states none machine-readably"
    )

    @model_validator(mode="after")
    def _where(self) -> SourceConfig:
        if self.kind == "debian" and not self.packages:
            raise ValueError(f"source {self.name}: a debian source names its packages")
        if self.kind == "folder" and not self.folders:
            raise ValueError(f"source {self.name}: a folder source names its folders")
        return self

    def location(self, lang: str) -> str | None:
        """The package or folder that holds ``lang``'s documents, or None where this source has
        none."""
        where = self.packages if self.kind == "debian" else self.folders
        return (
            where.get(lang, where.get("*", "").replace("{lang}", lang) or None)
            if lang in self.paths
            else None
        )


class CorpusConfig(StrictModel):
    """`make corpus LANGS=en,de` == `python -m corpus --langs en,de`: general text per language for
    the pretrain."""

    langs: list[str] = Field(default_factory=lambda: ["en"])
    target: str = Field("gemma3-270m", description="its tokenizer counts the tokens")
    run: str = Field("runs/default", description="output goes to <run>/corpus/")
    cache: str | None = Field(
        None,
        description="where .debs and unpacked packages are kept (default: the user "
        "cache's corpus/ folder, shared by runs)",
    )
    sources: list[SourceConfig]
    min_chars: int = Field(
        40, ge=1, description="paragraphs shorter than this are dropped (menus, labels)"
    )
    min_chars_cjk: int = Field(12, ge=1, description="the same for ja and zh text")
    lid_threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="min fastText probability of the language "
        "per paragraph (default: the language entry's lid_threshold)",
    )
    max_doc_chars: int = Field(
        2000,
        ge=100,
        description="a file's kept paragraphs are cut into documents of at most "
        "this many characters",
    )
    max_tokens: int | None = Field(
        None,
        ge=1,
        description="per language: stop adding documents past this many "
        "target tokens (sources in order, each file's documents whole)",
    )
