"""The project's import graph, read from the source with ``ast`` (nothing is imported): no import
cycles, and the layering DESIGN.md fixes — ``polyspec`` imports no stage; a stage imports another
stage only through that stage's public modules; ``pipelines`` (the orchestrator) may also import the
stages' configs and CLIs; ``engines`` (the engine checks, run on the export's output) may also
import export's engine formats, and nothing imports ``engines``.

Every import counts, top-level and function-local alike: a cycle hidden in a function body still
ties two modules together, and the next person to hoist the import gets an ImportError."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import PACKAGES, REPO

# A stage's public modules: what other stages may import (DESIGN.md "Layout" and "Stage files").
PUBLIC = {
    "vocab.files",  # ranked vocabularies: load/save, tokenizer check
    "vocab.masks",  # language masks: build/save/load, size offsets
    "export.bundle",  # the bundle format: load_bundle / write_bundle
    "decoder.core",  # Decoder, the runtime's API (README "Serve the drafters"; docs/stages.md)
    "decoder.methods",  # the registry of decoding methods (names a profile's eval may list)
}
# pipelines runs the stages: besides their public modules it reads their configs and CLIs, and
# score_check recomputes the training score itself.
PIPELINES_MAY_IMPORT = {"train.score"}
# engines measures the export's formats inside the engines: besides the stages' public modules it
# reads and writes those formats (the speculators layout, llama.cpp's GGUF conversion). Stages and
# pipelines never import engines.
# and the decoder bench's question files (users bench their own prompts in the engines too).
ENGINES_MAY_IMPORT = {"export.interop", "export.gguf", "decoder.bench.questions"}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(root: Path, packages) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``: dotted name -> file (``pkg/__init__.py`` is
    ``pkg``)."""
    mods = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            mods[module_name(root, path)] = path
    return mods


def imported_modules(tree: ast.AST, name: str, is_package: bool, modules) -> list[tuple[str, int]]:
    """The project modules one file imports, with line numbers, anywhere in the file (function
    bodies too).

    ``import a.b`` is a.b; ``from a import b`` is a.b when that is a module, else a (its __init__);
    relative imports are resolved against the importing module's package. Names outside ``modules``
    are dropped."""

    def deepest(dotted: str) -> str | None:  # the module itself, or the nearest enclosing one
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in modules:
                return ".".join(parts[:i])
        return None

    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(deepest(a.name), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = (
                    package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    if package
                    else []
                )
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((sub if sub in modules else deepest(base), node.lineno))
    return [(m, line) for m, line in found if m is not None]


def import_graph(root: Path, packages=PACKAGES) -> dict[str, dict[str, int]]:
    """module -> {imported project module: first line importing it}."""
    modules = project_modules(root, packages)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges = {}
        for dst, line in imported_modules(tree, name, path.name == "__init__.py", modules):
            edges.setdefault(dst, line)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import cycles: each strongly connected component of more than one module, or a module
    importing itself, as the sorted list of its modules (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, sccs = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    scc = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        scc.append(w)
                        if w == v:
                            break
                    if len(scc) > 1 or v in graph[v]:
                        sccs.append(sorted(scc))
    return sorted(sccs)


def describe(cycle: list[str], graph, root: Path = REPO) -> str:
    """One cycle's edges with where each import is: 'a -> b (a.py:12)', ..."""
    members = set(cycle)
    return "; ".join(
        f"{src} -> {dst} ({src.replace('.', '/')}.py:{line})"
        for src in cycle
        for dst, line in sorted(graph[src].items())
        if dst in members
    )


def package_of(module: str) -> str:
    return module.split(".")[0]


def layering_violations(graph) -> list[str]:
    bad = []
    for src, edges in sorted(graph.items()):
        for dst, line in sorted(edges.items()):
            a, b = package_of(src), package_of(dst)
            if a == b or b == "polyspec":
                continue
            where = f"{src} imports {dst} (line {line})"
            if a == "polyspec":
                bad.append(f"{where}: the shared package imports no stage")
            elif b == "pipelines":
                bad.append(f"{where}: no stage imports the orchestrator")
            elif b == "engines":
                bad.append(f"{where}: nothing imports the engine checks")
            elif dst in PUBLIC:
                continue
            elif a == "pipelines" and (
                dst == b
                or dst.rsplit(".", 1)[-1] in ("config", "__main__")
                or dst in PIPELINES_MAY_IMPORT
            ):
                continue
            elif a == "engines" and dst in ENGINES_MAY_IMPORT:
                continue
            else:
                bad.append(
                    f"{where}: not {b}'s public API "
                    f"({', '.join(sorted(m for m in PUBLIC if package_of(m) == b)) or 'none'})"
                )
    return bad


# -- the project -----------------------------------------------------------------------------------


def test_the_project_has_no_import_cycles():
    graph = import_graph(REPO)
    # the walk found the code
    assert len(graph) > 50 and "decoder.core" in graph and "polyspec.targets" in graph
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(describe(c, graph) for c in cycles)


def test_stages_import_each_other_only_through_public_modules():
    bad = layering_violations(import_graph(REPO))
    assert not bad, "\n".join(bad)


def test_the_public_modules_exist():
    graph = import_graph(REPO)
    assert not (PUBLIC | PIPELINES_MAY_IMPORT | ENGINES_MAY_IMPORT) - set(graph)


# -- the checker itself, on synthetic packages -----------------------------------------------------


def write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_cycle_through_function_local_and_relative_imports_is_found(tmp_path):
    write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",  # `from pkg import b`: the submodule b
            "pkg/b.py": "def f():\n    from .c import g\n",  # function-local, relative
            "pkg/c.py": "import pkg.a\n",
            "pkg/d.py": "from pkg.a import thing\n",  # into the cycle, not part of it
            # a name of __init__ itself: a self-loop
            "other/__init__.py": "from other import helper\n",
            # a name, not a module: imports other/__init__
            "other/helper_user.py": "from other import helper\n",
        },
    )
    graph = import_graph(tmp_path, ("pkg", "other"))
    assert graph["pkg.b"] == {"pkg.c": 2} and graph["other.helper_user"] == {"other": 1}
    assert find_cycles(graph) == [["other"], ["pkg.a", "pkg.b", "pkg.c"]]
    assert "pkg.b -> pkg.c (pkg/b.py:2)" in describe(["pkg.a", "pkg.b", "pkg.c"], graph)


