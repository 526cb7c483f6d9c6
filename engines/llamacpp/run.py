"""The llama.cpp check's runs (``python -m engines.llamacpp bench``): llama.cpp's tools as
subprocesses on the held-out prompts, their output read back (``parse_*``, ``*_text``), the
verify-cost curve, the draft length.

**bench — what is measured.** Per language, the first ``--prompts`` held-out prompts
(``synth/data/heldout.jsonl``, first turn as the user message) rendered with the target's prompt
format (``polyspec.prompts.render``; a chat template applies). The text reaches llama.cpp through a
file (``-f``, plus one newline llama.cpp strips) with ``--no-escape`` and llama.cpp's own BOS
switched off (``--override-kv tokenizer.ggml.add_bos_token=bool:false``): when polyspec's ``encode``
starts with BOS its text is written into the prompt (parsed as a special token). Some tokenizers get
a BOS whatever the override says (llama.cpp forces it for its Gemma-4 pre-tokenizer, which its
converter picks for Gemma-3-270m's tokenizer.json): a one-token probe (``probe_adds_bos``) finds
out, and the BOS is then left out of the text instead. Either way the ids are polyspec's: the plain
run's ``--verbose-prompt`` ids are compared with them (``prompt_tokens_equal``). Greedy
(``--temp 0``) everywhere, ``-t`` = the CPUs less one (``--threads``), one process at a time, modes
interleaved prompt by prompt:

- ``plain``: ``llama-completion -no-cnv --no-display-prompt --verbose-prompt -n N+max(draft,
  ngram-m)+1`` (it runs past N so that every speculative output below is a prefix of it); tok/s =
  its ``eval time`` rate (one-token target forwards; sampling excluded).
- ``eagle3``: ``llama-speculative-simple -md <lang>.gguf --spec-type draft-eagle3 --spec-draft-n-max
  D -n N``.
- ``ngram``: ``llama-speculative-simple --spec-type ngram-simple --spec-ngram-simple-size-n 3
  --spec-ngram-simple-size-m D`` (llama.cpp's documented "simplest self-speculative" mode: the m
  tokens that followed the last earlier occurrence of the current n-gram; n = 3 as polyspec's PLD, m
  = the EAGLE-3 draft length).

For both speculative modes tok/s is llama.cpp's ``decoded … speed`` (wall time of the whole decode
loop: drafting, verification, sampling) and the counts are its printed ``n_predict`` (= tokens, N+1
or more: the example stops once it has passed N), ``n_drafted`` and ``n_accept``. Derived:
verification steps S = n_predict − n_accept (each target verification yields its accepted drafts + 1
token); acceptance = n_accept / n_drafted; accepted tokens per step = n_predict / S = 1 + n_accept /
S (llama.cpp's "mean acc len"); τ = n_predict / (S + 1) (polyspec's tokens / target forwards, the
prefill counted as one forward as in ``decoder``; summed over prompts: Σ tokens / Σ (S + 1)).
``identical``: byte-exact text — the speculative run's generated text (its stdout after the echoed
prompt) must be a prefix of the plain run's, and equal to it where either stopped at EOS. These
tools print no generated token ids, so the check is on text; where texts differ, the first differing
token is located by counting the target tokenizer's tokens of the common prefix.

**cost curve.** ``llama-batched-bench -npp 256 -ntg 8 -npl 1..K -pps -kvu``: one decode of k tokens
(k sequences sharing a 256-token prompt, one new token each: the same weight reads and the same
attention span as verifying k drafted tokens at a context of 256); t(k) = T_TG / TG, the smaller of
``--cost-passes`` passes; printed as t(k)/t(1). ``bound`` = tokens per step ÷ t(1 + mean
draft)/t(1): the speedup a mode would reach if drafting and sampling cost nothing (an estimate: the
curve is taken at context 256, the prompts' contexts differ).

EAGLE-3 in llama.cpp reads the inputs of three target layers (``llama_set_embeddings_layer_inp``:
input of layer i = HF ``output_hidden_states[i]``, polyspec's ``aux_layers`` convention); a target
architecture whose llama.cpp graph does not publish them (Gemma-3 here) aborts: the message is
recorded verbatim (``eagle3_error``) and the bench goes on with plain + n-gram.

The bench writes ``<out>/llamacpp.json`` and ``<out>/llamacpp.md`` (:mod:`engines.llamacpp.report`)
and every run's stdout / stderr under ``<out>/logs/``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engines import draft_length
from engines.common import bench_plan, heldout_prompts, resolve_drafters
from engines.draft_length import drafter_alpha
from engines.llamacpp.report import DEFINITIONS, spec_metrics, summarize, write
from export.gguf import PACKAGE, VERSION, LlamaCpp, convert_all, last_line
from polyspec.errors import PolyspecError
from polyspec.io import atomic_write_bytes, atomic_write_text

NO_BOS = ("--override-kv", "tokenizer.ggml.add_bos_token=bool:false")
COST_CONTEXT, COST_TG = 256, 8
RUN_TIMEOUT_S = 900


# ------------------------------------------------------------------------------- llama.cpp's output


_DECODED = re.compile(
    r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+|inf|nan) t/s"
)
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_EVAL = re.compile(
    r"(?<!prompt )eval time =\s+([\d.]+) ms /\s+(\d+) runs\s+\(\s*([\d.]+|inf|nan) ms per token,\s+"
    r"([\d.]+|inf|nan) tokens per second\)"
)
_PROMPT_EVAL = re.compile(r"prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens")
_SAMPLING = re.compile(r"sampling time =\s+([\d.]+) ms")
_N_PROMPT = re.compile(r"number of tokens in prompt = (\d+)")
_PROMPT_ID = re.compile(r"^(?:[\d.]+ [A-Z] )?\s*(\d+) -> '", re.M)
# llama-speculative-simple: LOG("\n\n") after the loop and once more at exit
_SPEC_END = b"\n\n\n\n"
_COMPLETION_EOS = b" [end of text]\n"


def _count(pattern: str, text: str) -> int | None:
    m = re.search(rf"\b{pattern}\s*=\s*(\d+)", text)
    return int(m.group(1)) if m else None


def parse_speculative(stderr: str) -> dict[str, Any]:
    """llama-speculative-simple's closing report → {tokens (n_predict), decode_s, tok_s,
    prompt_tokens, n_draft, n_drafted, n_accept}. One-line error when the report is missing (the run
    failed)."""
    m = _DECODED.search(stderr)
    if not m:
        raise PolyspecError(
            f"llama-speculative-simple printed no 'decoded … tokens' line: {error_message(stderr)}"
        )
    enc = _ENCODED.search(stderr)
    out = {
        "tokens": _count("n_predict", stderr),
        "decode_s": float(m.group(2)),
        "tok_s": float(m.group(3)),
        "prompt_tokens": int(enc.group(1)) if enc else None,
        "n_draft": _count("n_draft", stderr),
        "n_drafted": _count("n_drafted", stderr),
        "n_accept": _count("n_accept", stderr),
    }
    if out["tokens"] is None or out["n_drafted"] is None or out["n_accept"] is None:
        raise PolyspecError(
            "llama-speculative-simple's report lacks n_predict / n_drafted / n_accept"
        )
    return out


def parse_completion(stderr: str) -> dict[str, Any]:
    """llama-completion's perf report (+ ``--verbose-prompt`` ids) → {runs, decode_s, tok_s (its
    eval rate), ms_per_token, prompt_eval_s, prompt_eval_tokens, sampling_s, prompt_ids}."""
    m = _EVAL.search(stderr)
    if not m:
        raise PolyspecError(
            f"llama-completion printed no 'eval time' line: {error_message(stderr)}"
        )
    pe, smp = _PROMPT_EVAL.search(stderr), _SAMPLING.search(stderr)
    out = {
        "runs": int(m.group(2)),
        "decode_s": float(m.group(1)) / 1000,
        "tok_s": float(m.group(4)),
        "ms_per_token": float(m.group(3)),
        "prompt_eval_s": float(pe.group(1)) / 1000 if pe else None,
        "prompt_eval_tokens": int(pe.group(2)) if pe else None,
        "sampling_s": float(smp.group(1)) / 1000 if smp else None,
        "prompt_ids": None,
    }
    n = _N_PROMPT.search(stderr)
    if n:
        ids = [int(x) for x in _PROMPT_ID.findall(stderr, n.end())[: int(n.group(1))]]
        out["prompt_ids"] = ids if len(ids) == int(n.group(1)) else None
    return out


def speculative_text(stdout: bytes, prompt: str) -> bytes:
    """The generated bytes of llama-speculative-simple: its stdout is "\\n\\n" + the prompt's pieces
    + the generated pieces (the EOS token is not printed) + "\\n\\n\\n\\n"."""
    p = prompt.encode("utf-8")
    i = stdout.find(p)
    if i < 0:
        raise PolyspecError(
            "llama-speculative-simple's output does not echo the prompt; cannot find the "
            "generated text"
        )
    text = stdout[i + len(p) :]
    return text[: -len(_SPEC_END)] if text.endswith(_SPEC_END) else text


def completion_text(stdout: bytes) -> tuple[bytes, bool]:
    """The generated bytes of ``llama-completion --no-display-prompt`` and whether it stopped at
    EOS: its stdout is the generated pieces (special tokens print as nothing) [+ " [end of text]\\n"
    at EOS] + "\\n\\n"."""
    text = stdout[:-2] if stdout.endswith(b"\n\n") else stdout
    eos = text.endswith(_COMPLETION_EOS)
    return (text[: -len(_COMPLETION_EOS)] if eos else text), eos


def parse_batched_bench(stdout: str) -> list[dict[str, Any]]:
    """llama-batched-bench ``--output-format jsonl`` rows: {pp, tg, pl, t_tg, …}."""
    rows = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{") and '"t_tg"' in line:
            rows.append(json.loads(line))
    if not rows:
        raise PolyspecError("llama-batched-bench printed no JSONL rows")
    return rows


_BENIGN = (
    "this warning is normal during memory fitting",
    "failed to measure the memory of the extra model",
)


def error_message(stderr: str, lines: int = 3) -> str:
    """llama.cpp's own words for a failure, verbatim: its last error / assert / exception lines (the
    log level prefix and timestamp removed), else its last line."""
    hits = []
    for raw in stderr.splitlines():
        line = re.sub(r"^[\d.]+ [A-Z] ", "", raw).strip()
        if any(b in line for b in _BENIGN):
            continue
        if re.search(
            r"GGML_ASSERT|GGML_ABORT|error|exception|failed|abort", line, re.I
        ) and not line.startswith("#"):
            hits.append(line)
    return " | ".join(dict.fromkeys(hits[-lines:])) if hits else last_line(stderr)


# ------------------------------------------------------------------------------------------ compare


def compare(plain: bytes, plain_eos: bool, spec: bytes, spec_eos: bool) -> dict[str, Any]:
    """Greedy speculative text vs plain text. ``plain`` ran longer, so ``spec`` must be its prefix —
    and equal to it when the speculative run stopped at EOS (then plain stopped there too). Returns
    {identical, common_bytes (length of the common prefix), spec_bytes, plain_bytes}."""
    n = 0
    for a, b in zip(plain, spec):
        if a != b:
            break
        n += 1
    identical = plain.startswith(spec) and (not spec_eos or (plain_eos and plain == spec))
    return {
        "identical": identical,
        "common_bytes": n,
        "spec_bytes": len(spec),
        "plain_bytes": len(plain),
    }


def choose_draft_lengths(
    rows: list[dict], s: Settings, curve: dict, engines_json: Path | None, modes: tuple[str, ...]
) -> dict:
    """Per drafter: the step cost fitted from its runs at each draft length, the predicted speedup
    per length from its held-out α (else its acceptance at length 1, geometric), the chosen
    ``draft_n`` (engines.draft_length)."""
    out = {}
    for name in dict.fromkeys(r["drafter"] for r in rows if r.get("drafter")):
        o = summarize([r for r in rows if r.get("drafter") == name], modes, curve=curve["t_s"])
        runs = {
            (s.draft if m == "eagle3" else int(m.split("@")[1])): o[m]
            for m in modes
            if m.startswith("eagle3") and m in o
        }
        if not runs or not o["plain"].get("tok_s"):
            continue
        alpha, source = drafter_alpha(name, engines_json)
        if alpha is None:
            first = runs.get(1) or runs[min(runs)]
            a1 = first["acceptance"] or 0.0
            alpha, source = (
                [a1**i for i in range(1, 5)],
                f"llama.cpp's acceptance at draft length {min(runs)}, geometric",
            )
        fit = draft_length.fit_step_cost(runs, 1 / o["plain"]["tok_s"], curve["t_s"])
        pick = draft_length.choose(
            alpha,
            curve["t_s"],
            fit["a"],
            fit["c"],
            k_max=min(max(s.cost_k - 1, 1), 8),
            measured={k: r["speedup"] for k, r in runs.items() if r.get("speedup")},
        )
        out[name] = {**pick, "alpha": alpha, "alpha_from": source, "step_cost": fit}
    return out


# -------------------------------------------------------------------------------------------- bench


def llama_prompt(fmt, tokenizer, user_turn: str, llama_adds_bos: bool) -> tuple[str, list[int]]:
    """(text for llama.cpp, polyspec's ids). llama.cpp runs with its own BOS switched off where it
    lets us (``llama_adds_bos`` False): a BOS that polyspec's ``encode`` adds is then written into
    the text, where llama.cpp parses it as the special token; where llama.cpp adds BOS regardless
    (its Gemma-4 tokenizer rule), a BOS written by the template is taken out of the text instead, so
    llama.cpp's ids are polyspec's either way."""
    from polyspec.prompts import encode, render

    text = render(fmt, tokenizer, [{"role": "user", "content": user_turn}])
    ids = encode(fmt, tokenizer, text)
    bos = tokenizer.bos_token
    starts_with_bos = bool(ids) and bos is not None and ids[0] == tokenizer.bos_token_id
    if starts_with_bos and not llama_adds_bos and not text.startswith(bos):
        text = bos + text
    elif starts_with_bos and llama_adds_bos and text.startswith(bos):
        text = text[len(bos) :]
    return text, ids


def probe_adds_bos(
    llama: LlamaCpp, target_gguf: Path, bos_id: int | None, s: Settings, logs: Path
) -> bool:
    """Whether llama.cpp puts a BOS before a prompt even with ``add_bos_token`` overridden to false
    (its vocab loader forces it for some tokenizers): tokenizes "a" with
    ``llama-completion --verbose-prompt -n 1``."""
    prompt = atomic_write_text(logs / "probe-bos.txt", "a\n")
    cmd = [
        str(llama.tool("llama-completion")),
        "-m",
        str(target_gguf),
        "-f",
        str(prompt),
        "--no-escape",
        "--temp",
        "0",
        "-c",
        "256",
        "-t",
        str(s.t),
        *NO_BOS,
        "-n",
        "1",
        "-no-cnv",
        "--no-display-prompt",
        "--verbose-prompt",
    ]
    rc, _, err = _run_tool(cmd, logs / "probe-bos")
    if rc != 0:
        raise PolyspecError(
            f"llama-completion failed on {target_gguf.name} (exit {rc}): {error_message(err)}"
        )
    ids = parse_completion(err)["prompt_ids"] or []
    return bos_id is not None and ids[:1] == [bos_id]


@dataclass
class Settings:
    n: int = 64  # -n of the speculative runs
    draft: int = 4  # --spec-draft-n-max
    ngram_n: int = 3
    ngram_m: int | None = None  # default: draft
    threads: int | None = None  # default: the CPUs this process may use, less one
    ctx: int = 4096
    cost_k: int = 16  # cost curve k = 1..cost_k (0: skip)
    cost_passes: int = 2
    # further draft lengths the EAGLE-3 drafter runs at (modes eagle3@k): the draft_n choice
    sweep: tuple[int, ...] = ()

    @property
    def m(self) -> int:
        return self.ngram_m or self.draft

    @property
    def t(self) -> int:
        # one CPU is left to everything else: llama.cpp's threads wait on each other at every op, so
        # one preempted thread stalls them all (evidence: docs/experiments.md#llamacpp-threads)
        return self.threads or max(1, len(os.sched_getaffinity(0)) - 1)

    @property
    def plain_n(self) -> int:
        return self.n + max(self.draft, self.m, *self.sweep) + 1


def commands(
    llama: LlamaCpp, s: Settings, target_gguf: Path, prompt_file: Path, draft_gguf: Path | None
) -> dict:
    """The exact command lines of the three modes for one prompt."""
    common = [
        "-f",
        str(prompt_file),
        "--no-escape",
        "--temp",
        "0",
        "-c",
        str(s.ctx),
        "-t",
        str(s.t),
        *NO_BOS,
    ]
    spec = [
        str(llama.tool("llama-speculative-simple")),
        "-m",
        str(target_gguf),
        *common,
        "-n",
        str(s.n),
    ]
    cmds = {
        "plain": [
            str(llama.tool("llama-completion")),
            "-m",
            str(target_gguf),
            *common,
            "-n",
            str(s.plain_n),
            "-no-cnv",
            "--no-display-prompt",
            "--verbose-prompt",
        ]
    }
    if draft_gguf is not None:
        cmds["eagle3"] = [
            *spec,
            "-md",
            str(draft_gguf),
            "--spec-type",
            "draft-eagle3",
            "--spec-draft-n-max",
            str(s.draft),
        ]
        for k in sorted(set(s.sweep) - {s.draft}):
            cmds[f"eagle3@{k}"] = [*cmds["eagle3"][:-1], str(k)]
    cmds["ngram"] = [
        *spec,
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        str(s.ngram_n),
        "--spec-ngram-simple-size-m",
        str(s.m),
    ]
    return cmds


def _run_tool(cmd: list[str], log_stem: Path) -> tuple[int, bytes, str]:
    """Run one llama.cpp tool; its stdout / stderr are kept as ``log_stem.out`` / ``.err``."""
    try:
        r = subprocess.run(cmd, capture_output=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PolyspecError(
            f"{Path(cmd[0]).name} ran past {RUN_TIMEOUT_S} s (is the machine busy?): "
            f"{shlex.join(cmd)}"
        ) from None
    atomic_write_bytes(log_stem.with_suffix(".out"), r.stdout)
    atomic_write_bytes(log_stem.with_suffix(".err"), r.stderr)
    return r.returncode, r.stdout, r.stderr.decode("utf-8", errors="replace")


def run_prompt(cmds: dict, prompt: str, logs: Path, count_tokens=None) -> dict[str, Any]:
    """Run the modes for one prompt, plain first; {mode: parsed result | {"error": llama.cpp's
    message}}. ``count_tokens(text)``: the target tokenizer's count, to place a first difference in
    tokens."""
    res: dict[str, Any] = {}
    rc, out, err = _run_tool(cmds["plain"], logs / "plain")
    if rc != 0:
        raise PolyspecError(f"llama-completion failed (exit {rc}): {error_message(err)}")
    plain = parse_completion(err)
    plain_text, plain_eos = completion_text(out)
    res["plain"] = {**plain, "eos": plain_eos, "text": plain_text.decode("utf-8", errors="replace")}
    for mode in [m for m in cmds if m != "plain"]:
        if mode.startswith("eagle3@") and "error" in res.get("eagle3", {"error": None}):
            continue  # llama.cpp refused the drafter at the main length
        rc, out, err = _run_tool(cmds[mode], logs / mode.replace("@", "-"))
        if rc != 0 or not _DECODED.search(err):
            if not mode.startswith("eagle3"):
                raise PolyspecError(
                    f"llama-speculative-simple ({mode}) failed (exit {rc}): {error_message(err)}"
                )
            # e.g. an architecture llama.cpp cannot serve
            res[mode] = {"error": error_message(err), "exit": rc}
            continue
        r = parse_speculative(err)
        text = speculative_text(out, prompt)
        # the example stops once n_predict > -n, or at EOS: stopping at or before -n means EOS (an
        # EOS inside the last verification step is not told apart from the -n stop; the prefix rule
        # covers it)
        eos = r["tokens"] <= _arg(cmds[mode], "-n")
        r.update(spec_metrics(r["tokens"], r["n_drafted"], r["n_accept"]))
        r.update(
            compare(plain_text, plain_eos, text, eos),
            eos=eos,
            text=text.decode("utf-8", errors="replace"),
        )
        if not r["identical"] and count_tokens is not None:
            r["first_diff_token"] = count_tokens(
                plain_text[: r["common_bytes"]].decode("utf-8", errors="ignore")
            )
        r["speedup"] = r["tok_s"] / plain["tok_s"] if plain["tok_s"] else None
        res[mode] = r
    return res


def _arg(cmd: list[str], flag: str) -> int:
    return int(cmd[cmd.index(flag) + 1])


def cost_curve(
    llama: LlamaCpp, target_gguf: Path, s: Settings, logs: Path, log=print
) -> dict[str, Any]:
    """t(k) = time of one target decode of k tokens at a 256-token context (llama-batched-bench), k
    = 1..cost_k; the smaller of ``cost_passes`` passes per k; ratio = t(k)/t(1)."""
    ks = list(range(1, s.cost_k + 1))
    cmd = [
        str(llama.tool("llama-batched-bench")),
        "-m",
        str(target_gguf),
        "-c",
        str(COST_CONTEXT + ks[-1] * COST_TG + 64),
        "-npp",
        str(COST_CONTEXT),
        "-ntg",
        str(COST_TG),
        "-npl",
        ",".join(map(str, ks)),
        "-pps",
        "-kvu",
        "--output-format",
        "jsonl",
        "-t",
        str(s.t),
    ]
    best: dict[int, float] = {}
    for p in range(s.cost_passes):
        log(
            f"[llamacpp] cost curve pass {p + 1}/{s.cost_passes}: k = 1..{ks[-1]} at context "
            f"{COST_CONTEXT}"
        )
        rc, out, err = _run_tool(cmd, logs / f"batched-bench-{p + 1}")
        if rc != 0:
            raise PolyspecError(f"llama-batched-bench failed (exit {rc}): {error_message(err)}")
        for row in parse_batched_bench(out.decode("utf-8", errors="replace")):
            t = row["t_tg"] / row["tg"]
            best[row["pl"]] = min(best.get(row["pl"], t), t)
    return {
        "context": COST_CONTEXT,
        "tg": COST_TG,
        "passes": s.cost_passes,
        "command": shlex.join(cmd),
        "t_s": {k: best[k] for k in sorted(best)},
        "ratio": {k: best[k] / best[1] for k in sorted(best)} if 1 in best else {},
    }


def bench(
    llama: LlamaCpp,
    target_name: str,
    out: str | Path,
    drafters: str | Path | None = None,
    langs: list[str] | None = None,
    prompts: int = 8,
    settings: Settings | None = None,
    outtype: str = "f32",
    models_dir: str | Path | None = None,
    engines_json: Path | None = None,
    log=print,
) -> dict:
    """Convert (cached), run plain / eagle3 / ngram on the held-out prompts, measure the cost curve,
    write ``out/llamacpp.json`` + ``out/llamacpp.md``; returns the report."""
    from polyspec.targets import load_target

    s = settings or Settings()
    out = Path(out)
    plan, folders = _plan_drafters(drafters, target_name, out, langs, log)
    target_gguf, drafts = convert_all(
        llama, target_name, folders, out, outtype, models_dir, log=log
    )
    target = load_target(target_name, device="cpu", with_model=False)  # tokenizer + prompt format
    adds_bos = probe_adds_bos(llama, target_gguf, target.tokenizer.bos_token_id, s, out / "logs")
    load_start = os.getloadavg()

    def count_tokens(text: str) -> int:
        return len(target.tokenizer(text, add_special_tokens=False)["input_ids"])

    rows, errors, cmd_example, skip = _run_heldout(
        llama, s, target, target_gguf, drafts, plan, prompts, adds_bos, out, count_tokens, log
    )
    curve = cost_curve(llama, target_gguf, s, out / "logs", log=log) if s.cost_k > 0 else None
    modes = ("eagle3", *(f"eagle3@{k}" for k in sorted(set(s.sweep) - {s.draft})), "ngram")
    lengths = (
        choose_draft_lengths(rows, s, curve, engines_json, modes) if s.sweep and curve else None
    )
    extra = sorted({d["draft_n"] for d in (lengths or {}).values()} - set(s.sweep) - {s.draft})
    if extra:  # a chosen length not run yet: run it too, so the choice is checked by a measurement
        _run_chosen_lengths(
            llama, s, target_gguf, drafts, rows, skip, extra, out, count_tokens, log
        )
        modes = (*modes[:-1], *(f"eagle3@{k}" for k in extra), modes[-1])
        lengths = choose_draft_lengths(rows, s, curve, engines_json, modes)
    report = {
        **_setup_record(llama, load_start, target, target_gguf, outtype),
        "drafters": {lang: str(p) for lang, p in drafts.items()},
        "settings": _settings_record(s, prompts, plan, adds_bos),
        "commands": cmd_example,
        "eagle3_error": errors or None,
        "rows": rows,
        "overall": summarize(rows, modes, curve=curve["t_s"] if curve else None),
        "cost_curve": curve,
        "draft_length": lengths,
        "definitions": dict(DEFINITIONS),
    }
    write(out, report)
    return report


def _plan_drafters(
    drafters: str | Path | None, target_name: str, out: Path, langs: list[str] | None, log
) -> tuple[list, dict]:
    """The (drafter, language) pairs to run and the drafters' folders they use."""
    folders = resolve_drafters(drafters, target_name, out, log=log)
    plan = bench_plan(folders, langs)
    folders = {name: folders[name] for name in dict.fromkeys(name for name, _ in plan if name)}
    return plan, folders


def _run_heldout(
    llama: LlamaCpp,
    s: Settings,
    target,
    target_gguf: Path,
    drafts: dict,
    plan: list,
    prompts: int,
    adds_bos: bool,
    out: Path,
    count_tokens,
    log,
) -> tuple[list[dict], dict, dict, set]:
    """Each planned pair's held-out prompts through the modes: rows, refusals, commands, skips."""
    rows, errors, cmd_example, skip = [], {}, {}, set()
    for name, lang in plan:
        for q in heldout_prompts(lang, prompts):
            text, ids = llama_prompt(
                target.spec.prompt_format, target.tokenizer, q["turns"][0], adds_bos
            )
            logs = out / "logs" / (name or "no-drafter") / q["id"]
            # -f drops one trailing newline
            prompt_file = atomic_write_text(logs / "prompt.txt", text + "\n")
            cmds = commands(
                llama, s, target_gguf, prompt_file, None if name in skip else drafts.get(name)
            )
            cmd_example = cmd_example or {m: shlex.join(c) for m, c in cmds.items()}
            log(
                f"[llamacpp] {q['id']} ({len(ids)} prompt tokens; drafter {name}): "
                f"{', '.join(cmds)}"
            )
            res = run_prompt(cmds, text, logs, count_tokens)
            if "error" in res.get("eagle3", {}):
                errors[name] = res.pop("eagle3")["error"]
                log(
                    f"[llamacpp] llama.cpp refused EAGLE-3 drafter {name}: {errors[name]} — going "
                    "on with plain + ngram"
                )
                skip.add(name)
            rows.append(_prompt_row(name, lang, q, ids, res))
    return rows, errors, cmd_example, skip


def _prompt_row(name: str | None, lang: str, q: dict, ids: list[int], res: dict) -> dict:
    """One prompt's row: its drafter, language, id and category, its ids checked, the modes."""
    pids = res["plain"].pop("prompt_ids")
    return {
        "drafter": name,
        "lang": lang,
        "id": q["id"],
        "category": q["category"],
        "prompt_tokens": len(ids),
        "prompt_tokens_equal": pids == ids if pids is not None else None,
        **res,
    }


def _run_chosen_lengths(
    llama: LlamaCpp,
    s: Settings,
    target_gguf: Path,
    drafts: dict,
    rows: list[dict],
    skip: set,
    extra: list[int],
    out: Path,
    count_tokens,
    log,
) -> None:
    """The drafter rows' prompts again at the chosen draft lengths not run yet, into the rows."""
    for row in rows:
        if not row.get("drafter") or row["drafter"] in skip:
            continue
        logs = out / "logs" / row["drafter"] / row["id"]
        for k in extra:
            got = _run_at_length(
                llama, s, target_gguf, drafts[row["drafter"]], row, logs, k, count_tokens, log
            )
            if "error" not in got:
                row[f"eagle3@{k}"] = {
                    **got,
                    "speedup": got["tok_s"] / row["plain"]["tok_s"]
                    if row["plain"].get("tok_s")
                    else None,
                }


def _run_at_length(
    llama: LlamaCpp,
    s: Settings,
    target_gguf: Path,
    draft_gguf: Path,
    row: dict,
    logs: Path,
    k: int,
    count_tokens,
    log,
) -> dict:
    """One row's prompt (``logs/prompt.txt``) run plain + EAGLE-3 at draft length k: EAGLE-3's."""
    cmd = commands(
        llama, replace(s, draft=k, sweep=()), target_gguf, logs / "prompt.txt", draft_gguf
    )
    log(f"[llamacpp] {row['id']}: the chosen draft length {k}")
    # as written above, less its newline
    text = (logs / "prompt.txt").read_text(encoding="utf-8")[:-1]
    return run_prompt(
        {"plain": cmd["plain"], f"eagle3@{k}": cmd["eagle3"]},
        text,
        logs / f"draft-{k}",
        count_tokens,
    )[f"eagle3@{k}"]


def _setup_record(
    llama: LlamaCpp, load_start: tuple, target, target_gguf: Path, outtype: str
) -> dict:
    """The report's ``llamacpp`` build, ``machine`` (its load at start and now) and ``target``."""
    return {
        "llamacpp": {
            "package": f"{PACKAGE}=={VERSION}",
            "src": str(llama.src),
            "build_dir": str(llama.build_dir),
        },
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "loadavg_1m_start": round(load_start[0], 2),
            "loadavg_1m_end": round(os.getloadavg()[0], 2),
        },
        "target": {
            "name": target.spec.name,
            "architecture": (getattr(target.config, "architectures", None) or ["?"])[0],
            "gguf": str(target_gguf),
            "outtype": outtype,
        },
    }


def _settings_record(s: Settings, prompts: int, plan: list, adds_bos: bool) -> dict:
    """The report's ``settings``: what every run was given."""
    return {
        "n": s.n,
        "plain_n": s.plain_n,
        "draft_n_max": s.draft,
        "ngram": {"type": "ngram-simple", "size_n": s.ngram_n, "size_m": s.m},
        "threads": s.t,
        "ctx": s.ctx,
        "prompts_per_lang": prompts,
        "langs": list(dict.fromkeys(lang for _, lang in plan)),
        "temp": 0,
        "llama_adds_bos": adds_bos,
    }
