import json
import shutil

import pytest
import torch

from polyspec.errors import PolyspecError
from polyspec.targets import (
    CACHE_RECORD,
    DEFAULT_TARGET,
    check_pin,
    greedy_generate,
    load_target,
    registry_names,
    resolve_target,
    target_cache_path,
    tokenizer_sha256,
)
from polyspec.testing import build_tiny_model, build_tokenizer


def test_registry_has_defaults_and_presets():
    assert DEFAULT_TARGET == "gemma3-270m"
    assert {
        "gemma3-270m",
        "smollm2-135m-instruct",
        "llama-3.1-8b-instruct",
        "qwen2.5-7b-instruct",
    } <= set(registry_names())
    gemma = resolve_target("gemma3-270m")
    assert gemma.source == "gguf-package" and gemma.prompt_format.kind == "completion"
    assert gemma.prompt_format.stop, "a base model needs next-turn stop strings"
    assert resolve_target("smollm2-135m-instruct").prompt_format.kind == "chat-template"
    for preset in ("llama-3.1-8b-instruct", "qwen2.5-7b-instruct"):
        spec = resolve_target(preset)
        assert spec.source == "hf" and "/" in spec.model_id and not spec.trust_remote_code


def test_hub_ids_and_unknown_names():
    spec = resolve_target("some-org/some-model")
    assert spec.source == "hf" and spec.model_id == "some-org/some-model"
    with pytest.raises(PolyspecError) as e:
        resolve_target("does-not-exist")
    assert "\n" not in str(e.value) and "gemma3-270m" in str(e.value)


def test_missing_hub_model_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PolyspecError) as e:
        load_target("polyspec-test/no-such-model")
    assert "\n" not in str(e.value) and "HF_HUB_OFFLINE" in str(e.value)


def test_local_folder_loads_with_facts(tiny_target_dir):
    t = load_target(str(tiny_target_dir))
    assert t.device.type == "cpu" and t.dtype == torch.float32
    assert t.vocab_size == len(t.tokenizer) and t.hidden_size == 64 and t.num_layers == 2
    assert not any(p.requires_grad for p in t.model.parameters())
    assert not t.model.training
    info = t.info()
    assert info["tokenizer_sha256"] == t.tokenizer_sha256 and len(info["tokenizer_sha256"]) == 64
    assert set(t.pin()) == {
        "name",
        "source",
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "architecture",
        "tokenizer_sha256",
        "vocab_sha256",
        "special_token_ids",
    }
    assert (
        len(t.pin()["vocab_sha256"]) == 64
        and t.pin()["special_token_ids"]["eos"] == t.tokenizer.eos_token_id
    )


def test_local_prompt_format_follows_chat_template(tiny_llama_dir, tiny_gemma_dir):
    assert resolve_target(str(tiny_llama_dir)).prompt_format.kind == "chat-template"
    base = resolve_target(str(tiny_gemma_dir)).prompt_format
    assert base.kind == "completion" and base.stop


def test_tokenizer_hash_is_content_based(tmp_path, tiny_llama_dir):
    a = build_tokenizer()
    a.save_pretrained(tmp_path / "copy")
    from transformers import AutoTokenizer

    b = AutoTokenizer.from_pretrained(tmp_path / "copy")
    assert tokenizer_sha256(a) == tokenizer_sha256(b)
    assert tokenizer_sha256(build_tokenizer(vocab_size=600)) != tokenizer_sha256(a)


def test_dtype_and_device_resolution(tiny_gemma_dir):
    t = load_target(str(tiny_gemma_dir), device="cpu", dtype="bfloat16")
    assert t.dtype == torch.bfloat16 and next(t.model.parameters()).dtype == torch.bfloat16
    with pytest.raises(PolyspecError, match="dtype"):
        load_target(str(tiny_gemma_dir), dtype="float8")
    if not torch.cuda.is_available():
        with pytest.raises(PolyspecError, match="CUDA is not available"):
            load_target(str(tiny_gemma_dir), device="cuda")


