"""polyspec's vLLM plugin (plugins/vllm, ``make setup-vllm`` installs it) inside the real vLLM
(its CPU build, the engines environment). The target is a tiny Gemma-3
(``polyspec.testing.build_engine_target(family="gemma3")``: sliding and full-attention layers,
head_dim 64) and the drafter ``oracle_eagle3``, whose first draft is right wherever vLLM feeds it
the target's aux hidden states as polyspec reads them — so accepted drafts show that vLLM's Gemma-3
now collects them. Every engine runs eagerly (``enforce_eager``); each vLLM start costs ~40-50 s on
2 cores, the module ~4-5 min."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import torch

from polyspec.errors import PolyspecError
from polyspec.vllm_process import VLLMProcess, cpu_env, vllm_python

pytestmark = pytest.mark.slow

try:
    VLLM_PYTHON = vllm_python()
except PolyspecError as e:
    pytest.skip(f"vLLM environment absent ({e})", allow_module_level=True)

_HAS_PLUGIN = (
    subprocess.run(
        [VLLM_PYTHON, "-c", "import polyspec_vllm"], capture_output=True, env=cpu_env()
    ).returncode
    == 0
)
if not _HAS_PLUGIN:
    pytest.skip("polyspec-vllm is not installed there (make setup-vllm)", allow_module_level=True)

N = 20
# greedy, with the chosen token's logprob: "unchanged" means the same numbers too
GREEDY = {"temperature": 0, "max_tokens": N, "ignore_eos": True, "logprobs": 0}


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """A tiny Gemma-3 target, its oracle EAGLE-3 drafter (draft vocabulary: 700 of 768 ids), the
    same drafter with a hybrid settings file, and prompts of draft-vocabulary ids: one without a
    repeated bigram (drafted by the drafter), one that repeats itself (drafted by prompt lookup)."""
    from export.interop import write_speculators_folder
    from polyspec.targets import load_target
    from polyspec.testing import build_engine_target, involution, oracle_eagle3
    from polyspec_vllm.settings import Hybrid, write

    root = tmp_path_factory.mktemp("vllm-plugin")
    path = build_engine_target(root / "target", family="gemma3")
    target = load_target(str(path), device="cpu", dtype="float32")
    draft_ids = torch.arange(target.vocab_size).flip(0)[:700]
    drafter = write_speculators_folder(
        oracle_eagle3(target, draft_ids),
        target,
        root / "speculators" / "en",
        3,
        {"lang": "en", "target": target.pin()},
    )
    hybrid = root / "hybrid" / "en"
    hybrid.mkdir(parents=True)
    for f in drafter.iterdir():
        (hybrid / f.name).symlink_to(f)
    # 4-token matches: the distinct prompt's answer (x, π(x), x, …) needs a few steps to have one,
    # so its rows stay the drafter's while the other request, scheduled a step later or not, joins
    write(hybrid, Hybrid(ngram_min=4, ngram_max=6, drafter_tokens=1))
    g = torch.Generator().manual_seed(0)
    ids = draft_ids[torch.randperm(len(draft_ids), generator=g)].tolist()
    # the target's greedy token after x is π(x): a prompt a π(a) a π(a) … goes on a π(a), so its
    # last two tokens recur from the first decoding step on; distinct ids have none to match
    pi = involution(target.vocab_size)
    a = next(x for x in ids if int(pi[x]) != x and int(pi[x]) in set(ids))
    prompts = [ids[:14], [a, int(pi[a])] * 6]
    return {"root": root, "target": path, "drafter": drafter, "hybrid": hybrid, "prompts": prompts}


def _llm(gemma, spec=None) -> dict:
    """vLLM's LLM keywords for the tiny Gemma-3: fp32, eager, counters on."""
    llm = {
        "model": str(gemma["target"]),
        "dtype": "float32",
        "enforce_eager": True,
        "max_model_len": 256,
        "disable_log_stats": False,
        "seed": 0,
    }
    return llm if spec is None else {**llm, "speculative_config": spec}


def _run(gemma, name, spec=None, env=None):
    llm = _llm(gemma, spec)
    log = gemma["root"] / f"{name}.log"
    with VLLMProcess(llm, log=log, env=env) as p:
        outs, _ = p.generate(gemma["prompts"], [GREEDY] * len(gemma["prompts"]))
        metrics = p.metrics()
    return outs, metrics, log.read_text(errors="replace")


@pytest.fixture(scope="module")
def plain(gemma):
    return _run(gemma, "plain")


