"""Bundles: one folder holding everything the decoder needs for a target and a set of languages.

Layout (DESIGN.md)::

    manifest.json                 format_version, target pin, drafter_type, languages, vocab_sizes,
                                  adaptive {window, step, offset}, files {relative path: sha256}
    drafters/<lang>/              config.json + model.safetensors (from <run>/train/<lang>/final/)
    vocab/<lang>.safetensors      ranked ids (+ .json sidecar)
    language_masks.safetensors    [|L|·|S|, |V|] bit-packed, row s·|L| + l (ADASPEC Alg. 2)
    README.md                     model card

``write_bundle`` builds it in a temporary folder and renames it into place (no half bundle on a
crash); ``load_bundle`` refuses a bundle whose format, checksums, paths (must stay inside the
bundle), tensor shapes or tokenizer do not match.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyspec.drafter_kind import DrafterKind
from polyspec.errors import PolyspecError
from polyspec.io import (
    atomic_directory,
    atomic_write_json,
    atomic_write_text,
    read_json_or_none,
    read_jsonl,
    sha256_file,
)
from polyspec.targets import check_pin

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@dataclass
class Bundle:
    root: Path
    manifest: dict[str, Any]

    @property
    def languages(self) -> list[str]:
        return list(self.manifest["languages"])

    @property
    def vocab_sizes(self) -> list[int]:
        return list(self.manifest["vocab_sizes"])

    def path(self, rel: str) -> Path:
        return safe_join(self.root, rel)

    def drafter_dir(self, lang: str) -> Path:
        return self.path(f"drafters/{lang}")

    def vocab_file(self, lang: str) -> Path:
        return self.path(f"vocab/{lang}.safetensors")

    def ranked(self, lang: str) -> Any:
        """``lang``'s ranked vocabulary (``vocab.files.RankedVocab``), checked against the tokenizer
        the bundle was built with: the bundle's target pin, which ``load_bundle`` compared with the
        serving target's."""
        from vocab.files import load_ranked

        return load_ranked(
            self.vocab_file(lang), tokenizer_sha256=self.manifest["target"]["tokenizer_sha256"]
        )

    def masks_file(self) -> Path:
        return self.path("language_masks.safetensors")


def safe_join(root: Path, rel: str) -> Path:
    """``root / rel``, refusing absolute paths and anything that resolves outside ``root``."""
    if not rel or Path(rel).is_absolute() or "\\" in rel:
        raise PolyspecError(f"bundle path {rel!r} is not a relative path inside the bundle")
    full = (root / rel).resolve()
    if full != root.resolve() and root.resolve() not in full.parents:
        raise PolyspecError(f"bundle path {rel!r} points outside the bundle")
    return full


