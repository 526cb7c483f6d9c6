"""A non-editable install works away from the repository: the wheel carries the configs (as
polyspec/_configs/) and the stages' data files, and a pipeline dry run from another folder finds
them all. Nothing is downloaded: the wheel is built with the current environment's setuptools and
installed without dependencies into a fresh virtual environment, which borrows this environment's
third-party packages through PYTHONPATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import PACKAGES, REPO

SOURCES = ("pyproject.toml", "README.md", "configs", *PACKAGES)


@pytest.mark.slow
def test_a_wheel_install_runs_a_dry_run_outside_the_repository(tmp_path):
    # a copy: building in place would leave build/ and egg-info in the repository
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    wheel = next(wheels.glob("polyspec-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {
        p.relative_to(REPO / "configs").as_posix() for p in (REPO / "configs").rglob("*.yaml")
    }
    assert {f"polyspec/_configs/{c}" for c in configs} <= names, "every config ships in the wheel"
    assert {
        "synth/data/heldout.jsonl",
        "decoder/data/mini_multispecbench.jsonl",
        "train/drafter.py",
        "engines/llamacpp/__main__.py",
        "engines/vllm/__main__.py",
    } <= names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    )
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    # the installed copy first, then this environment's third-party packages (its own editable
    # polyspec is a .pth finder, which PYTHONPATH does not run)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([site, sysconfig.get_paths()["purelib"]]),
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("POLYSPEC_CONFIGS", None)
    where = subprocess.run(
        [str(py), "-c", "import polyspec.paths as p; print(p.__file__); print(p.configs_dir())"],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
    )
    assert where.returncode == 0, where.stderr[-2000:]
    module, configs_dir = where.stdout.split()
    assert Path(module).is_relative_to(site) and configs_dir == str(
        Path(site) / "polyspec" / "_configs"
    )
    proc = subprocess.run(
        [str(py), "-m", "pipelines", "run", "--profile", "cpu-demo", "--langs", "vi", "--dry-run"],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dry run:" in proc.stdout and "_configs/train/eagle-cpu.yaml" in proc.stdout
