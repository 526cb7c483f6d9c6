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


def test_canonical_safetensors_gives_the_same_bytes_whatever_the_metadata_order(tmp_path):
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save

    from polyspec.io import canonical_safetensors

    x = {"a": np.arange(5, dtype=np.int32), "b": np.ones((2, 3), dtype=np.float32)}
    metas = [{"k1": "1", "k2": "two", "k3": "3"}, {"k3": "3", "k1": "1", "k2": "two"}, {"k2": "two", "k3": "3", "k1": "1"}]
    outs = {canonical_safetensors(save(x, metadata=m)) for m in metas for _ in range(3)}
    assert len(outs) == 1
    path = tmp_path / "t.safetensors"
    path.write_bytes(outs.pop())
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == metas[0]
        assert (f.get_tensor("a") == x["a"]).all() and (f.get_tensor("b") == x["b"]).all()
