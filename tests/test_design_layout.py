"""DESIGN.md's "Layout" block against the tracked tree (``git ls-files``): every top-level folder
and file is listed, every folder the block names exists, ``configs/`` lists exactly its subfolders,
and each package's entry names each of its subfolders — so the layout a reader learns first is the
one they find."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import REPO


def layout_block() -> list[str]:
    text = (REPO / "DESIGN.md").read_text(encoding="utf-8")
    block = re.search(r"^## Layout\n```\n(.*?)\n```", text, re.S | re.M)
    assert block, "DESIGN.md has no ## Layout code block"
    return block.group(1).splitlines()


def entries(lines: list[str]) -> dict[str, str]:
    """A top-level name (``decoder/``, ``pyproject.toml``) → its entry's text, continuation lines
    included."""
    out, name = {}, None
    for line in lines:
        if line and not line[0].isspace():
            words = line.split()
            name = words[0]
            out[name] = line
            # a line of top-level files: pyproject.toml   Makefile   README.md
            if not name.endswith("/"):
                out.update({w: line for w in words[1:]})
        elif name:
            out[name] += "\n" + line
    return out


def tracked() -> list[str]:
    files = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    return files


def test_layout_lists_the_top_level_tree():
    listed = entries(layout_block())
    top = {f.split("/")[0] + ("/" if "/" in f else "") for f in tracked()}
    top = {t for t in top if not t.startswith(".")} | {".ci/run"}
    assert not top - set(listed), (
        f"in the tree, not in DESIGN.md's layout: {sorted(top - set(listed))}"
    )
    named = {n for n in listed if n.endswith("/")}
    assert not named - top, f"in DESIGN.md's layout, not in the tree: {sorted(named - top)}"


def test_layout_names_every_subfolder():
    listed = entries(layout_block())
    files = tracked()
    configs = {
        f.split("/")[1] + "/" for f in files if f.startswith("configs/") and f.count("/") >= 2
    }
    said = set(re.findall(r"([\w-]+/)", listed["configs/"].split(None, 1)[1]))
    assert said == configs, f"configs/ in DESIGN.md: {sorted(said)}; in the tree: {sorted(configs)}"
    for pkg, text in listed.items():
        if not pkg.endswith("/") or pkg == "configs/":
            continue
        subs = {f.split("/")[1] + "/" for f in files if f.startswith(pkg) and f.count("/") >= 2}
        subs -= {"data/"}  # package data, not code
        missing = {s for s in subs if not re.search(rf"(^|[\s(]){re.escape(s)}", text)}
        assert not missing, f"DESIGN.md's {pkg} entry does not name {sorted(missing)}"
