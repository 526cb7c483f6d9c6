"""``python -m engines.vllm.load`` (``make load-vllm``) — ``vllm serve`` under load: a plain server,
vLLM's ``ngram`` server and polyspec's (``eagle3``, the plugin's ``hybrid``), one after another on
127.0.0.1, each driven by bounded concurrent clients over held-out prompts.

    python -m engines.vllm.load --run runs/demo [--target gemma3-270m] [--lang vi]
        [--langs vi,de,ja] [--modes plain,ngram,eagle3,hybrid,adaspec,adaspec-hybrid]
        [--concurrency 1,4,16] [--temperatures 0,0.7]
        [--prompts 16] [--n 64] [--dtype float32] [--eager] [--port 8011] [--out <run>/vllm/load]

Per mode, concurrency and temperature: every prompt once (``--prompts`` of ``--lang``'s held-out
prompts, polyspec's rendering, sent as token ids to ``/v1/completions``), at most ``concurrency``
requests in flight; throughput = generated tokens / wall seconds; p50 / p95 request latency;
failures; greedy answers compared with the plain server's at the same concurrency (fp32: they must
be equal). Then, on the last server: a client that drops its stream after the first chunk and
malformed requests (each must get a 4xx with one line), and the server must still answer. The
clients stop by themselves: a fixed number of requests, a timeout on each, a deadline per pass.
Writes ``<out>/load.json`` and ``<out>/load.md``; exit status 1 on a failed request, a greedy
answer unequal to plain's in fp32, a bad request not answered with a 4xx, or a server that stopped
answering."""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engines.vllm.run import prompt_groups, prompt_rows
from engines.vllm.serve import MODES, SERVED_NAME, ServeConfig, Server, add_run_args, drafter_of
from engines.vllm.serve import speculative_config as spec_of
from polyspec.device import host_kind
from polyspec.errors import PolyspecError, cli_entry
from polyspec.io import atomic_write_json, atomic_write_text

REQUEST_TIMEOUT = 300.0  # seconds one request may take
PASS_DEADLINE = 1800.0  # seconds one (mode, concurrency, temperature) pass may take

# Malformed requests the server must answer with a 4xx: (what, body or raw bytes)
BAD_REQUESTS = [
    ("max_tokens not a number", {"max_tokens": "many"}),
    ("negative temperature", {"temperature": -1.0}),
    ("token id outside the vocabulary", {"prompt": [10**9]}),
    ("not JSON", b"{this is not json"),
]
# on a server with per-language drafters (adaspec): a language tag that is no language code
BAD_LANG = ("language tag not a language code", {"vllm_xargs": {"lang": "Klingon"}})


def complete(url: str, body: dict | bytes, timeout: float = REQUEST_TIMEOUT) -> dict:
    """One POST to ``/v1/completions``: {ok, status, seconds, token_ids | error}."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        url + "/v1/completions", data=data, headers={"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            got = json.loads(r.read())
            choice = got["choices"][0]
            return {
                "ok": True,
                "status": r.status,
                "seconds": time.perf_counter() - t0,
                "token_ids": list(choice.get("token_ids") or []),
            }
    except urllib.error.HTTPError as e:
        text = e.read().decode("utf-8", errors="replace")
        return {
            "ok": False,
            "status": e.code,
            "seconds": time.perf_counter() - t0,
            "error": _message(text),
        }
    except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
        return {
            "ok": False,
            "status": None,
            "seconds": time.perf_counter() - t0,
            "error": f"{type(e).__name__}: {e}"[:300],
        }


def _message(text: str) -> str:
    """The error message of a server's JSON error body (else its text), on one line."""
    try:
        got = json.loads(text)
        msg = (got.get("error") or {}).get("message") if isinstance(got, dict) else None
        text = msg or text
    except ValueError:
        pass
    return " ".join(text.split())[:300]


def body_for(
    ids: list[int],
    n: int,
    temperature: float,
    stop: list[str] | None,
    seed: int,
    lang: str | None = None,
) -> dict:
    body = {
        "model": SERVED_NAME,
        "prompt": ids,
        "max_tokens": n,
        "temperature": temperature,
        "seed": seed,
        "stop": stop or None,
        "return_token_ids": True,
    }
    if lang:  # the plugin's per-request drafters read it; vLLM alone ignores it
        body["vllm_xargs"] = {"lang": lang}
    return body