def test_greedy_generate_matches_manual_argmax_loop(tiny_target_dir):
    t = load_target(str(tiny_target_dir))
    prompt = t.tokenizer("Xin chào các bạn")["input_ids"]
    out = greedy_generate(t, prompt, 12)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            ids.append(int(t.model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert out == ids[len(prompt) :]
    assert len(set(out)) > 1, "tiny models should not just repeat one token"


def _fake_gguf_cache(isolated_cache, tiny_gemma_dir):
    """Lay out the default target's cache folder with a tiny model, as prepare_gguf_cache would."""
    spec = resolve_target("gemma3-270m")
    path = target_cache_path(spec)
    assert str(path).startswith(str(isolated_cache))
    shutil.copytree(tiny_gemma_dir, path)
    from transformers import AutoTokenizer

    sha = tokenizer_sha256(AutoTokenizer.from_pretrained(path))
    (path / CACHE_RECORD).write_text(json.dumps({"name": spec.name, "tokenizer_sha256": sha}))
    return spec, path


def test_gguf_target_is_served_from_cache(isolated_cache, tiny_gemma_dir):
    spec, path = _fake_gguf_cache(isolated_cache, tiny_gemma_dir)
    t = load_target(spec)  # no GGUF conversion happens: the cache record is there
    assert t.path == path and t.vocab_size == 768


@pytest.mark.parametrize(
    "damage",
    ["truncate-weights", "garbage-config", "no-weights", "garbage-record", "other-tokenizer"],
)
def test_unreadable_cache_is_one_line_error(isolated_cache, tiny_gemma_dir, damage):
    spec, path = _fake_gguf_cache(isolated_cache, tiny_gemma_dir)
    if damage == "truncate-weights":
        data = (path / "model.safetensors").read_bytes()
        (path / "model.safetensors").write_bytes(data[: len(data) // 3])
    elif damage == "garbage-config":
        (path / "config.json").write_text("{not json")
    elif damage == "no-weights":
        (path / "model.safetensors").unlink()
    elif damage == "garbage-record":
        (path / CACHE_RECORD).write_text("[")
    elif damage == "other-tokenizer":
        build_tokenizer(vocab_size=600).save_pretrained(path)
    with pytest.raises(PolyspecError) as e:
        load_target(spec)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg


def test_tokenizer_only_target_keeps_the_facts(tiny_target_dir):
    full = load_target(str(tiny_target_dir))
    light = load_target(str(tiny_target_dir), with_model=False)
    assert light.model is None
    assert (light.vocab_size, light.hidden_size, light.num_layers) == (
        full.vocab_size,
        full.hidden_size,
        full.num_layers,
    )
    assert light.tokenizer_sha256 == full.tokenizer_sha256 and light.pin() == full.pin()


def test_pad_less_tokenizer_gets_eos_as_pad_and_one_hash(tmp_path, tiny_llama_dir):
    """Llama-3 style: no pad token. Both load paths add EOS as pad *before* hashing, so they pin
    alike."""
    shutil.copytree(tiny_llama_dir, tmp_path / "nopad")
    cfg_path = tmp_path / "nopad" / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("pad_token")
    cfg_path.write_text(json.dumps(cfg))
    full = load_target(str(tmp_path / "nopad"))
    light = load_target(str(tmp_path / "nopad"), with_model=False)
    assert full.tokenizer.pad_token_id == full.tokenizer.eos_token_id
    assert light.tokenizer.pad_token_id == light.tokenizer.eos_token_id
    assert full.tokenizer_sha256 == light.tokenizer_sha256


def _same_tokenizer_target(tmp_path, tokenizer_dir, family: str, layers: int):
    """A tiny target of ``family`` with ``layers`` layers and the tokenizer of ``tokenizer_dir``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    out = tmp_path / f"{family}-{layers}"
    build_tiny_model(family, vocab_size=len(tok), layers=layers).save_pretrained(
        out, safe_serialization=True
    )
    tok.save_pretrained(out)
    return load_target(str(out))


def test_pin_holds_layer_count_and_architecture_and_a_mismatch_is_refused(tmp_path, tiny_llama_dir):
    from conftest import make_tiny_bundle
    from export.bundle import load_bundle

    base = load_target(str(tiny_llama_dir))
    pin = base.pin()
    assert (pin["num_hidden_layers"], pin["architecture"]) == (2, "llama")
    deeper = _same_tokenizer_target(tmp_path, tiny_llama_dir, "llama", 3)
    assert (
        deeper.tokenizer_sha256 == base.tokenizer_sha256 and deeper.hidden_size == base.hidden_size
    )
    with pytest.raises(PolyspecError) as e:
        check_pin(pin, deeper.pin(), "bundle b")
    msg = str(e.value)
    assert "\n" not in msg and "num_hidden_layers 2" in msg and "num_hidden_layers 3" in msg
    # same tokenizer, shapes, layer count
    other = _same_tokenizer_target(tmp_path, tiny_llama_dir, "gemma3", 2)
    with pytest.raises(PolyspecError, match="architecture llama; .* has architecture gemma3_text"):
        check_pin(pin, other.pin(), "bundle b")
    # a bundle built for the 2-layer target refuses the 3-layer one, naming both counts
    bundle = make_tiny_bundle(tmp_path / "bundle", base, langs=("vi",))
    with pytest.raises(PolyspecError, match="num_hidden_layers 2; .* has num_hidden_layers 3"):
        load_bundle(bundle, target_pin=deeper.pin())
    assert load_bundle(bundle, target_pin=pin).languages == ["vi"]


def test_pins_written_before_layers_and_architecture_were_recorded_still_load(tiny_llama_dir):
    pin = load_target(str(tiny_llama_dir), with_model=False).pin()
    # recorded before the layer count, the architecture and the tokenizer's id table were pinned
    old = {
        k: v
        for k, v in pin.items()
        if k not in ("num_hidden_layers", "architecture", "vocab_sha256", "special_token_ids")
    }
    check_pin(old, pin, "bundle b")  # unknown, not a mismatch
    with pytest.raises(PolyspecError, match="another tokenizer; .*export it again"):
        check_pin({**old, "tokenizer_sha256": "0" * 64}, pin, "bundle b")


def _retokenized_copy(src, out, edit_tokenizer_json=None, **tokenizer_attrs):
    """``src`` (weights and all) with its tokenizer changed: special roles set through
    ``tokenizer_attrs``, the serialized tokenizer through ``edit_tokenizer_json(dict)``."""
    from transformers import AutoTokenizer

    shutil.copytree(src, out)
    tok = AutoTokenizer.from_pretrained(out)
    for k, v in tokenizer_attrs.items():
        setattr(tok, k, v)
    tok.save_pretrained(out)
    if edit_tokenizer_json is not None:
        path = out / "tokenizer.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        edit_tokenizer_json(data)
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return load_target(str(out))


def test_a_bundle_serves_another_conversion_of_its_tokenizer_and_refuses_another_id_table(
    tmp_path, tiny_llama_dir, capsys
):
    """The H200 image's transformers (5.17) converted SmolLM2's GGUF tokenizer to the same ids with
    another EOS, and the bundle built here (5.24) was refused. The same table with other rules is
    served with a warning naming what moved, losslessly and with drafts kept; another table (two ids
    swapped) is still refused, in one line."""
    from conftest import make_tiny_bundle
    from decoder.core import Decoder
    from export.bundle import load_bundle

    base = load_target(str(tiny_llama_dir))
    bundle_dir = make_tiny_bundle(
        tmp_path / "bundle", base, langs=("vi",), drafter="oracle", noise=0.05, sizes=(64, 768)
    )
    other_rules = _retokenized_copy(tiny_llama_dir, tmp_path / "other-eos", eos_token="<unk>")
    assert other_rules.tokenizer.eos_token_id != base.tokenizer.eos_token_id
    assert (
        other_rules.tokenizer_sha256 != base.tokenizer_sha256
        and other_rules.vocab_sha256 == base.vocab_sha256
    )
    capsys.readouterr()
    bundle = load_bundle(bundle_dir, target_pin=other_rules.pin())
    err = capsys.readouterr().err.strip()
    eos_was, eos_now = base.tokenizer.eos_token_id, other_rules.tokenizer.eos_token_id
    assert (
        err.startswith("warning: ")
        and "\n" not in err
        and f"eos {eos_was} there, {eos_now} here" in err
    ), err
    dec, ar = (
        Decoder(other_rules, bundle, method="chain", gamma=3, size="full"),
        Decoder(other_rules, method="ar"),
    )
    accepted = 0
    for k, prompt in enumerate([[5, 17, 40, 9, 33], [12, 8, 61, 7, 90, 14, 7]]):
        out = dec.generate(prompt, 24, stop=[])
        assert out.tokens == ar.generate(prompt, 24, stop=[]).tokens, k
        accepted += sum(s.accepted for s in out.steps)
    assert accepted > 0

    def swap_two_ids(data):
        vocab = data["model"]["vocab"]
        a, b = sorted(t for t in vocab if vocab[t] >= 300)[:2]
        vocab[a], vocab[b] = vocab[b], vocab[a]

    other_table = _retokenized_copy(
        tiny_llama_dir, tmp_path / "swapped", edit_tokenizer_json=swap_two_ids
    )
    assert (
        other_table.vocab_size == base.vocab_size and other_table.vocab_sha256 != base.vocab_sha256
    )
    with pytest.raises(PolyspecError, match="with another tokenizer; it cannot serve") as e:
        load_bundle(bundle_dir, target_pin=other_table.pin())
    assert "\n" not in str(e.value)


def test_processes_that_find_no_cache_at_once_build_it_once(tmp_path, monkeypatch):
    """Two test workers (or stages) starting on a fresh machine: the second waits for the first's
    cache."""
    import threading
    import time

    import polyspec.gguf_cache as gc

    monkeypatch.setattr(gc, "target_cache_path", lambda spec: tmp_path / "targets" / "t-1.0")
    built = []

    def build(spec, path):
        built.append(path)
        time.sleep(0.3)  # the other caller arrives while this one builds
        path.mkdir(parents=True)
        (path / gc.CACHE_RECORD).write_text("{}")
        return path

    monkeypatch.setattr(gc, "_build", build)
    got = []
    threads = [
        threading.Thread(target=lambda: got.append(gc.prepare_gguf_cache(None))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [tmp_path / "targets" / "t-1.0"] * 2 and len(built) == 1
