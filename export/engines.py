"""Drafters for the engines people serve with: ``python -m export engines``.

    python -m export engines --langs vi,de,ja --run runs/demo [--train-dir train-eagle3]
                             [--target gemma3-270m] [--out <run>/export/engines]
                             [--sizes 8192,16384,32768] [--speculative-tokens 3]

From the run's EAGLE-3-form drafters (``<run>/<train-dir>/<lang>/final/`` and the multilingual
pretrain ``<run>/<train-dir>/<first language>/pretrain/final/``) it writes ``<out>/``:

- ``bundle/``: a polyspec bundle of those drafters (``python -m decoder.bench --engine-bundle``,
  method ``eagle3``: polyspec's decoder runs the very weights an engine serves);
- ``drafters/multilingual/``: the multilingual pretrain in polyspec's drafter form (the export is
  self-contained);
- ``speculators/<lang>/`` and ``speculators/multilingual/``: vllm-project/speculators' EAGLE-3
  layout, what vLLM (``--speculative-config '{"method": "eagle3", "model":
  …}'``) and SGLang (``--speculative-algorithm EAGLE3 --speculative-draft-model-path …``) load;
- ``gguf/<name>.gguf``: llama.cpp's own converter's output (``general.architecture = eagle3``),
  written when a llama.cpp source tree is at hand (``make check-llamacpp`` builds one; LLAMACPP_DIR)
  and llama.cpp can serve EAGLE-3 drafts for the target's architecture; otherwise ``engines.json``
  says why not;
- ``engines.json``: which engine loads which drafter, with the command, and each drafter's held-out
  score.

An engine holds one drafter per server: the multilingual drafter serves every language of the run
from one process; a per-language drafter is the better one for a server that sees one language
(compare their ``heldout_tau`` in ``engines.json``, or
``python -m pipelines.score_check --engines``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from export.bundle import load_bundle, safe_join, write_bundle
from export.gguf import eagle3_layers_unsupported
from export.interop import check_speculators, write_speculators, write_speculators_folder
from polyspec.drafter_kind import DrafterKind
from polyspec.drafter_models import load_drafter
from polyspec.errors import PolyspecError
from polyspec.io import atomic_directory, atomic_write_json, read_jsonl
from polyspec.targets import model_path

ENGINES_FILE = "engines.json"
MULTILINGUAL = "multilingual"


def heldout_eval(stage_dir: Path) -> dict | None:
    """The best held-out score a training stage logged (chain τ at the recipe's ``eval_depth``, with
    α_1…α_γ, the share of steps accepting at least i drafts), if any."""
    path = stage_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    evals = [
        r["eval"]
        for r in read_jsonl(path)
        if isinstance(r.get("eval"), dict) and r["eval"].get("sequences", 1) and "tau" in r["eval"]
    ]
    return max(evals, key=lambda e: e["tau"]) if evals else None


def heldout_tau(stage_dir: Path) -> float | None:
    """The best held-out τ a training stage logged, if any."""
    ev = heldout_eval(stage_dir)
    return round(ev["tau"], 4) if ev else None


def write_engine_exports(
    run: str | Path,
    langs: list[str],
    target,
    out: str | Path,
    train_dir: str = "train",
    sizes: list[int] | None = None,
    speculative_tokens: int = 3,
    gguf=None,
    gguf_why: str | None = None,
) -> dict:
    """Everything above; ``gguf`` is a callable (speculators folder, gguf path) → None, or None to
    write no GGUF (``gguf_why`` says why, in ``engines.json``). Returns (and writes) the
    ``engines.json`` record."""
    run, out = Path(run), Path(out)
    pin = target.pin()
    bundle = write_bundle(
        out / "bundle", run, langs, pin, sizes or [8192, 16384, 32768], train_dir=train_dir
    )
    folders = {
        f.name: f
        for f in write_speculators(bundle, target, out / "speculators", speculative_tokens)
    }
    multi_dir = run / train_dir / langs[0] / "pretrain" / "final"
    if (multi_dir / "model.safetensors").is_file():
        # the export is self-contained: polyspec's own form of the multilingual drafter goes in too
        with atomic_directory(out / "drafters" / MULTILINGUAL, overwrite=True) as tmp:
            shutil.copytree(multi_dir, tmp, dirs_exist_ok=True)
        model, meta = load_drafter(out / "drafters" / MULTILINGUAL)
        if DrafterKind.of(model) is not DrafterKind.EAGLE3:
            raise PolyspecError(
                f"{multi_dir}: the multilingual pretrain is not an EAGLE-3-form drafter"
            )
        folders[MULTILINGUAL] = write_speculators_folder(
            model,
            target,
            out / "speculators" / MULTILINGUAL,
            speculative_tokens,
            {
                "exported_from": str(multi_dir),
                "lang": MULTILINGUAL,
                "languages": langs,
                "target": pin,
            },
        )
    # llama.cpp runs one-layer EAGLE-3 drafters only: a deeper one leaves the GGUFs out, saying why
    deeper = [why for f in folders.values() if (why := eagle3_layers_unsupported(f))]
    if gguf is not None and deeper:
        gguf, gguf_why = None, deeper[0]
    drafters = {}
    for name, folder in folders.items():
        cfg = check_speculators(folder, target.vocab_size)
        stage = (
            (run / train_dir / langs[0] / "pretrain")
            if name == MULTILINGUAL
            else (run / train_dir / name / "finetune")
        )
        entry = {
            "form": "eagle3",
            "languages": langs if name == MULTILINGUAL else [name],
            "source": f"drafters/{MULTILINGUAL}"
            if name == MULTILINGUAL
            else f"bundle/drafters/{name}",
            "speculators": str(folder.relative_to(out)),
            "draft_vocab_size": cfg["draft_vocab_size"],
            "aux_layers": cfg["eagle_aux_hidden_state_layer_ids"],
            "heldout_tau": heldout_tau(stage),
            # the engines' draft_n choice reads it
            "heldout_alpha": (heldout_eval(stage) or {}).get("alpha"),
            "polyspec": None if name == MULTILINGUAL else f"bundle/drafters/{name}",
            "gguf": None,
        }
        if gguf is not None:
            path = out / "gguf" / f"{name}.gguf"
            gguf(folder, path)
            entry["gguf"] = str(path.relative_to(out))
        drafters[name] = entry
    record = {
        "target": pin,
        "target_path": model_path(target.spec),
        "train_dir": train_dir,
        "architecture": list(getattr(target.config, "architectures", None) or []),
        "drafters": drafters,
        "engines": engine_table(
            out,
            drafters,
            model_path(target.spec),
            speculative_tokens,
            gguf is not None,
            gguf_why,
            architecture=(getattr(target.config, "architectures", None) or [""])[0],
        ),
    }
    atomic_write_json(out / ENGINES_FILE, record)
    load_bundle(out / "bundle", target_pin=pin)
    return record


# Target architectures whose vLLM model serves EAGLE-3 drafts only with polyspec's vLLM plugin
# (plugins/vllm: vLLM 0.32's Gemma-3 classes lack SupportsEagle3; the plugin adds it), as measured
# by make check-vllm's probe of the installed vLLM.
VLLM_NEEDS_PLUGIN = {
    arch: "vLLM 0.32's Gemma-3 classes do not implement SupportsEagle3; polyspec's vLLM plugin "
    "adds it: pip install ./plugins/vllm into vLLM's environment (make setup-vllm does)"
    for arch in ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
}
PLUGIN_INSTALL = "pip install ./plugins/vllm"


def engine_table(
    out: Path,
    drafters: dict,
    target_path: str,
    k: int,
    gguf: bool,
    gguf_why: str | None = None,
    architecture: str = "",
) -> dict:
    """Per engine: which drafters it loads and the command that serves one (``<name>``: a drafter
    name)."""
    names = sorted(drafters)
    spec = str(out / "speculators" / "<name>")
    table = {
        "vllm": {
            "loads": names,
            "format": "speculators",
            "command": f"vllm serve {target_path} --speculative-config "
            f'\'{{"method": "eagle3", "model": "{spec}", "num_speculative_tokens": {k}}}\'',
            "tested_here": "make check-vllm (vLLM's CPU build; make setup-vllm)",
        },
        # SGLang has no CPU wheel on PyPI: never run here
        "sglang": {
            "loads": names,
            "format": "speculators",
            "command": f"python -m sglang.launch_server --model-path {target_path} "
            "--speculative-algorithm EAGLE3 "
            f"--speculative-draft-model-path {spec} --speculative-num-steps {k} "
            f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}",
            "tested_here": "no (SGLang needs a GPU build)",
        },
        "polyspec": {
            "loads": [n for n in names if drafters[n]["polyspec"]],
            "format": "bundle",
            "command": f"python -m decoder.bench --engine-bundle {out / 'bundle'} --methods "
            "ar,eagle3",
            "tested_here": "yes",
        },
    }
    if architecture in VLLM_NEEDS_PLUGIN:
        table["vllm"]["needs"] = {"plugin": PLUGIN_INSTALL, "why": VLLM_NEEDS_PLUGIN[architecture]}
    if gguf:
        table["llama.cpp"] = {
            "loads": names,
            "format": "gguf",
            "command": "llama-speculative-simple -m <target.gguf> -md "
            f"{out / 'gguf' / '<name>.gguf'} "
            f"--spec-type draft-eagle3 --spec-draft-n-max {k} --temp 0",
            "tested_here": "make check-llamacpp",
        }
    else:
        table["llama.cpp"] = {
            "loads": [],
            "format": "gguf",
            "why": gguf_why
            or "no GGUF written: no llama.cpp source "
            "tree at hand (make check-llamacpp builds one and converts the speculators folders)",
        }
    return table


def multilingual_drafter(engines_dir: Path):
    """(drafter, first language) of an engines export's multilingual drafter, or None when it has
    none."""
    rec = read_engines(engines_dir)
    d = (rec or {}).get("drafters", {}).get(MULTILINGUAL)
    if not d:
        return None
    return load_drafter(safe_join(Path(engines_dir), d["source"]))[0], d["languages"][0]


def read_engines(engines_dir: Path) -> dict | None:
    path = Path(engines_dir) / ENGINES_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise PolyspecError(f"{path}: not JSON ({e})") from None


def describe(engines_dir: Path) -> list[str]:
    """One line per engine: what it loads from an ``engines.json``
    (``python -m export --check``)."""
    rec = read_engines(engines_dir)
    if rec is None:
        return []
    lines = []
    for engine, e in rec.get("engines", {}).items():
        loads = ", ".join(e.get("loads") or []) or "nothing"
        lines.append(
            f"{engine}: {loads} ({e.get('format')})" + (f" — {e['why']}" if e.get("why") else "")
        )
    return lines
