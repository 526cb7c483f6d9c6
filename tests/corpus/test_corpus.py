"""The corpus stage (issue "Drafters pretrained on real text", items 1–2): a made-up Debian package
and a folder become filtered, deduplicated documents with a manifest; a source that cannot be had is
one line and the stage goes on; a finished source is not read again; the prefill captures the
features distillation captures, in the files training reads."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from corpus.build import build_language
from corpus.config import CorpusConfig
from corpus.prefill import run_prefill
from polyspec.config import validate
from polyspec.features import prefill_features
from polyspec.languages import get_language
from polyspec.targets import eagle3_layers, load_target

VI = get_language("vi")
DE = get_language("de")
# long Vietnamese paragraphs fastText labels vi
VI_TEXT = [" ".join(s.response.split()) for s in VI.seeds]
EN_LINE = "Click the Insert menu and choose the Table command to open the dialog."


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    return load_target(str(tiny_llama_dir))


def html_page(paragraphs: list[str]) -> str:
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return (
        f"<html><head><title>t</title></head><body><div class='menu'>Menu</div>{body}</body></html>"
    )


def make_deb(tmp_path: Path, package: str, files: dict[str, str], licence: str = "MIT") -> Path:
    """A real .deb (dpkg-deb --build) holding ``files`` and a machine-readable copyright file."""
    root = tmp_path / f"{package}-root"
    shutil.rmtree(root, ignore_errors=True)
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: 1.2-3\nArchitecture: all\n"
        "Maintainer: t <t@example.org>\nDescription: test docs\n"
    )
    doc = root / "usr" / "share" / "doc" / package
    doc.mkdir(parents=True)
    (doc / "copyright").write_text(
        f"Format: https://example.org/copyright-format/1.0/\n\nFiles: *\nLicense: {licence}\n"
    )
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    out = tmp_path / "cache" / "debs" / f"{package}_1.2-3_all.deb"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(root), str(out)],
        check=True,
        capture_output=True,
    )
    return out


def config(tmp_path: Path, target_dir: Path, sources: list[dict], **kw) -> CorpusConfig:
    return validate(
        CorpusConfig,
        {
            "langs": ["vi"],
            "target": str(target_dir),
            "run": str(tmp_path / "run"),
            "cache": str(tmp_path / "cache"),
            "sources": sources,
            **kw,
        },
    )


needs_dpkg = pytest.mark.skipif(
    shutil.which("dpkg-deb") is None, reason="dpkg-deb (Debian's packaging tool) missing"
)


@needs_dpkg
def test_a_package_and_a_folder_become_filtered_deduplicated_documents(
    tmp_path, tiny_llama_dir, llama, monkeypatch
):
    # page 1: three vi paragraphs, an English one (untranslated string), a short label; page 2
    # repeats one of page 1
    make_deb(
        tmp_path,
        "help-vi",
        {
            "usr/share/help/vi/a.html": html_page(
                [VI_TEXT[0], EN_LINE, "Mục lục", VI_TEXT[1], VI_TEXT[2]]
            ),
            "usr/share/help/vi/b.html": html_page([VI_TEXT[1], VI_TEXT[3]]),
            "usr/share/help/de/c.html": html_page([DE.seeds[0].response]),
        },
    )
    folder = tmp_path / "mine" / "vi"
    folder.mkdir(parents=True)
    # one repeat of the package
    (folder / "notes.txt").write_text(f"{VI_TEXT[4]}\n\n{VI_TEXT[0]}\n", encoding="utf-8")
    sources = [
        {
            "name": "help",
            "packages": {"vi": "help-vi"},
            "format": "html",
            "paths": {"vi": ["usr/share/help/vi/*.html"]},
        },
        {
            "name": "mine",
            "kind": "folder",
            "folders": {"*": str(tmp_path / "mine" / "{lang}")},
            "paths": {"vi": ["*.txt"]},
            "licence": "CC0-1.0",
        },
    ]
    # the .deb is in the cache: no apt-get call
    monkeypatch.setenv("PATH", str(tmp_path / "no-apt") + ":/usr/bin:/bin")
    m = build_language(
        config(tmp_path, tiny_llama_dir, sources, max_doc_chars=400),
        "vi",
        llama.tokenizer,
        log=lambda *_: None,
    )
    docs = [
        json.loads(x)
        for x in (tmp_path / "run/corpus/vi/data.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    text = "\n\n".join(d["text"] for d in docs)
    for p in VI_TEXT[:5]:
        assert text.count(p) == 1, "every vi paragraph once, the repeats dropped"
    assert EN_LINE not in text and "Mục lục" not in text and "Menu" not in text
    assert [d["source"] for d in docs[:2]] == ["help", "mine"], "the sources in turns"
    assert all(len(d["text"]) <= 400 or "\n\n" not in d["text"] for d in docs), (
        "documents cut at max_doc_chars"
    )
    help_, mine = m["sources"]["help"], m["sources"]["mine"]
    assert (help_["package"], help_["version"], help_["licence"], help_["files"]) == (
        "help-vi",
        "1.2-3",
        "MIT",
        2,
    )
    assert (help_["kept"], help_["language"], help_["duplicate"]) == (4, 1, 1) and help_[
        "short"
    ] >= 1
    assert (mine["licence"], mine["kept"], mine["duplicate"]) == ("CC0-1.0", 1, 1)
    assert (
        m["tokens"]
        == sum(d["tokens"] for d in docs)
        == sum(len(llama.tokenizer(d["text"], add_special_tokens=False)["input_ids"]) for d in docs)
    )
    assert m["documents"] == len(docs) and m["missing"] == {}

    # resumed: finished sources are read from their parts, not fetched again (the cache is gone)
    shutil.rmtree(tmp_path / "cache")
    again = build_language(
        config(tmp_path, tiny_llama_dir, sources, max_doc_chars=400),
        "vi",
        llama.tokenizer,
        log=lambda *_: None,
    )
    assert again["tokens"] == m["tokens"] and again["sources"]["help"]["kept"] == 4
    # a source inserted before "mine" changes what mine drops as duplicates: mine is rebuilt, help
    # (before it) reused
    (tmp_path / "first").mkdir()
    (tmp_path / "first" / "a.txt").write_text(VI_TEXT[4], encoding="utf-8")
    first = {
        "name": "first",
        "kind": "folder",
        "folders": {"vi": str(tmp_path / "first")},
        "paths": {"vi": ["*.txt"]},
    }
    third = build_language(
        config(tmp_path, tiny_llama_dir, [sources[0], first, sources[1]], max_doc_chars=400),
        "vi",
        llama.tokenizer,
        log=lambda *_: None,
    )
    # reused: its package is gone
    assert third["missing"] == {} and third["sources"]["help"]["kept"] == 4
    assert (third["sources"]["mine"]["kept"], third["sources"]["mine"]["duplicate"]) == (0, 2)

    # max_tokens cuts whole documents
    shutil.rmtree(tmp_path / "run")
    make_deb(tmp_path, "help-vi", {"usr/share/help/vi/a.html": html_page(VI_TEXT[:3])})
    cut = build_language(
        config(tmp_path, tiny_llama_dir, sources[:1], max_doc_chars=100, max_tokens=5),
        "vi",
        llama.tokenizer,
        log=lambda *_: None,
    )
    assert cut["documents"] == 1 and cut["tokens"] >= 5


def test_a_source_that_cannot_be_had_is_one_line_and_the_stage_goes_on(
    tmp_path, tiny_llama_dir, llama, monkeypatch
):
    (tmp_path / "mine" / "vi").mkdir(parents=True)
    (tmp_path / "mine" / "vi" / "a.txt").write_text(VI_TEXT[0], encoding="utf-8")
    sources = [
        {"name": "deb", "packages": {"vi": "no-such-package-vi"}, "paths": {"vi": ["*"]}},
        {
            "name": "gone",
            "kind": "folder",
            "folders": {"vi": str(tmp_path / "nowhere")},
            "paths": {"vi": ["*"]},
        },
        {
            "name": "mine",
            "kind": "folder",
            "folders": {"vi": str(tmp_path / "mine" / "vi")},
            "paths": {"vi": ["*"]},
        },
        {"name": "de-only", "packages": {"de": "x"}, "paths": {"de": ["*"]}},
    ]
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get here: a non-Debian host
    said = []
    m = build_language(
        config(tmp_path, tiny_llama_dir, sources), "vi", llama.tokenizer, log=said.append
    )
    assert m["missing"] == {
        "deb": "no-such-package-vi: apt-get not found (not a Debian-family host)",
        "gone": f"folder {tmp_path / 'nowhere'} not found",
    }
    assert [x for x in said if "skipped" in x] == [
        f"corpus vi: {k} skipped: {v}" for k, v in m["missing"].items()
    ]
    assert list(m["sources"]) == ["mine"] and m["documents"] == 1

    from polyspec.errors import PolyspecError

    with pytest.raises(PolyspecError, match="no document from any source"):
        build_language(
            config(tmp_path, tiny_llama_dir, sources[:2], run=str(tmp_path / "r2")),
            "vi",
            llama.tokenizer,
            log=lambda *_: None,
        )


def test_the_default_config_names_a_source_for_every_builtin_language():
    from polyspec.config import load_config
    from polyspec.languages import builtin_codes
    from polyspec.paths import configs_dir

    cfg = load_config(CorpusConfig, configs_dir() / "corpus" / "default.yaml", [])
    for code in builtin_codes():
        assert sum(s.location(code) is not None for s in cfg.sources) >= 3, code


# ------------------------------------------------------------------------------------------ prefill


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_prefill_features_equal_what_distillation_captures(family, tiny_llama_dir, tiny_gemma_dir):
    """The same ids through the generating engine (capture) and through one padded, length-bucketed
    prefill."""
    from synth.engines import Request, TransformersEngine

    t = load_target(str(tiny_llama_dir if family == "llama" else tiny_gemma_dir))
    aux = eagle3_layers(t.num_layers)
    reqs = [
        Request(p, seed=i, temperature=0.0, max_new_tokens=n)
        for i, (p, n) in enumerate(zip(VI_TEXT[:3] + [DE.seeds[0].instruction], (9, 4, 12, 6)))
    ]
    got = TransformersEngine(t, batch_size=4).generate(reqs, capture=aux)
    feats = prefill_features(
        t, [r.ids for r in got], aux, batch_tokens=2 * max(len(r.ids) for r in got)
    )
    assert len({len(r.ids) for r in got}) == 4, "rows of different lengths share padded batches"
    for r, f in zip(got, feats):
        torch.testing.assert_close(f["f"], r.features["f"], atol=1e-4, rtol=0)
        torch.testing.assert_close(f["aux"], r.features["aux"], atol=1e-4, rtol=0)


def test_prefill_writes_shards_training_reads_and_resumes(tmp_path, tiny_llama_dir, llama):
    from train.data import build_dataset

    run = tmp_path / "run"
    (run / "corpus" / "vi").mkdir(parents=True)
    docs = [
        {"id": f"d{i}", "lang": "vi", "source": "mine", "text": " ".join(VI_TEXT) * (i + 1)}
        for i in range(3)
    ]
    (run / "corpus" / "vi" / "data.jsonl").write_text(
        "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
    )
    stats = run_prefill(llama, "vi", run, seq_len=64, shard_chunks=4, log=lambda *_: None)
    out = run / "corpus" / "vi-prefill"
    recs = [json.loads(x) for x in (out / "data.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(recs) == stats["chunks"] > 4 and len(
        list((out / "features").glob("*.safetensors"))
    ) == -(-len(recs) // 4)
    assert stats["tokens"] == sum(r["tokens"] for r in recs) and stats["tokens_per_second"] > 0
    ds = build_dataset(
        [str(out / "data.jsonl")],
        llama,
        str(run),
        "vi",
        max_length=64,
        response_only=False,
        captured=True,
    )
    assert len(ds.examples) == len(recs) and ds.skipped == 0
    bos = llama.tokenizer.bos_token_id
    assert all(
        ex.input_ids[0] == bos
        and len(ex.input_ids) <= 64
        and ex.loss_mask == [0] + [1] * (len(ex.input_ids) - 1)
        for ex in ds.examples
    )
    whole = llama.tokenizer(docs[0]["text"], add_special_tokens=False)["input_ids"]
    assert ds.examples[0].input_ids[1:] == whole[:63], "a chunk is BOS + the document's own tokens"

    # killed after two shards: the rerun captures the rest only, and the files equal an
    # uninterrupted run's
    first = (out / "data.jsonl").read_bytes()
    for p in sorted((out / "parts").glob("*.jsonl"))[2:]:
        p.unlink()
    (out / "data.jsonl").unlink()
    again = run_prefill(llama, "vi", run, seq_len=64, shard_chunks=4, log=lambda *_: None)
    assert (out / "data.jsonl").read_bytes() == first
    assert again["captured_tokens"] == stats["tokens"] - sum(r["tokens"] for r in recs[:8])

    from polyspec.errors import PolyspecError

    with pytest.raises(PolyspecError, match="other settings"):
        run_prefill(llama, "vi", run, seq_len=32, log=lambda *_: None)


@pytest.mark.smoke
def test_the_corpus_cli_builds_a_folder_corpus_and_prefills_it(tmp_path, tiny_llama_dir):
    """One stage's CLI end to end on the tiny target (`make test`'s stage smoke): corpus, then
    prefill."""
    (tmp_path / "mine" / "vi").mkdir(parents=True)
    (tmp_path / "mine" / "vi" / "a.txt").write_text("\n\n".join(VI_TEXT), encoding="utf-8")
    cfg = tmp_path / "corpus.yaml"
    cfg.write_text(
        f"# python -m corpus --config {cfg}\nsources:\n  - name: mine\n    kind: folder\n"
        f"    folders: {{vi: {tmp_path / 'mine' / 'vi'}}}\n    paths: {{vi: ['*.txt']}}\n"
    )
    run = tmp_path / "run"
    proc = run_cli(
        "-m",
        "corpus",
        "--config",
        str(cfg),
        "--langs",
        "vi",
        "--target",
        str(tiny_llama_dir),
        "--run",
        str(run),
    )
    assert proc.returncode == 0, proc.stderr
    m = json.loads((run / "corpus/vi/manifest.json").read_text())
    assert m["sources"]["mine"]["kept"] == len(VI_TEXT) and f"{m['tokens']:,}" in proc.stdout
    proc = run_cli(
        "-m",
        "corpus",
        "prefill",
        "--lang",
        "vi",
        "--target",
        str(tiny_llama_dir),
        "--run",
        str(run),
        "--seq-len",
        "32",
    )
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((run / "corpus/vi-prefill/stats.json").read_text())
    assert stats["tokens"] > 0.9 * m["tokens"] and stats["aux_layers"] == eagle3_layers(
        llama_layers(tiny_llama_dir)
    )


def llama_layers(target_dir: Path) -> int:
    return json.loads((target_dir / "config.json").read_text())["num_hidden_layers"]
