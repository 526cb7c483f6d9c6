"""The process that runs vLLM for polyspec: started by :mod:`polyspec.vllm_process` with the vLLM
environment's Python (``make setup-vllm``: vLLM pins another transformers than polyspec's), it
imports only the standard library and vLLM, never polyspec.

Protocol: one JSON object per line. Requests arrive on stdin, answers leave on the original stdout;
everything else the process or vLLM's engine-core children print goes to stderr (the caller's log
file).

- ``{"op": "load", "llm": {LLM keyword arguments}}`` → ``{"ok": true, "seconds", "vllm"}``
- ``{"op": "generate", "prompts": [[ids], …], "params": [{SamplingParams keyword arguments}, …]}`` →
  ``{"outputs": [{"token_ids", "text", "finish_reason", "cumulative_logprob", "logprobs"}, …],
  "seconds"}`` (``logprobs``: per generated position ``[[token id, logprob], …]`` when the params
  asked for them)
- ``{"op": "metrics"}`` → ``{"metrics": {name: number or [numbers]}}`` (vLLM's counters and vectors)
- ``{"op": "probe", "architectures": [name, …]}`` → ``{"vllm", "architectures": {name: {"known",
  "eagle3"}}}``: whether this vLLM has a model class for each and whether it serves EAGLE-3 drafts
  for it (no model is loaded)
- ``{"op": "close"}`` → the process exits.

A failure answers ``{"error": "<Type>: <message>"}`` and the process exits.
"""

import argparse
import json
import os
import sys
import time
import traceback


def _answer(out, obj) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _metrics(llm) -> dict:
    got = {}
    for m in llm.get_metrics():
        value = getattr(m, "value", None)
        if value is None:
            value = getattr(m, "values", None)
        if isinstance(value, (int, float)) or (
            isinstance(value, list) and all(isinstance(v, (int, float)) for v in value)
        ):
            got[m.name] = value
    return got


def _probe(architectures: list) -> dict:
    import vllm
    from vllm.model_executor.models.interfaces import supports_eagle3
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.plugins import load_general_plugins

    # as every vLLM process does before it builds a model: plugins may register architectures
    # (polyspec's registers Gemma-3 with EAGLE-3)
    load_general_plugins()
    got = {}
    for arch in architectures:
        cls = ModelRegistry._try_load_model_cls(arch)
        got[arch] = {
            "known": cls is not None,
            "eagle3": bool(cls is not None and supports_eagle3(cls)),
        }
    return {"vllm": vllm.__version__, "architectures": got}


def serve(requests, out) -> None:
    llm = sampling = None
    for line in requests:
        if not line.strip():
            continue
        msg = json.loads(line)
        op = msg.get("op")
        if op == "close":
            return
        t0 = time.perf_counter()
        if op == "load":
            import vllm
            from vllm import LLM, SamplingParams

            sampling = SamplingParams
            llm = LLM(**msg["llm"])
            _answer(
                out, {"ok": True, "seconds": time.perf_counter() - t0, "vllm": vllm.__version__}
            )
        elif op == "generate":
            params = [sampling(**p) for p in msg["params"]]
            prompts = [{"prompt_token_ids": ids} for ids in msg["prompts"]]
            res = llm.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - t0
            _answer(
                out,
                {
                    "seconds": seconds,
                    "outputs": [
                        {
                            "token_ids": list(c.token_ids),
                            "text": c.text,
                            "finish_reason": c.finish_reason,
                            "cumulative_logprob": c.cumulative_logprob,
                            "logprobs": [
                                [[t, lp.logprob] for t, lp in pos.items()] for pos in c.logprobs
                            ]
                            if c.logprobs
                            else None,
                        }
                        for c in (r.outputs[0] for r in res)
                    ],
                },
            )
        elif op == "metrics":
            _answer(out, {"metrics": _metrics(llm)})
        elif op == "probe":
            _answer(out, _probe(msg["architectures"]))
        else:
            raise ValueError(f"unknown op {op!r}")


def main(argv: list | None = None) -> int:
    argparse.ArgumentParser(
        prog="vllm_worker.py",
        description="vLLM for polyspec: JSON requests on stdin, answers "
        "on stdout (started by polyspec.vllm_process with the vLLM environment's Python)",
    ).parse_args(argv)
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")  # the protocol's channel
    # vLLM logs to stdout, and its engine-core children inherit fd 1: both go to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        serve(sys.stdin, out)
    # any failure is reported in one line, the traceback to the log
    except BaseException as e:  # noqa: BLE001
        traceback.print_exc()
        _answer(out, {"error": f"{type(e).__name__}: {e}".splitlines()[0]})
        return 1
    return 0


# vLLM spawns its engine core: the guard keeps the child from running this again
if __name__ == "__main__":
    sys.exit(main())
