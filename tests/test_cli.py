"""The command line: every `python -m` command answers --help; bad input is one line on stderr, a
non-zero exit (2 from the CLIs themselves), no traceback."""

import re

import pytest

from conftest import PACKAGES, REPO, run_cli


def assert_one_line_error(proc, *needles):
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0]


def test_unknown_target():
    assert_one_line_error(
        run_cli("-m", "polyspec.targets", "info", "does-not-exist"), "does-not-exist", "gemma3-270m"
    )


def test_unknown_language():
    assert_one_line_error(run_cli("-m", "polyspec.languages", "check", "vi,xx"), "'xx'", "vi")


def test_unreadable_cache(tmp_path):
    bad = tmp_path / "cache" / "targets" / "gemma3-270m-1.0.0"
    bad.mkdir(parents=True)
    (bad / "polyspec_target.json").write_text("{}")
    (bad / "config.json").write_text("{broken")
    proc = run_cli(
        "-m",
        "polyspec.targets",
        "info",
        "gemma3-270m",
        env={"POLYSPEC_CACHE": str(tmp_path / "cache")},
    )
    assert_one_line_error(proc, str(bad))


def test_languages_cli_lists_and_shows():
    proc = run_cli("-m", "polyspec.languages", "list")
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 7
    proc = run_cli("-m", "polyspec.languages", "show", "ja")
    assert proc.returncode == 0 and "__label__ja" in proc.stdout


def test_targets_cli_info_on_local_folder(tiny_llama_dir):
    proc = run_cli("-m", "polyspec.targets", "info", str(tiny_llama_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    assert '"vocab_size": 768' in proc.stdout and '"layers": 2' in proc.stdout


@pytest.mark.parametrize(
    "args,needles",
    [
        (["synth", "LANG=xx"], ["'xx'", "vi"]),
        (["vocab", "LANGS=vi,qq"], ["'qq'"]),
        (["synth", "LANG=vi", "TARGET=does-not-exist"], ["does-not-exist"]),
    ],
)
def test_make_bad_input(args, needles):
    proc = run_cli("make", "-s", *args)
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in errors[0]


def test_make_lang_comes_only_from_the_command_line():
    # The shell's LANG is a locale: ignored, default language used, locale passed on untouched.
    proc = run_cli("make", "-s", "show-config", env={"LANG": "C.UTF-8"})
    assert "lang=vi" in proc.stdout and "child_LANG=C.UTF-8" in proc.stdout, proc.stdout
    # Given on the command line it is the language, and children still get a locale, not "de".
    proc = run_cli("make", "-s", "show-config", "LANG=de", env={"LANG": "C.UTF-8"})
    assert "lang=de" in proc.stdout and "child_LANG=C.UTF-8" in proc.stdout, proc.stdout


def test_stage_clis_without_a_command_print_usage():
    # every stage is implemented now (this used to check the "not implemented yet" placeholders)
    for mod in ("pipelines", "decoder"):
        proc = run_cli("-m", mod)
        assert proc.returncode != 0 and "usage:" in proc.stderr, mod


def test_repo_layout():
    for d in (
        "pipelines",
        "synth",
        "train",
        "vocab",
        "export",
        "decoder",
        "engines",
        "configs",
        "tests",
        "polyspec",
    ):
        assert (REPO / d).is_dir(), d
    for f in ("Makefile", "pyproject.toml", "README.md", ".ci/run"):
        assert (REPO / f).is_file(), f
    import importlib

    for pkg in PACKAGES:
        doc = importlib.import_module(pkg).__doc__
        assert doc and len(doc.split()) > 20, (
            f"{pkg} needs a module docstring saying what it reads and writes"
        )


# -- every command's --help, in this process (no interpreter start-up per command) -----------------


def cli_modules() -> list[str]:
    """What ``python -m`` runs: each package with a ``__main__.py`` and each module with a
    ``__main__`` guard."""
    found = set()
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            if path.name == "__main__.py":
                found.add(name.rpartition(".")[0])
            elif 'if __name__ == "__main__"' in path.read_text(encoding="utf-8"):
                found.add(name)
    return sorted(found)


def run_module(module: str, *args: str, capsys) -> tuple[object, str, str]:
    """``python -m module args…`` in this process → (exit code, stdout, stderr)."""
    import runpy
    import sys
    import warnings

    saved = sys.argv
    sys.argv = [module, *args]
    code = None
    try:
        # runpy: "found in sys.modules … prior to execution" for imported modules
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = saved
    out = capsys.readouterr()
    return code, out.out, out.err


def test_every_documented_command_is_a_cli():
    docs = [
        REPO / "README.md",
        REPO / "DEVELOPERS.md",
        REPO / "Makefile",
        *sorted((REPO / "docs").glob("*.md")),
    ]
    named = {
        m
        for f in docs
        for m in re.findall(r"(?:python|\$\(PY\)) -m ([A-Za-z_][\w.]*)", f.read_text())
        if m.split(".")[0] in PACKAGES
    }
    # the scan works
    assert {"synth", "vocab", "export", "decoder", "pipelines", "polyspec.targets"} <= named
    missing = sorted(named - set(cli_modules()))
    assert not missing, f"documented but not runnable with python -m: {missing}"


@pytest.mark.parametrize("module", cli_modules())
def test_every_cli_answers_help(module, capsys):
    code, out, err = run_module(module, "--help", capsys=capsys)
    assert code == 0 and out.startswith("usage: "), (module, code, out[-500:], err[-500:])
    # argparse's subparsers, not choices
    subcommands = re.search(r" \{([\w,-]+)\} \.\.\.", out.splitlines()[0])
    # and each subcommand's own --help
    for sub in subcommands.group(1).split(",") if subcommands else []:
        code, out, err = run_module(module, sub, "--help", capsys=capsys)
        assert code == 0 and out.startswith("usage: ") and f" {sub} " in out.splitlines()[0], (
            module,
            sub,
            err,
        )


@pytest.mark.parametrize(
    "args,needles",
    [
        (["pipelines", "run", "--profile", "nope", "--dry-run"], ["'nope'", "cpu-demo"]),
        (["polyspec.languages", "check", "vi,xx"], ["'xx'", "vi"]),
        (["pipelines", "run", "--langs", "vi,qq", "--dry-run"], ["'qq'"]),
    ],
)
def test_a_bad_argument_is_one_error_line_and_exit_2(args, needles, capsys):
    code, out, err = run_module(*args, capsys=capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    for n in needles:
        assert n in lines[0], (n, lines[0])