def write_bundle(
    out: str | Path,
    run: str | Path,
    languages: list[str],
    target_pin: dict,
    vocab_sizes: list[int],
    adaptive: dict | None = None,
    overwrite: bool = True,
    train_dir: str = "train",
    drafters: dict[str, str | Path] | None = None,
) -> Bundle:
    """Copy the run's per-language drafters (``<run>/<train_dir>/<lang>/final/``, or the folder
    ``drafters`` names for a language: a drafter trained elsewhere, e.g. a learning curve's point)
    and vocabularies, build the masks, write the manifest."""
    from vocab.files import RankedVocab, load_ranked, save_ranked
    from vocab.masks import build_masks, save_masks

    run = Path(run)
    adaptive = adaptive or {"window": 10, "step": 5, "offset": 2}  # ADASPEC Table 3, best (w, u, z)
    drafter_types, cards = set(), {}
    with atomic_directory(out, overwrite=overwrite) as tmp:
        ranked = []
        for lang in languages:
            src = Path((drafters or {}).get(lang) or run / train_dir / lang / "final")
            cfg = _read_json(src / "config.json", f"drafter of {lang!r} (train stage output)")
            recorded = cfg.get("target", {})
            moved = recorded.get("tokenizer_sha256") != target_pin["tokenizer_sha256"]
            if moved and (
                recorded.get("vocab_sha256") is None
                or recorded.get("vocab_sha256") != target_pin.get("vocab_sha256")
            ):
                raise PolyspecError(f"drafter {src} was trained for another target tokenizer")
            # another conversion of the same id table (a GPU image's transformers,
            # scripts/gpu/gpu-scale.sh): one warning
            check_pin(recorded, target_pin, f"drafter {src}")
            drafter_types.add(cfg["drafter_type"])
            cards[lang] = _training_facts(cfg)
            shutil.copytree(src, tmp / "drafters" / lang)
            vocab = load_ranked(
                run / "vocab" / f"{lang}.safetensors",
                tokenizer_sha256=recorded.get("tokenizer_sha256"),
            )
            (tmp / "vocab").mkdir(exist_ok=True)
            # the same ids, ranked where the drafter was trained: pinned to the bundle's tokenizer
            if moved:
                save_ranked(
                    tmp / "vocab",
                    RankedVocab(
                        lang=vocab.lang,
                        ranked_ids=vocab.ranked_ids,
                        counts=vocab.counts,
                        meta={
                            **vocab.meta,
                            "tokenizer_sha256": target_pin["tokenizer_sha256"],
                            "built_with_tokenizer_sha256": recorded.get("tokenizer_sha256"),
                        },
                    ),
                )
            else:
                for suffix in (".safetensors", ".json"):
                    shutil.copy2(
                        run / "vocab" / f"{lang}{suffix}", tmp / "vocab" / f"{lang}{suffix}"
                    )
            ranked.append(vocab.ranked_ids)
        if len(drafter_types) != 1:
            raise PolyspecError(f"one drafter type per bundle, got {sorted(drafter_types)}")
        save_masks(
            tmp / "language_masks.safetensors",
            build_masks(ranked, vocab_sizes, target_pin["vocab_size"]),
            languages,
            vocab_sizes,
        )
        manifest = {
            "format_version": FORMAT_VERSION,
            "target": target_pin,
            "drafter_type": drafter_types.pop(),
            "languages": languages,
            "vocab_sizes": vocab_sizes,
            "adaptive": adaptive,
        }
        atomic_write_text(
            tmp / "README.md",
            model_card(manifest, cards, read_json_or_none(run / "eval" / "report.json")),
        )
        manifest["files"] = {
            p.relative_to(tmp).as_posix(): sha256_file(p)
            for p in sorted(tmp.rglob("*"))
            if p.is_file()
        }
        atomic_write_json(tmp / MANIFEST, manifest)
    return load_bundle(out, target_pin=target_pin)


def load_bundle(path: str | Path, target_pin: dict | None = None, verify: bool = True) -> Bundle:
    """Validate and open a bundle; every problem is a one-line PolyspecError."""
    root = Path(path)
    manifest = _read_json(root / MANIFEST, "bundle manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise PolyspecError(
            f"bundle {root}: format_version {manifest.get('format_version')} is not "
            f"{FORMAT_VERSION}"
        )
    for key in ("target", "drafter_type", "languages", "vocab_sizes", "adaptive", "files"):
        if key not in manifest:
            raise PolyspecError(f"bundle {root}: manifest has no {key!r}")
    bundle = Bundle(root, manifest)
    if target_pin is not None:  # tokenizer, vocabulary, width, layer count, architecture
        check_pin(manifest["target"], target_pin, f"bundle {root}")
    listed = manifest["files"]
    for rel in listed:
        safe_join(root, rel)  # raises for ../ or absolute paths
    if verify:
        for rel, digest in listed.items():
            p = safe_join(root, rel)
            if not p.is_file():
                raise PolyspecError(f"bundle {root}: {rel} is missing")
            if sha256_file(p) != digest:
                raise PolyspecError(
                    f"bundle {root}: {rel} does not match its checksum (corrupted or edited)"
                )
    for lang in bundle.languages:
        for rel in (
            f"drafters/{lang}/config.json",
            f"drafters/{lang}/model.safetensors",
            f"vocab/{lang}.safetensors",
        ):
            if rel not in listed:
                raise PolyspecError(f"bundle {root}: {rel} is not listed in the manifest")
    from vocab.masks import load_masks

    mask, langs, sizes = load_masks(bundle.masks_file())
    if (
        langs != bundle.languages
        or sizes != bundle.vocab_sizes
        or mask.shape[1] != manifest["target"]["vocab_size"]
    ):
        raise PolyspecError(
            f"bundle {root}: language masks {tuple(mask.shape)} for {langs}/{sizes} do not match "
            "the manifest"
        )
    return bundle


