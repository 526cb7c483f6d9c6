"""Packs (synth/pack.py): a distillation packed without its features, unpacked on another disk,
gets the features back from the target's prefill and resumes as if never moved."""

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load

from conftest import run_cli
from polyspec.config import validate
from polyspec.errors import PolyspecError
from polyspec.features import FeatureReader
from polyspec.targets import load_target
from synth import pack
from synth.config import DistillConfig
from synth.distill import run_distill


def _cfg(run: Path, target_dir: Path, **extra) -> DistillConfig:
    return validate(
        DistillConfig,
        {
            "lang": "en",
            "run": str(run),
            "target": str(target_dir),
            "prompts": "pool",
            "limit": 6,
            "temperatures": [0.0, 1.0],
            "sampling": {"max_new_tokens": 6},
            "engine": {"batch_size": 2},
            "batches_per_commit": 1,
            "capture_features": True,
            "feature_layers": "eagle3",
            **extra,
        },
    )


def test_an_unfinished_distillation_moves_by_pack_and_resumes_as_one_run(tmp_path, tiny_llama_dir):
    t = load_target(str(tiny_llama_dir), device="cpu", dtype="float32")
    whole = run_distill(_cfg(tmp_path / "whole", tiny_llama_dir), target=t)
    cut = run_distill(_cfg(tmp_path / "a", tiny_llama_dir, max_seconds=1e-6), target=t)
    assert cut["complete"] is False and 0 < cut["attempted"] < whole["attempted"]
    src = tmp_path / "a" / "synth" / "en-distill"

    packed = pack.pack(src, tmp_path / "a", tmp_path / "packs")
    assert packed.name == "synth+en-distill.tar.xz"
    again = pack.pack(src, tmp_path / "a", tmp_path / "again")
    assert packed.read_bytes() == again.read_bytes(), "the same folder packs to the same bytes"
    with tarfile.open(packed) as tar:
        names = tar.getnames()
        shard = next(n for n in names if n.endswith(".safetensors"))
        keys = set(load(tar.extractfile(shard).read()))
    assert {"synth/en-distill/progress.json", "synth/en-distill/data.jsonl"} <= set(names)
    assert keys and all(k.endswith((".ids", ".start")) for k in keys), "no features packed"

    # another disk: the CLI unpacks and refills the features from the target's prefill
    got = run_cli(
        "-m", "synth", "unpack", str(packed), "--run", str(tmp_path / "b"),
        "--target", str(tiny_llama_dir), "--dtype", "float32", "--device", "cpu",
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    dst = tmp_path / "b" / "synth" / "en-distill"
    assert not pack.ids_only_shards(dst)
    reader = FeatureReader(t.spec.name, t.tokenizer_sha256)
    recs = [json.loads(x) for x in (dst / "data.jsonl").read_text().splitlines()]
    assert recs and (dst / "data.jsonl").read_bytes() == (src / "data.jsonl").read_bytes()
    for rec in recs:
        a, b = str(src / rec["features_file"]), str(dst / rec["features_file"])
        assert reader.ids(a, rec["id"]) == reader.ids(b, rec["id"])
        for name in ("f", "aux"):  # both bf16 on disk: a rounding step apart at most
            torch.testing.assert_close(
                reader.get(b, rec["id"], name).float(),
                reader.get(a, rec["id"], name).float(),
                atol=2e-2,
                rtol=1e-2,
            )

    # the restored store resumes: the records of one uninterrupted run, every one with features
    done = run_distill(_cfg(tmp_path / "b", tiny_llama_dir), target=t)
    assert done["complete"] and done["attempted"] == whole["attempted"]
    strip = lambda rs: [{k: v for k, v in r.items() if k != "lid"} for r in rs]  # noqa: E731
    want = [
        json.loads(x)
        for x in (tmp_path / "whole/synth/en-distill/data.jsonl").read_text().splitlines()
    ]
    have = [json.loads(x) for x in (dst / "data.jsonl").read_text().splitlines()]
    assert strip(have) == strip(want)
    for rec in have:
        assert reader.get(str(dst / rec["features_file"]), rec["id"]).shape[0] > 0

    # a kept disk wins: unpacking onto an existing folder leaves it as it is
    before = (dst / "data.jsonl").read_bytes()
    assert (
        pack.unpack(packed, tmp_path / "b") == dst and (dst / "data.jsonl").read_bytes() == before
    )


def test_a_pack_with_a_member_outside_its_folder_is_refused(tmp_path):
    bad = tmp_path / "synth+en-distill.tar.xz"
    with tarfile.open(bad, "w:xz") as tar:
        info = tarfile.TarInfo("elsewhere/data.jsonl")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(
        PolyspecError, match=r"elsewhere/data.jsonl.* is not a file of synth/en-distill/"
    ):
        pack.unpack(bad, tmp_path / "run")
    assert not (tmp_path / "run" / "synth" / "en-distill").exists()
    with pytest.raises(PolyspecError, match="not a synth pack"):
        pack.unpack(tmp_path / "x.zip", tmp_path / "run")
    with pytest.raises(PolyspecError, match="its folder's path in the run"):
        pack.unpack(tmp_path / "synth+..+x.tar.xz", tmp_path / "run")


def test_folders_without_features_pack_with_their_subfolders_and_stay_in_the_run(tmp_path):
    run = tmp_path / "run"
    (run / "vocab" / "en").mkdir(parents=True)
    (run / "vocab" / "DONE.json").write_text("{}")
    (run / "vocab" / "en" / "ranked.json").write_text("[1, 2]")
    (run / "vocab" / "en.safetensors").write_bytes(b"\x00\x01 not only text")
    p = pack.pack(run / "vocab", run, tmp_path / "packs")
    assert p.name == "vocab.tar.xz"
    shutil.rmtree(run / "vocab")
    out = pack.unpack(p, run)
    assert out == run / "vocab" and (out / "en" / "ranked.json").read_text() == "[1, 2]"
    assert (out / "en.safetensors").read_bytes() == b"\x00\x01 not only text", "every file"
    assert not pack.ids_only_shards(out) and [x.name for x in run.iterdir()] == ["vocab"]
    with pytest.raises(PolyspecError, match="is not inside the run"):
        pack.pack(run / "vocab", tmp_path / "other", tmp_path / "packs")
