import json

import pytest

from polyspec.io import atomic_directory, atomic_write_json


def test_atomic_write_json_replaces_whole_file(tmp_path):
    p = tmp_path / "a" / "x.json"
    atomic_write_json(p, {"a": 1})
    atomic_write_json(p, {"b": "ü"})
    assert json.loads(p.read_text(encoding="utf-8")) == {"b": "ü"}
    assert [f.name for f in p.parent.iterdir()] == ["x.json"]  # no temp files left


def test_atomic_directory_failure_leaves_nothing(tmp_path):
    dest = tmp_path / "bundle"
    with pytest.raises(RuntimeError):
        with atomic_directory(dest) as tmp:
            (tmp / "half.bin").write_bytes(b"123")
            raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []


def test_atomic_directory_overwrite(tmp_path):
    dest = tmp_path / "d"
    with atomic_directory(dest) as tmp:
        (tmp / "v1").write_text("1")
    with pytest.raises(FileExistsError):
        with atomic_directory(dest) as tmp:
            (tmp / "v2").write_text("2")
    assert [f.name for f in dest.iterdir()] == ["v1"]
    with atomic_directory(dest, overwrite=True) as tmp:
        (tmp / "v2").write_text("2")
    assert [f.name for f in dest.iterdir()] == ["v2"]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["d"]