def _training_facts(cfg: dict) -> dict:
    """What the model card says about a drafter: its data (examples per file), steps, held-out
    acceptance."""
    files = []
    for f in cfg.get("data_files", []):
        path = Path(f[0] if isinstance(f, list) else f)
        try:
            # its JSON records (a torn line is not one)
            n = sum(1 for _ in read_jsonl(path, log=None))
        except OSError:
            n = None
        files.append(
            (path.name if path.parent.name == "" else f"{path.parent.name}/{path.name}", n)
        )
    kind = DrafterKind.of_config(cfg)
    return {
        "stage": cfg.get("stage"),
        "steps": cfg.get("step"),
        "files": files,
        "accept_len": (cfg.get("eval") or {}).get("accept_len"),
        "arch": kind.value if kind else cfg["drafter_type"],
    }


def model_card(manifest: dict, cards: dict | None = None, evaluation: dict | None = None) -> str:
    t = manifest["target"]
    lines = [
        f"# polyspec bundle — {t['name']}",
        "",
        f"Drafters ({manifest['drafter_type']}) for {', '.join(manifest['languages'])}, with "
        "ranked vocabularies "
        f"and language masks for sizes {', '.join(map(str, manifest['vocab_sizes']))} (ADASPEC).",
        "",
        f"- target: `{t['name']}` ({t['source']}), vocab {t['vocab_size']}, hidden "
        f"{t['hidden_size']}, "
        f"tokenizer sha256 `{t['tokenizer_sha256'][:16]}…`",
        f"- adaptive defaults: window {manifest['adaptive']['window']}, step "
        f"{manifest['adaptive']['step']}, "
        f"offset {manifest['adaptive']['offset']}",
        "",
        "Decoding with it is lossless: the target verifies every token.",
        "",
    ]
    if cards:
        lines += [
            "## Drafters",
            "",
            "| language | form | last stage | steps | training data (examples) | "
            "held-out simulated acceptance |",
            "|---|---|---|---|---|---|",
        ]
        for lang, c in cards.items():
            data = (
                ", ".join(f"{name} ({n if n is not None else '?'})" for name, n in c["files"])
                or "–"
            )
            acc = f"{c['accept_len']:.3f}" if c["accept_len"] is not None else "–"
            lines.append(f"| {lang} | {c['arch']} | {c['stage']} | {c['steps']} | {data} | {acc} |")
        lines.append("")
    if evaluation:
        lines += [
            "## Evaluation (speedup vs the fastest AR / τ)",
            "",
            f"{evaluation.get('questions')} questions, {evaluation.get('device')}, max "
            f"{evaluation.get('max_new_tokens')} "
            "new tokens.",
            "",
            "| method | speedup | τ | identical |",
            "|---|---|---|---|",
        ]
        for m, d in evaluation.get("methods", {}).items():
            o = d["overall"]
            lines.append(
                f"| {m} | {o['speedup']:.2f}× | {o['tau']:.2f} | "
                f"{'yes' if o['identical'] else 'no'} |"
            )
        lines.append("")
    return "\n".join(lines)


def _read_json(path: Path, what: str) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PolyspecError(f"{what} not found: {path}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise PolyspecError(f"cannot read {what} {path}: {e}") from None