def run_pass(
    url: str, rows: list[dict], concurrency: int, n: int, temperature: float, stop
) -> dict:
    """Every row once, at most ``concurrency`` in flight: throughput, latencies, failures, the
    answers by prompt id."""
    bodies = [
        body_for(r["ids"], n, temperature, stop, seed=i, lang=r["lang"]) for i, r in enumerate(rows)
    ]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        got = list(pool.map(lambda b: complete(url, b), bodies, timeout=PASS_DEADLINE))
    wall = time.perf_counter() - t0
    ok = [g for g in got if g["ok"]]
    lat = sorted(g["seconds"] for g in ok)
    tokens = sum(len(g["token_ids"]) for g in ok)
    return {
        "requests": len(got),
        "failures": len(got) - len(ok),
        "errors": sorted({g["error"] for g in got if not g["ok"]})[:3],
        "tokens": tokens,
        "wall_seconds": round(wall, 3),
        "tok_s": round(tokens / wall, 2) if wall else None,
        "p50_s": round(statistics.median(lat), 3) if lat else None,
        "p95_s": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 3) if lat else None,
        "answers": {r["id"]: g.get("token_ids") for r, g in zip(rows, got)},
    }


def dropped_stream(url: str, ids: list[int], n: int) -> bool:
    """A streaming request whose client closes the connection after the first chunk (a client
    killed mid-stream). True when a first chunk arrived."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=REQUEST_TIMEOUT)
    body = {**body_for(ids, n, 0.0, None, 0), "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    first = r.read1(64) if r.status == 200 else b""
    conn.sock.close()  # gone mid-stream: no further read, no orderly close
    conn.close()
    return bool(first)


def bad_requests(url: str, ids: list[int], per_language: bool = False) -> list[dict]:
    """Each malformed request's status and one-line message (``per_language``: the server has
    per-language drafters, so a bad language tag is one too)."""
    out = []
    for what, change in BAD_REQUESTS + ([BAD_LANG] if per_language else []):
        body = change if isinstance(change, bytes) else {**body_for(ids, 8, 0.0, None, 0), **change}
        got = complete(url, body, timeout=60)
        out.append(
            {
                "request": what,
                "status": got["status"],
                "message": got.get("error"),
                "ok": got["status"] is not None and 400 <= got["status"] < 500,
            }
        )
    return out


def spec_metrics(url: str) -> dict:
    """vLLM's speculative counters from the server's Prometheus ``/metrics``: drafts, draft tokens,
    accepted tokens (0 where it drafts nothing)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode("utf-8", errors="replace")
    got = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0}
    names = {
        "vllm:spec_decode_num_drafts_total": "drafts",
        "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens_total": "accepted",
    }
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in names:
            got[names[name]] += float(line.rsplit(" ", 1)[1])
    return {k: int(v) for k, v in got.items()}


def load_test(a: argparse.Namespace, log=print) -> dict:
    from polyspec.targets import load_target, model_path

    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise PolyspecError(f"--modes: some of {', '.join(MODES)}, got {a.modes!r}")
    conc = sorted({int(x) for x in a.concurrency.split(",")})
    temps = [float(x) for x in a.temperatures.split(",")]
    if min(conc) < 1 or a.prompts < 1 or a.n < 1:
        raise PolyspecError("--concurrency, --prompts and --n must be at least 1")
    out = Path(a.out or Path(a.run) / "vllm" / "load")
    target = load_target(a.target, device="cpu", with_model=False)
    langs = [x.strip() for x in (a.langs or a.lang).split(",") if x.strip()]
    # the check-vllm bench's rendering; several languages taken in turn, so batches mix them
    rows = prompt_groups(prompt_rows(target, langs, a.prompts), 10**9, True)[0]
    stop = list(target.spec.prompt_format.stop) or None
    max_len = max(len(r["ids"]) for r in rows) + a.n + 16
    report = {
        "host": host_kind(),
        "target": a.target,
        "lang": ",".join(langs),
        "drafters": {},
        "settings": {
            "dtype": a.dtype,
            "n": a.n,
            "prompts": len(rows),
            "concurrency": conc,
            "temperatures": temps,
            "enforce_eager": a.eager,
        },
        "modes": {},
    }
    for i, mode in enumerate(modes):
        drafter, engines = drafter_of(a, mode)
        report["drafters"][mode] = str(drafter)
        spec = spec_of(mode, drafter, engines, hybrid_dir=out / mode / drafter.name)
        cfg = ServeConfig(model_path(target.spec), mode, spec, a.dtype, a.port, max_len, a.eager)
        with Server(cfg, out / "logs" / f"{mode}.log") as server:
            log(f"[load] {mode}: vllm serve up in {server.start_seconds:.0f} s")
            complete(server.url, body_for(rows[0]["ids"], 8, 0.0, stop, 0))  # warm-up
            passes = {}
            for c in conc:
                for t in temps:
                    p = run_pass(server.url, rows, c, a.n, t, stop)
                    passes[f"c{c}-t{t:g}"] = {"concurrency": c, "temperature": t, **p}
                    log(
                        f"[load] {mode} c{c} t{t:g}: {p['tok_s']} tok/s, p50 {p['p50_s']} s, "
                        f"p95 {p['p95_s']} s, {p['failures']} failed"
                    )
            entry = {
                "speculative_config": spec,
                "start_seconds": round(server.start_seconds, 1),
                "spec": spec_metrics(server.url),
            }
            if i == len(modes) - 1:  # the robustness checks, on the last server
                entry["dropped_stream_first_chunk"] = dropped_stream(
                    server.url, rows[0]["ids"], a.n
                )
                entry["bad_requests"] = bad_requests(
                    server.url, rows[0]["ids"], per_language=mode.startswith("adaspec")
                )
                after = complete(server.url, body_for(rows[0]["ids"], 8, 0.0, stop, 0))
                entry["serves_after"] = after["ok"]
            entry["passes"] = passes
            report["modes"][mode] = entry
    _compare_greedy(report)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "load.json", report)
    atomic_write_text(out / "load.md", markdown(report))
    return report


