import json

import pytest

from polyspec.errors import PolyspecError
from polyspec.io import atomic_directory, atomic_write_json, read_jsonl


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
    metas = [
        {"k1": "1", "k2": "two", "k3": "3"},
        {"k3": "3", "k1": "1", "k2": "two"},
        {"k2": "two", "k3": "3", "k1": "1"},
    ]
    outs = {canonical_safetensors(save(x, metadata=m)) for m in metas for _ in range(3)}
    assert len(outs) == 1
    path = tmp_path / "t.safetensors"
    path.write_bytes(outs.pop())
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == metas[0]
        assert (f.get_tensor("a") == x["a"]).all() and (f.get_tensor("b") == x["b"]).all()


def test_read_jsonl_skips_and_counts_torn_and_malformed_lines(tmp_path):
    p = tmp_path / "data.jsonl"
    p.write_bytes(
        b'{"a": 1}\n\n[1, 2]\n{"a": 2, "s": "\xc3\xa9"}\nnot json\n{"a": "\xc3"}\n{"a": 3}\n'
        b'{"a": 4, "t'
    )
    notes = []
    records = read_jsonl(p, log=notes.append)
    assert [r["a"] for r in records] == [1, 2, 3]
    # a list, not JSON, cut UTF-8, torn end
    assert records.skipped == 4 and records.bad_lines == [3, 5, 6, 8]
    assert len(notes) == 1 and "skipped 4" in notes[0] and str(p) in notes[0]
    assert [r["a"] for r in read_jsonl(p, log=None)] == [1, 2, 3]  # iterating again re-reads


def test_read_jsonl_strict_is_a_one_line_error_naming_the_line(tmp_path):
    p = tmp_path / "questions.jsonl"
    p.write_text('{"q": 1}\n{"q": \n', encoding="utf-8")
    with pytest.raises(PolyspecError, match=rf"{p.name}:2: not a JSON object") as e:
        list(read_jsonl(p, strict=True))
    assert "\n" not in str(e.value)


def test_read_jsonl_notes_skips_when_the_reader_stops_early(tmp_path):
    p = tmp_path / "big.jsonl"
    p.write_text('{"a": 1}\n{"a"\n{"a": 2}\n{"a": 3}\n', encoding="utf-8")
    notes = []
    it = iter(read_jsonl(p, log=notes.append))
    assert next(it) == {"a": 1} and next(it) == {"a": 2}
    # a capped stream (vocab max_tokens) stops reading: the skip seen so far is still reported
    it.close()
    assert len(notes) == 1 and "skipped 1" in notes[0]