def test_an_acyclic_package_passes_and_parent_relative_imports_resolve(tmp_path):
    write_package(
        tmp_path,
        {
            "pkg/__init__.py": "from .sub import x\n",
            "pkg/base.py": "import os\nimport numpy\n",
            "pkg/sub/__init__.py": "from ..base import y\nfrom . import leaf\n",
            "pkg/sub/leaf.py": "from .. import base\n",
        },
    )
    graph = import_graph(tmp_path, ("pkg",))
    assert graph == {
        "pkg": {"pkg.sub": 1},
        "pkg.base": {},
        "pkg.sub": {"pkg.base": 1, "pkg.sub.leaf": 2},
        "pkg.sub.leaf": {"pkg.base": 1},
    }
    assert find_cycles(graph) == []


def test_layering_rules_flag_internals_and_allow_public_modules():
    graph = {
        "decoder.core": {"vocab.masks": 3, "train.recipe": 7, "polyspec.targets": 1},
        "polyspec.targets": {"decoder.core": 9},
        "pipelines.plan": {"train.config": 2, "vocab.__main__": 4, "decoder.bench.speed": 5},
        "export.bundle": {"pipelines.run": 1},
    }
    bad = layering_violations(graph)
    assert [b.split(":")[0] for b in bad] == [
        "decoder.core imports train.recipe (line 7)",
        "export.bundle imports pipelines.run (line 1)",
        "pipelines.plan imports decoder.bench.speed (line 5)",
        "polyspec.targets imports decoder.core (line 9)",
    ]


def test_engines_read_the_export_formats_and_nothing_imports_them():
    graph = {
        "engines.llamacpp.run": {
            "export.gguf": 1,
            "export.bundle": 2,
            "train.recipe": 3,
            "engines.common": 4,
        },
        "engines.vllm.run": {"export.interop": 1, "polyspec.vllm_process": 2},
        "export.gguf": {"engines.llamacpp.build": 5},
        "pipelines.report": {"engines.vllm.report": 6},
        "polyspec.io": {"engines.common": 8},
        "decoder.core": {"export.interop": 7},
    }
    bad = layering_violations(graph)
    assert [b.split(":")[0] for b in bad] == [
        "decoder.core imports export.interop (line 7)",
        "engines.llamacpp.run imports train.recipe (line 3)",
        "export.gguf imports engines.llamacpp.build (line 5)",
        "pipelines.report imports engines.vllm.report (line 6)",
        "polyspec.io imports engines.common (line 8)",
    ]


@pytest.mark.parametrize(
    "graph,expected",
    [
        ({"a": {"b": 1}, "b": {"c": 1}, "c": {}}, []),
        ({"a": {"b": 1}, "b": {"a": 1}, "c": {"c": 1}}, [["a", "b"], ["c"]]),
        (
            {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1, "d": 1}, "d": {"e": 1}, "e": {"d": 1}},
            [["a", "b", "c"], ["d", "e"]],
        ),
    ],
)
def test_find_cycles(graph, expected):
    assert find_cycles(graph) == expected
