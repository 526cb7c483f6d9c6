"""Run a plan: each stage as its own process (the same command a user would type), logs per stage, a
``DONE`` record per stage holding a hash of its command/config and of its inputs' records.

A rerun skips every stage whose record matches and redoes those whose config or inputs changed
(their dependants follow, since their inputs' hashes change). ``from_stage`` redoes that stage and
everything after it; ``force`` redoes all, and a stage redone that way starts afresh (its ``work``
is cleared). A crash or Ctrl-C inside a stage leaves no record, so the same command runs that stage
again — which resumes from its own checkpoints (synth store, trainer checkpoints).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from pipelines.plan import Stage
from polyspec.errors import PolyspecError
from polyspec.io import atomic_write_json, sha256_file


def stage_hash(stage: Stage, done: dict[str, str]) -> str:
    payload = {
        "cmd": stage.cmd[1:],
        "config": stage.config,  # not the interpreter path: venvs move
        "inputs": {d: done.get(d) for d in stage.deps},
        "files": _config_files(stage),
    }
    # only where a stage names them, so the records of every other stage keep their hash
    if stage.data:
        # by name: the same from any cwd
        payload["data"] = {Path(f).name: sha256_file(f) for f in stage.data}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _config_files(stage: Stage) -> dict[str, str]:
    """Contents of the YAML files a stage reads, so editing one redoes the stage."""
    out = {}
    for i, a in enumerate(stage.cmd):
        if a == "--config" and i + 1 < len(stage.cmd) and Path(stage.cmd[i + 1]).is_file():
            out[stage.cmd[i + 1]] = hashlib.sha256(Path(stage.cmd[i + 1]).read_bytes()).hexdigest()
    return out


def read_done(stage: Stage) -> dict | None:
    try:
        return json.loads(stage.done.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def run_plan(
    stages: list[Stage],
    run: Path,
    eta_minutes: dict[str, float],
    from_stage: str | None = None,
    force: bool = False,
    log=print,
) -> dict[str, str]:
    """Execute (or skip) every stage in order; returns stage → DONE hash."""
    names = [s.name for s in stages]
    if (
        from_stage
        and from_stage not in names
        and not any(n.split(":")[0] == from_stage for n in names)
    ):
        raise PolyspecError(f"FROM={from_stage}: not a stage of this plan ({', '.join(names)})")
    start_at = (
        next(
            (i for i, s in enumerate(stages) if from_stage in (s.name, s.name.split(":")[0])), None
        )
        if from_stage
        else None
    )
    logs = run / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    done: dict[str, str] = {}
    t_start = time.time()
    remaining = {s.name: eta_minutes.get(s.kind, 1.0) * 60 for s in stages}
    for i, st in enumerate(stages):
        h = stage_hash(st, done)
        rec = read_done(st)
        redo = force or (start_at is not None and i >= start_at)
        if rec and rec.get("hash") == h and not redo:
            done[st.name] = h
            remaining.pop(st.name)
            log(f"[{i + 1}/{len(stages)}] {st.name}: done before (DONE record matches), skipped")
            continue
        eta = sum(remaining.values())
        log(
            f"[{i + 1}/{len(stages)}] {st.name}: running — elapsed {_fmt(time.time() - t_start)}, "
            f"ETA {_fmt(eta)} (log: {logs / (st.name.replace(':', '-') + '.log')})"
        )
        if redo:
            _clear_work(st, run, log)
        t0 = time.time()
        _run(st, logs / f"{st.name.replace(':', '-')}.log")
        done[st.name] = h
        remaining.pop(st.name)
        st.done.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            st.done,
            {
                "stage": st.name,
                "hash": h,
                "cmd": st.cmd,
                "inputs": {d: done[d] for d in st.deps},
                "seconds": round(time.time() - t0, 1),
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
            },
        )
        log(f"      {st.name}: finished in {_fmt(time.time() - t0)}")
    log(f"all {len(stages)} stages done in {_fmt(time.time() - t_start)}")
    return done


def _clear_work(st: Stage, run: Path, log) -> None:
    """An explicit redo starts the stage afresh: its resumable work (inside the run directory only)
    is removed."""
    root = run.resolve()
    for path in st.work:
        p = path.resolve()
        if p == root or root not in p.parents:
            raise PolyspecError(
                f"stage {st.name}: {path} is not inside the run directory {run}; not cleared"
            )
        if p.exists():
            gone = p.with_name(f".{p.name}.cleared-{os.getpid()}")
            # one rename: an interrupted removal never leaves a half-cleared folder behind
            p.rename(gone)
            shutil.rmtree(gone)
            log(
                f"      {st.name}: cleared {path} (FROM/FORCE redoes the stage's work, not a "
                "resume)"
            )


def _run(st: Stage, log_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"),
    }
    with open(log_path, "a", encoding="utf-8") as f:
        f.write(f"\n$ {' '.join(st.cmd)}\n")
        f.flush()
        proc = subprocess.run(st.cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        tail = [
            line
            for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines()
            if line.strip()
        ]
        last = tail[-1][-300:] if tail else ""
        raise PolyspecError(
            f"stage {st.name} failed (exit {proc.returncode}): {last} — full log: {log_path}"
        )


def _fmt(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}"