def _compare_greedy(report: dict) -> None:
    """Each greedy pass's answers against the plain server's at the same concurrency."""
    plain = report["modes"].get("plain", {}).get("passes", {})
    for entry in report["modes"].values():
        for key, p in entry["passes"].items():
            ref = plain.get(key)
            if p["temperature"] == 0 and ref is not None:
                p["identical"] = sum(
                    p["answers"][k] is not None and p["answers"][k] == ref["answers"].get(k)
                    for k in p["answers"]
                )


def markdown(report: dict) -> str:
    st = report["settings"]
    lines = [
        f"# vllm serve under load — {report['target']} ({report['lang']}), {report['host']}",
        "",
        f"{st['prompts']} held-out prompts a pass, {st['n']} new tokens, {st['dtype']}"
        + (", enforce_eager" if st["enforce_eager"] else "")
        + "; every server on 127.0.0.1, the modes one after another.",
        "",
        "| mode | clients | temperature | tok/s | × plain | p50 s | p95 s | failed | identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    plain = report["modes"].get("plain", {}).get("passes", {})
    for mode, entry in report["modes"].items():
        for key, p in entry["passes"].items():
            ref = (plain.get(key) or {}).get("tok_s")
            ratio = f"{p['tok_s'] / ref:.2f}" if ref and p["tok_s"] else "—"
            same = f"{p['identical']}/{p['requests']}" if "identical" in p else "—"
            lines.append(
                f"| {mode} | {p['concurrency']} | {p['temperature']:g} | {p['tok_s']} | {ratio} | "
                f"{p['p50_s']} | {p['p95_s']} | {p['failures']} | {same} |"
            )
    for mode, entry in report["modes"].items():
        if "bad_requests" in entry:
            lines += [
                "",
                f"On the {mode} server: a client dropped mid-stream (first chunk received: "
                f"{entry['dropped_stream_first_chunk']}); the server answered afterwards: "
                f"{entry['serves_after']}.",
                "",
                "| malformed request | status | message |",
                "|---|---|---|",
            ] + [
                f"| {b['request']} | {b['status']} | {(b['message'] or '').replace('|', '/')} |"
                for b in entry["bad_requests"]
            ]
    return "\n".join(lines) + "\n"


def problems(report: dict) -> list[str]:
    """What makes the load test fail."""
    out = []
    fp32 = report["settings"]["dtype"] == "float32"
    for mode, entry in report["modes"].items():
        for key, p in entry["passes"].items():
            if p["failures"]:
                out.append(f"{mode} {key}: {p['failures']} failed ({'; '.join(p['errors'])})")
            if fp32 and "identical" in p and p["identical"] < p["requests"]:
                out.append(f"{mode} {key}: {p['identical']}/{p['requests']} equal to plain's")
        for b in entry.get("bad_requests", []):
            if not b["ok"]:
                out.append(f"{mode}: {b['request']} answered {b['status']}, not a 4xx")
        if entry.get("serves_after") is False:
            out.append(f"{mode}: the server stopped answering after the robustness checks")
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m engines.vllm.load", description=__doc__.split("\n\n")[0]
    )
    add_run_args(ap)  # --lang: the drafter's language and the prompts'
    ap.add_argument(
        "--langs",
        default=None,
        help="the prompts' languages, comma-separated, taken in turn (default --lang): mixed "
        "traffic for the adaspec modes, each request tagged with its language",
    )
    ap.add_argument("--modes", default="plain,ngram,eagle3,hybrid")
    ap.add_argument("--concurrency", default="1,4,16", help="clients in flight, comma-separated")
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=64, help="max new tokens")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--eager", action="store_true", help="vLLM enforce_eager (quick start)")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--out", default=None, help="default <run>/vllm/load")
    return ap


@cli_entry
def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(sys.argv[1:] if argv is None else argv)
    report = load_test(a)
    out = Path(a.out or Path(a.run) / "vllm" / "load")
    print(markdown(report))
    print(f"written: {out / 'load.json'}, {out / 'load.md'}")
    bad = problems(report)
    for p in bad:
        print(f"load-vllm: {p}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