def test_without_a_polyspec_setting_vllm_serves_as_without_the_plugin(gemma, plain):
    """The plugin registers its Gemma-3 class over vLLM's: plain decoding gives the same tokens
    and the same logprobs as vLLM with the plugin left out (``VLLM_PLUGINS``)."""
    outs, _, log = plain
    bare, _, bare_log = _run(gemma, "no-plugin", env={"VLLM_PLUGINS": ""})
    assert [o["token_ids"] for o in outs] == [o["token_ids"] for o in bare]
    assert [o["logprobs"] for o in outs] == [o["logprobs"] for o in bare]
    assert all(len(o["token_ids"]) == N for o in outs)
    # the two runs really differed in the plugin: only one loaded it
    assert "polyspec" not in bare_log.lower().replace("polyspec-vllm-", "")


def test_gemma3_serves_polyspecs_eagle3_drafter_losslessly_with_drafts_kept(gemma, plain):
    """vLLM 0.32 alone refuses an EAGLE-3 drafter for Gemma-3 ("Model does not support EAGLE3
    interface"); with the plugin it runs, fp32 outputs equal plain decoding's, and the oracle's
    first draft is kept (vLLM feeds it the aux hidden states polyspec's export reads)."""
    spec = {"method": "eagle3", "model": str(gemma["drafter"]), "num_speculative_tokens": 2}
    outs, m, _ = _run(gemma, "eagle3", spec)
    assert [o["token_ids"] for o in outs] == [o["token_ids"] for o in plain[0]]
    drafts = m["vllm:spec_decode_num_drafts"]
    per_pos = m["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert drafts > 0 and per_pos[0] >= 0.9 * drafts, m
    # the oracle's second draft reads its own state: mostly wrong
    assert per_pos[1] <= 0.3 * drafts, m


def test_hybrid_takes_ngram_rows_and_drafter_rows_in_one_step_losslessly(gemma, plain):
    """hybrid (drafter_tokens 1, num_speculative_tokens 3): the repeating prompt's rows come from
    prompt lookup (3 tokens), the other's from the drafter (1 token) in the same first step;
    output equal to plain decoding's, and drafts past the first position kept (only n-gram rows
    have them). Once the distinct prompt's answer loops too, every row is an n-gram one and the
    drafter drafts nothing (its forward still fills its KV cache) — output still plain's."""
    spec = {"method": "eagle3", "model": str(gemma["hybrid"]), "num_speculative_tokens": 3}
    outs, m, log = _run(gemma, "hybrid", spec, env={"POLYSPEC_VLLM_LOG_EVERY": "1"})
    assert [o["token_ids"] for o in outs] == [o["token_ids"] for o in plain[0]]
    per_pos = m["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert per_pos[0] > 0 and per_pos[1] > 0 and per_pos[2] > 0, m
    stats = re.findall(
        r"HybridStats\(ngram_rows=(\d+), drafter_rows=(\d+), steps=(\d+), mixed_steps=(\d+), "
        r"ngram_only_steps=(\d+)\)",
        log,
    )
    assert stats, log[-3000:]
    ngram_rows, drafter_rows, steps, mixed, ngram_only = map(int, stats[-1])
    assert ngram_rows > 0 and drafter_rows > 0 and mixed > 0, stats[-1]
    assert 0 < ngram_only < steps, stats[-1]


@pytest.fixture(scope="module")
def languages(gemma):
    """ADASPEC per request: an ``en`` and a ``fr`` oracle drafter, each whose draft vocabulary
    holds its own request's answer tokens only (prompt A ends in a, its answer loops a, π(a); B in
    b), and a multilingual drafter holding neither — so a row drafted by any drafter but its own
    language's is never accepted. The multilingual folder's polyspec_vllm.json lists the two."""
    from export.interop import write_speculators_folder
    from polyspec.targets import load_target
    from polyspec.testing import SPECIALS, involution, oracle_eagle3
    from polyspec_vllm.settings import write

    root = gemma["root"] / "adaspec"
    target = load_target(str(gemma["target"]), device="cpu", dtype="float32")
    pi = involution(target.vocab_size)
    free = [x for x in range(len(SPECIALS), target.vocab_size) if int(pi[x]) != x]
    a, b = free[0], next(x for x in free if x not in (free[0], int(pi[free[0]])))
    answers = {a, int(pi[a]), b, int(pi[b])}
    base = [x for x in range(len(SPECIALS), target.vocab_size) if x not in answers][:700]
    vocab = {"en": base[:698] + [a, int(pi[a])], "fr": base[:698] + [b, int(pi[b])], "mul": base}
    folders = {
        lang: write_speculators_folder(
            oracle_eagle3(target, torch.tensor(sorted(ids))),
            target,
            root / lang,
            3,
            {"lang": lang, "target": target.pin()},
        )
        for lang, ids in vocab.items()
    }
    write(folders["mul"], None, languages={"en": "../en", "fr": "../fr"})
    g = torch.Generator().manual_seed(1)
    order = [base[i] for i in torch.randperm(len(base), generator=g).tolist()]
    prompts = [order[:13] + [a], order[13:26] + [b]]
    # the target's greedy token after x is π(x): each answer alternates π(last), last
    answers = [[int(pi[p[-1]]), p[-1]] * (N // 2) for p in prompts]
    return {"folders": folders, "prompts": prompts, "answers": answers}


def test_each_request_drafts_with_its_languages_drafter_in_one_batch(gemma, languages):
    """One server, the en and fr drafters beside the multilingual one: requests tagged en and fr
    in one batch draft with their own language's drafter (first drafts kept ≥ 90 %), output the
    target's greedy answer; the same prompts with their tags swapped — or tagged with a language
    without a drafter, which the multilingual drafter takes — keep almost none, output unchanged. A
    tag that is no language code is refused with one line (vLLM's validation error: a 400 from
    the server)."""
    spec = {
        "method": "eagle3",
        "model": str(languages["folders"]["mul"]),
        "num_speculative_tokens": 2,
    }
    prompts = languages["prompts"]
    tagged = lambda *tags: [{**GREEDY, "extra_args": {"lang": t}} for t in tags]  # noqa: E731
    log = gemma["root"] / "adaspec.log"
    with VLLMProcess(_llm(gemma, spec), log=log, env={"POLYSPEC_VLLM_LOG_EVERY": "1"}) as p:
        runs = {}
        for name, params in (
            ("own", tagged("en", "fr")),
            ("swapped", tagged("fr", "en")),
            ("no drafter", tagged("de", "de")),
        ):
            before = p.metrics()
            outs, _ = p.generate(prompts, params)
            after = p.metrics()
            drafts = after["vllm:spec_decode_num_drafts"] - before["vllm:spec_decode_num_drafts"]
            first = (
                after["vllm:spec_decode_num_accepted_tokens_per_pos"][0]
                - before["vllm:spec_decode_num_accepted_tokens_per_pos"][0]
            )
            runs[name] = (outs, drafts, first)
        with pytest.raises(PolyspecError, match=r"extra_args\.lang 'Klingon' is no language code"):
            p.generate(prompts[:1], [{**GREEDY, "extra_args": {"lang": "Klingon"}}])
    for name, (outs, drafts, _) in runs.items():
        assert [o["token_ids"] for o in outs] == languages["answers"], name
        assert drafts > 0, name
    _, drafts, first = runs["own"]
    assert first >= 0.9 * drafts, runs["own"][1:]
    for name in ("swapped", "no drafter"):
        assert runs[name][2] <= 0.1 * runs[name][1], (name, runs[name][1:])
    text = log.read_text(errors="replace")
    assert "per-request drafters for en, fr" in text
    assert re.search(r"AdaspecStats\(rows=Counter\(\{[^)]*'en': \d+", text), text[-3000:]


def test_vllm_reads_the_draft_length_by_batch_size_that_check_vllm_writes(gemma):
    """``num_speculative_tokens_per_batch_size`` as engines.vllm writes it, with 0 where drafting
    lost: here batch 1 gets no drafts, so one prompt alone is drafted never, the two prompts
    together are."""
    spec = {
        "method": "eagle3",
        "model": str(gemma["drafter"]),
        "num_speculative_tokens": 2,
        "num_speculative_tokens_per_batch_size": [[1, 1, 0], [2, 16, 2]],
    }
    with VLLMProcess(_llm(gemma, spec), log=gemma["root"] / "schedule.log") as p:
        p.generate(gemma["prompts"][:1], [GREEDY])
        alone = p.metrics().get("vllm:spec_decode_num_drafts", 0)
        p.generate(gemma["prompts"], [GREEDY] * 2)
        together = p.metrics()["vllm:spec_decode_num_drafts"] - alone
    assert alone == 0 and together > 0, (alone, together)


def test_the_engines_probe_sees_the_plugins_gemma3_and_vllm_without_it_does_not():
    """make check-vllm asks the installed vLLM whether it serves EAGLE-3 for the target before it
    starts any engine: with the plugin Gemma-3 does, with the plugin left out it does not."""
    with VLLMProcess(None) as p:
        got = p.probe(["Gemma3ForCausalLM", "LlamaForCausalLM"])["architectures"]
    with VLLMProcess(None, env={"VLLM_PLUGINS": ""}) as p:
        bare = p.probe(["Gemma3ForCausalLM"])["architectures"]
    assert got["Gemma3ForCausalLM"]["eagle3"] and got["LlamaForCausalLM"]["eagle3"]
    assert bare["Gemma3ForCausalLM"] == {"known": True, "eagle3": False}


def _start_error(env_extra: dict, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [VLLM_PYTHON, "-c", code],
        capture_output=True,
        text=True,
        env={**cpu_env(), **env_extra},
        timeout=300,
    )


def test_another_vllm_version_is_refused_in_one_line():
    r = _start_error(
        {},
        "import vllm; vllm.__version__ = '0.33.1'\nfrom polyspec_vllm import register; register()",
    )
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: polyspec-vllm: tested with vLLM 0.32.0 only, found 0.33.1")
    assert "Traceback" not in r.stderr


def test_a_drafter_for_another_target_is_refused_at_start_up(gemma, tmp_path):
    """A Llama target's drafter on the Gemma-3 target (same vocabulary and width: shapes alone do
    not tell) stops vLLM before any weight loads, with one line naming the cause."""
    from export.interop import write_speculators_folder
    from polyspec.targets import load_target
    from polyspec.testing import build_engine_target, oracle_eagle3

    llama_dir = build_engine_target(tmp_path / "llama", family="llama")
    llama = load_target(str(llama_dir), device="cpu", dtype="float32")
    folder = write_speculators_folder(
        oracle_eagle3(llama, torch.arange(llama.vocab_size)),
        llama,
        tmp_path / "speculators" / "en",
        3,
        {"lang": "en", "target": llama.pin()},
    )
    spec = {"method": "eagle3", "model": str(folder), "num_speculative_tokens": 2}
    code = (
        "from vllm import LLM\n"
        f"LLM(model={str(gemma['target'])!r}, dtype='float32', enforce_eager=True, "
        f"max_model_len=256, speculative_config={json.dumps(spec)})"
    )
    r = _start_error({}, code)
    assert r.returncode == 1, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: polyspec-vllm: drafter {folder} was not trained for target")
    assert "trained on a llama model, the target is gemma3_text" in last
    assert "Loading weights" not in r.stderr and "Traceback" not in r.stderr
    assert os.path.isdir(folder)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_serve_with_the_plugin_under_load(gemma, tmp_path):
    """``python -m engines.vllm.load``: a plain server and the plugin's hybrid server on 127.0.0.1,
    1 and 2 concurrent clients, greedy and at temperature 0.7: no failed request, every greedy
    answer equal to the plain server's, drafts accepted; a client dropped mid-stream and malformed
    requests (4xx each) leave the server answering."""
    from conftest import run_cli

    out = tmp_path / "load"
    r = run_cli(
        "-m",
        "engines.vllm.load",
        "--target",
        str(gemma["target"]),
        "--drafter",
        str(gemma["drafter"]),
        "--run",
        str(tmp_path),
        "--lang",
        "en",
        "--modes",
        "plain,hybrid",
        "--concurrency",
        "1,2",
        "--temperatures",
        "0,0.7",
        "--prompts",
        "3",
        "--n",
        "16",
        "--eager",
        "--port",
        str(_free_port()),
        "--out",
        str(out),
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    rep = json.loads((out / "load.json").read_text())
    hybrid = rep["modes"]["hybrid"]
    for key, p in hybrid["passes"].items():
        assert p["failures"] == 0 and p["requests"] == 3, key
        if p["temperature"] == 0:
            assert p["identical"] == 3, key
    assert hybrid["spec"]["accepted"] > 0, hybrid["spec"]
    assert rep["modes"]["plain"]["spec"]["drafts"] == 0
    assert hybrid["dropped_stream_first_chunk"] and hybrid["serves_after"]
    assert all(400 <= b["status"] < 500 for b in hybrid["bad_requests"]), hybrid["bad_requests"]
    assert "| hybrid | 2 | 0.7 |" in (out / "load.md").read_text()
