"""What the engine checks share (llama.cpp's, :mod:`engines.llamacpp`, and vLLM's,
:mod:`engines.vllm`): the held-out prompts they run on, the drafters they check (``--drafters``:
speculators-format EAGLE-3 folders, or a polyspec bundle exported to that format first), which
drafter runs on which language's prompts (:func:`bench_plan`), and their command lines' common
arguments and endings (the report printed, ``draft_n`` written, the exit status).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from polyspec.errors import PolyspecError
from polyspec.heldout import load_heldout
from polyspec.io import read_json_or_none


def heldout_prompts(lang: str, k: int) -> list[dict]:
    """The first ``k`` held-out prompts in ``lang`` (``synth/data/heldout.jsonl``); none is a
    one-line error."""
    prompts = load_heldout(lang)[:k]
    if not prompts:
        raise PolyspecError(f"synth/data/heldout.jsonl has no prompt in {lang!r}")
    return prompts


# ----------------------------------------------------------------------------------------- drafters


def drafter_folders(path: str | Path) -> dict[str, Path]:
    """Speculators-format EAGLE-3 folders under ``path`` by name: ``path/<name>/config.json`` (what
    ``python -m export --format speculators`` writes: one per language; an engines export also has
    ``multilingual/``), or ``path`` itself (named by its ``polyspec.json`` lang)."""
    path = Path(path)
    if _is_speculators(path):
        found = {(read_json_or_none(path / "polyspec.json") or {}).get("lang") or path.name: path}
    else:
        found = (
            {p.name: p for p in sorted(path.iterdir()) if p.is_dir() and _is_speculators(p)}
            if path.is_dir()
            else {}
        )
    if not found:
        raise PolyspecError(
            f"{path} holds no speculators-format EAGLE-3 folder (<lang>/config.json with "
            "speculators_model_type eagle3); write one with python -m export --format speculators"
        )
    return found


def bench_plan(folders: dict[str, Path], langs: list[str] | None) -> list[tuple[str | None, str]]:
    """(drafter, prompt language) pairs: a language's drafter on that language's held-out prompts, a
    multilingual one (``polyspec.json`` ``languages``) on each of its languages, a folder of another
    name on its ``polyspec.json`` ``lang``'s (two drafters of one language side by side); ``langs``
    keeps only those languages. Without drafters: plain + n-gram on ``langs`` (default en)."""
    if not folders:
        return [(None, lang) for lang in (langs or ["en"])]
    plan = []
    for name, folder in folders.items():
        info = read_json_or_none(folder / "polyspec.json") or {}
        own = [name] if load_heldout(name) else list(info.get("languages") or [])
        if not own and load_heldout(info.get("lang") or ""):
            own = [info["lang"]]
        if not own:
            raise PolyspecError(
                f"drafter {folder}: no held-out prompts in {name!r} and no languages in its "
                "polyspec.json"
            )
        plan += [(name, lang) for lang in own if not langs or lang in langs]
    missing = [lang for lang in langs or [] if lang not in {lang for _, lang in plan}]
    if missing:
        raise PolyspecError(f"no drafter for {', '.join(missing)} among {', '.join(folders)}")
    return plan


def _is_speculators(folder: Path) -> bool:
    cfg = read_json_or_none(folder / "config.json")
    return isinstance(cfg, dict) and cfg.get("speculators_model_type") == "eagle3"


def export_bundle(bundle_dir: str | Path, target_name: str, out: str | Path, log=print) -> Path:
    """A polyspec bundle's EAGLE-3 drafters → ``out/<lang>/`` in the speculators format (loads the
    target)."""
    from export.bundle import load_bundle
    from export.interop import check_speculators, write_speculators
    from polyspec.targets import load_target

    target = load_target(target_name, device="cpu", dtype="float32")
    b = load_bundle(bundle_dir, target_pin=target.pin())
    log(f"[engines] exporting {b.root} to the speculators format → {out}")
    for folder in write_speculators(b, target, out):
        check_speculators(folder, target.vocab_size)
    return Path(out)


def resolve_drafters(
    drafters: str | Path | None, target_name: str, out: Path, log=print
) -> dict[str, Path]:
    """``--drafters``: speculators folders as they are, or a bundle (``manifest.json``) exported
    first."""
    if drafters is None:
        return {}
    drafters = Path(drafters)
    if (drafters / "manifest.json").is_file():
        drafters = export_bundle(drafters, target_name, out / "speculators", log=log)
    return drafter_folders(drafters)


# ------------------------------------------------------------------------------------ command lines


def add_drafter_args(p: argparse.ArgumentParser, out: str, drafters: str) -> None:
    """``--target``, ``--drafters`` (``drafters``: its help), ``--out`` (default ``out``) and
    ``--langs``."""
    p.add_argument("--target", default="gemma3-270m")
    p.add_argument("--drafters", default=None, help=drafters)
    p.add_argument("--out", default=out)
    p.add_argument(
        "--langs",
        default=None,
        help="comma-separated; default: every drafter's language (en without drafters)",
    )


def add_engines_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engines",
        default=None,
        help="an export's engines.json: the chosen draft_n is written into it",
    )


def parse_langs(text: str | None) -> list[str] | None:
    """``--langs vi,de`` → ["vi", "de"]; None (every drafter's language) when not given."""
    return [x.strip() for x in text.split(",") if x.strip()] if text else None


def print_report(markdown: str, *written: Path) -> None:
    """The report's tables, then the files it was written to."""
    print(markdown)
    print(f"written: {', '.join(str(p) for p in written)}")


def print_draft_n(engines: str | Path, lengths: dict, engine: str | None = None) -> None:
    """One line: each drafter's chosen ``draft_n`` written into ``engines`` (an export's
    engines.json)."""
    print(
        f"draft_n {f'for {engine} ' if engine else ''}written into {engines}: "
        + ", ".join(f"{n} {d['draft_n']}" for n, d in lengths.items())
    )


def exit_status(check: str, differ: list[str], what: str) -> int:
    """1 with one line on stderr (``<check>: <what> for <differ>``) when some output differs from
    plain, else 0."""
    if differ:
        print(f"{check}: {what} for {', '.join(differ)}", file=sys.stderr)
        return 1
    return 0
