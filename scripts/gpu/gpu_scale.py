"""scripts/gpu/gpu_scale.py — the chat target's EAGLE-3 drafter at data scale, in one process on a
lent GPU (issue 59).

    python scripts/gpu/gpu_scale.py --target smollm2-135m-instruct --corpus DIR \
        --run /tmp/scale/run --out $OUT --budget 520 [--device auto]

The pipeline's own stages, called in order with one loaded target (scripts/gpu/gpu-scale.sh runs it
on the device; tests/test_gpu_smoke.py rehearses it on the tiny random target):

1. ``corpus``: the corpus stage's documents (``DIR/<lang>.jsonl.xz`` or ``.jsonl``, built here by
   ``python -m corpus``: the device has no network) into ``<run>/corpus/<lang>/data.jsonl``, and
   their target tokens;
2. ``heldout``: the held-out prompts answered greedily (the training score reads them; never trained
   on);
3. ``distill``: on-policy distillation of the pool and of up to ``--corpus-prompts`` prompts about
   corpus paragraphs (synth/pool.py), at T = 0, 0.7, 1.0, large batches, for at most its share of
   the budget (``max_seconds``);
4. ``vocab``: the draft vocabulary from the corpus and the distilled answers (``python -m vocab``);
5. ``pretrain``: EAGLE-3 on every corpus document (split into ``--seq-len`` pieces) and the
   distilled answers, the target's features computed in each step (``features: online``, bf16 on a
   GPU: the prefill of Yi et al. 2024's P step without writing ~4.6 KB a token to disk);
6. ``finetune``: on the distilled answers (response tokens), scored on the held-out answers;
7. ``export``: the bundle and the engines' folders (speculators), and ``drafter.tar.gz`` in parts of
   at most 15 MiB (the drafter's weights in bf16, its vocabulary, the held-out answers, the training
   metrics) for the CPU here;
8. ``bench``: ``decoder.bench`` on the device, bf16 then fp32, ``ar``, ``pld``, ``eagle3``,
   ``hybrid``.

Every step's figures (tokens, seconds, tokens/s, the training's held-out τ and α) go to
``<out>/scale.json`` as the step ends, so a call cut short still brings back what was done. A step
that fails is recorded and the ones that need it are skipped.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from polyspec.config import load_config  # noqa: E402
from polyspec.errors import first_line  # noqa: E402
from polyspec.io import atomic_write_json, read_jsonl  # noqa: E402
from polyspec.targets import load_target  # noqa: E402

PART = 15 * 2**20  # what comes back from the device: 8 files of ≤ 16 MiB


class Figures:
    """``<out>/scale.json``: the run's settings and each step's record, rewritten as each step
    ends."""

    def __init__(self, out: Path, settings: dict):
        self.out, self.t0 = out, time.time()
        self.data = {"settings": settings, "host": host(), "steps": {}}
        out.mkdir(parents=True, exist_ok=True)
        self.write()

    def write(self) -> None:
        self.data["wall_seconds"] = round(time.time() - self.t0, 1)
        if torch.cuda.is_available():
            self.data["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        atomic_write_json(self.out / "scale.json", self.data)

    def step(self, name: str, fn, *needs: str) -> dict | None:
        missing = [n for n in needs if not self.data["steps"].get(n, {}).get("ok")]
        if missing:
            self.data["steps"][name] = {"ok": False, "skipped": f"needs {', '.join(missing)}"}
            self.write()
            return None
        print(f"[scale] {name} (at {time.time() - self.t0:.0f} s)", flush=True)
        t = time.time()
        try:
            rec = {"ok": True, **(fn() or {})}
        # one step's failure is recorded; the others still run
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            rec = {"ok": False, "error": first_line(e)}
        rec["seconds"] = round(time.time() - t, 1)
        self.data["steps"][name] = rec
        self.write()
        print(f"[scale] {name}: {json.dumps(rec, default=str)[:600]}", flush=True)
        return rec if rec["ok"] else None


def host() -> dict:
    out = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    import transformers

    out["transformers"] = transformers.__version__
    return out


def run_module(*args: str, log: Path) -> None:
    """``python -m …`` in a child process (its output appended to ``log``); an exit code ≠ 0
    raises."""
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"\n$ python -m {' '.join(args)}\n")
        f.flush()
        rc = subprocess.run(
            [sys.executable, "-m", *args], cwd=REPO, stdout=f, stderr=subprocess.STDOUT
        ).returncode
    if rc:
        tail = " | ".join(
            log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-6:]
        )
        raise RuntimeError(f"python -m {args[0]} exited {rc}: {tail}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The harness's command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument(
        "--lang",
        default="en",
        help="the target's language: distillation, held-out prompts, finetune",
    )
    ap.add_argument(
        "--corpus",
        required=True,
        help="folder of <lang>.jsonl(.xz): corpus documents (python -m corpus)",
    )
    ap.add_argument("--run", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=520, help="seconds for every step together")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch", type=int, default=384, help="distillation rows generating together")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--corpus-prompts", type=int, default=20000)
    ap.add_argument(
        "--limit", type=int, default=None, help="distill at most this many prompts (default: all)"
    )
    ap.add_argument(
        "--distill-share", type=float, default=0.34, help="share of the budget left at its start"
    )
    ap.add_argument(
        "--seq-len", type=int, default=512, help="training sequence length (pretrain pieces)"
    )
    ap.add_argument("--train-batch", type=int, default=64)
    ap.add_argument("--pretrain-epochs", type=float, default=1.0)
    ap.add_argument("--finetune-epochs", type=float, default=2.0)
    ap.add_argument("--lr", type=float, default=None, help="default: the recipe's")
    ap.add_argument(
        "--draft-vocab", type=int, default=16384, help="the drafter's head rows (cpu-chat's)"
    )
    ap.add_argument(
        "--sizes", default="8192,16384,32768", help="the vocabulary masks' sizes (vocab, export)"
    )
    ap.add_argument(
        "--bench",
        default="bf16,fp32",
        help="the device's bench runs: bf16, fp32 (fp32 only with a minute left)",
    )
    ap.add_argument("--bench-tokens", type=int, default=128)
    ap.add_argument("--bench-per-cell", type=int, default=1)
    ap.add_argument(
        "--bench-reserve", type=float, default=130, help="seconds kept for export and the bench"
    )
    return ap.parse_args(argv)


class ScaleRun:
    """One harness run: its folders, deadline, figures and loaded target, and its steps."""

    def __init__(self, args: argparse.Namespace):
        """The run and out folders, the child processes' log, the deadline and ``scale.json``."""
        self.args = args
        self.run, self.out = Path(args.run).resolve(), Path(args.out).resolve()
        self.run.mkdir(parents=True, exist_ok=True)
        # the child processes' output (what comes back is 8 files: scale.json has their errors)
        self.log = self.run / "steps.log"
        self.deadline = time.time() + args.budget
        self.fig = Figures(self.out, vars(args))
        self.state: dict = {}

    def left(self) -> float:
        """Seconds left of the budget."""
        return self.deadline - time.time()

    def load(self):
        """Step ``load``: the target, loaded once for every in-process step."""
        t = load_target(self.args.target, device=self.args.device)
        self.state["target"] = t
        return {
            "device": str(t.device),
            "dtype": str(t.dtype).removeprefix("torch."),
            "layers": t.num_layers,
            "vocab": t.vocab_size,
            "tokenizer_sha256": t.tokenizer_sha256,
        }

    def corpus(self):
        """Step ``corpus``: each language's documents into the run, and their target tokens."""
        args, run = self.args, self.run
        tok, langs, counts = self.state["target"].tokenizer, [], {}
        for src in sorted(Path(args.corpus).glob("*.jsonl*")):
            lang = src.name.split(".")[0]
            dest = run / "corpus" / lang / "data.jsonl"
            dest.parent.mkdir(parents=True, exist_ok=True)
            opener = lzma.open if src.suffix == ".xz" else open
            with opener(src, "rb") as f, open(dest, "wb") as g:
                shutil.copyfileobj(f, g)
            docs = [r["text"] for r in read_jsonl(dest) if isinstance(r.get("text"), str)]
            n = (
                sum(len(ids) for ids in tok(docs, add_special_tokens=False)["input_ids"])
                if docs
                else 0
            )
            counts[lang] = {"documents": len(docs), "tokens": n}
            langs.append(lang)
        if args.lang not in langs:
            raise RuntimeError(f"no {args.lang} corpus in {args.corpus}")
        self.state["corpus_langs"] = langs
        return {"langs": counts, "tokens": sum(c["tokens"] for c in counts.values())}

    def distill(self, name: str, prompts: str, temps: list[float], extra: list[str]):
        """``synth.distill`` in this process with the loaded target; its stats' figures."""
        from synth.config import DistillConfig
        from synth.distill import run_distill

        args = self.args
        cfg = load_config(
            DistillConfig,
            REPO / "configs" / "synth" / "distill.yaml",
            [
                f"lang={args.lang}",
                f"target={args.target}",
                f"run={self.run}",
                f"prompts={prompts}",
                f"out_name={name}",
                f"temperatures={temps}",
                "seed=0",
                "capture_features=false",
                f"sampling.max_new_tokens={args.max_new_tokens}",
                f"engine.batch_size={args.batch}",
                "batches_per_commit=2",
                *extra,
            ],
        )
        stats = run_distill(cfg, target=self.state["target"])
        keep = (
            "prompts",
            "attempted",
            "accepted",
            "tokens",
            "seconds",
            "tokens_per_second",
            "complete",
        )
        return {k: stats.get(k) for k in keep}

    def heldout(self):
        """Step ``heldout``: the held-out prompts answered greedily."""
        return self.distill("heldout", "heldout", [0.0], [])

    def distill_pool(self):
        """Step ``distill``: the pool and corpus prompts at T = 0, 0.7, 1.0 within its share."""
        args = self.args
        return self.distill(
            "distill",
            "pool",
            [0.0, 0.7, 1.0],
            [
                f"corpus_prompts={args.corpus_prompts}",
                *([f"limit={args.limit}"] if args.limit else []),
                f"max_seconds={max(5.0, args.distill_share * self.left())}",
            ],
        )

    def vocab(self):
        """Step ``vocab``: ``python -m vocab`` on the corpus and the distilled answers."""
        args, run = self.args, self.run
        files = ",".join(f"files={run}/corpus/{lang}/data.jsonl" for lang in [args.lang])
        run_module(
            "vocab",
            "--config",
            str(REPO / "configs/vocab/default.yaml"),
            "--langs",
            args.lang,
            "--sources",
            f"{files},synth@0.5",
            "--target",
            args.target,
            "--run",
            str(run),
            f"mask_sizes=[{args.sizes}]",
            log=self.log,
        )
        return {"files": sorted(p.name for p in (run / "vocab").glob("*"))[:20]}

    def train(self, stage: str, seconds: float, data: list[str]):
        """One training stage in this process with the loaded target; its figures."""
        from train.config import TrainConfig
        from train.drafter import run as train_run

        args, run = self.args, self.run
        lr = [f"optim.lr={args.lr}"] if args.lr else []
        ov = [
            f"lang={args.lang}",
            f"target={args.target}",
            f"run={run}",
            f"stage={stage}",
            "features=online",
            "target_dtype=auto",
            f"data.max_length={args.seq_len}",
            "data.split_text=true",
            f"eagle.vocab_size={args.draft_vocab}",
            f"optim.batch_size={args.train_batch}",
            "report_to=none",
            f"max_seconds={max(10.0, seconds)}",
            "checkpoint_every=100000",
            "eval_every=100000",
            "log_every=20",
            f"pretrain.epochs={args.pretrain_epochs}",
            f"finetune.epochs={args.finetune_epochs}",
            *lr,
            *data,
        ]
        if stage == "finetune":
            ov.append(f"init_from={run}/train/{args.lang}/pretrain/final")
        cfg = load_config(TrainConfig, REPO / "configs" / "train" / "eagle3-cpu.yaml", ov)
        res = train_run(cfg, target=self.state["target"])[-1]
        return train_figures(res, run / "train" / args.lang / stage / "metrics.jsonl")

    def pretrain_files(self) -> str:
        """The pretrain's files: every corpus language's documents and the distilled answers."""
        return ",".join(
            [
                *(
                    f"{self.run}/corpus/{lang}/data.jsonl"
                    for lang in self.state.get("corpus_langs", [])
                ),
                f"{self.run}/synth/{self.args.lang}-distill/data.jsonl",
            ]
        )

    def pretrain(self, files: str):
        """Step ``pretrain``: 62 % of the time left before the bench's reserve."""
        seconds = 0.62 * (self.left() - self.args.bench_reserve)
        return self.train("pretrain", seconds, [f"data.pretrain=[{files}]"])

    def finetune(self):
        """Step ``finetune``: the distilled answers, scored on the held-out answers."""
        run, lang = self.run, self.args.lang
        seconds = self.left() - self.args.bench_reserve
        held = [
            f"data.finetune=[{run}/synth/{lang}-distill/data.jsonl]",
            f"data.eval_file=[{run}/synth/{lang}-heldout/data.jsonl]",
        ]
        return self.train("finetune", seconds, held)

    def export(self):
        """Step ``export``: the bundle, the engines' folders and ``drafter.tar.gz``'s parts."""
        args, run = self.args, self.run
        for command, folder in ((["export"], "bundle"), (["export", "engines"], "engines")):
            run_module(
                *command,
                "--langs",
                args.lang,
                "--run",
                str(run),
                "--target",
                args.target,
                "--out",
                str(run / "export" / folder),
                "--sizes",
                args.sizes,
                log=self.log,
            )
        return {"parts": pack_drafter(run, args.lang, self.out)}

    def release_target(self) -> None:
        """Drops the loaded target (the bench loads its own)."""
        if "target" in self.state:
            del self.state["target"]
            torch.cuda.empty_cache() if torch.cuda.is_available() else None

    def bench(self, dtype: str):
        """Step ``bench-<dtype>``: ``decoder.bench`` on the bundle; its report into ``out``."""
        args, run = self.args, self.run
        name = f"bench-{dtype}"
        run_module(
            "decoder.bench",
            "--bundle",
            str(run / "export" / "bundle"),
            "--target",
            args.target,
            "--questions",
            str(REPO / "synth/data/heldout.jsonl"),
            "--langs",
            args.lang,
            "--max-new-tokens",
            str(args.bench_tokens),
            "--repeats",
            "1",
            "--per-cell",
            str(args.bench_per_cell),
            "--methods",
            "ar,pld,eagle3,hybrid",
            "--out",
            str(run / name),
            *(["--dtype", "float32"] if dtype == "fp32" else []),
            log=self.log,
        )
        shutil.copy(run / name / "report.json", self.out / f"{name}.json")
        return {"report": f"{name}.json"}

    def benches(self) -> None:
        """The bench steps: the device's dtype first; fp32 (the identity check) if time is left."""
        for dtype in self.args.bench.split(","):
            if dtype and (dtype == "bf16" or self.left() > 60):
                self.fig.step(f"bench-{dtype}", lambda d=dtype: self.bench(d), "export")

    def finish(self) -> int:
        """The token totals into ``scale.json``, the summary line; 0 if every step but the bench's
        is ok."""
        fig = self.fig
        steps = fig.data["steps"]
        fig.data["tokens"] = {
            "corpus": (steps.get("corpus") or {}).get("tokens"),
            "distilled": (steps.get("distill") or {}).get("tokens"),
            "heldout": (steps.get("heldout") or {}).get("tokens"),
        }
        fig.write()
        ok = all(s.get("ok") for k, s in steps.items() if not k.startswith("bench"))
        failed = ", ".join(k for k, s in steps.items() if not s.get("ok"))
        print(
            f"[scale] done in {time.time() - fig.t0:.0f} s: "
            f"{'ok' if ok else 'FAILED steps: ' + failed}"
        )
        return 0 if ok else 1


def train_figures(res: dict, metrics_file: Path) -> dict:
    """A training stage's figures from its result and its ``metrics.jsonl``."""
    metrics = [json.loads(x) for x in metrics_file.read_text().splitlines()]
    start = next(m for m in metrics if m.get("event") == "start")
    steps = [m for m in metrics if "loss" in m]
    ev = res.get("eval") or {}
    return {
        "steps": res["steps"],
        "train_examples": start["train_examples"],
        "train_tokens": int(
            res["train_tokens_per_s"]
            * next(m["seconds"] for m in metrics if m.get("event") == "end")
        ),
        "train_tokens_per_s": res["train_tokens_per_s"],
        "final_loss": res["final_loss"],
        "stopped_by_time": any(m.get("event") == "max_seconds" for m in metrics),
        "heldout": {k: v for k, v in ev.items() if not isinstance(v, (list, dict)) or k == "alpha"},
        "first_loss": steps[0]["loss"] if steps else None,
    }


def main(argv: list[str] | None = None) -> int:
    """The steps in order, each recorded in ``<out>/scale.json``; 0 if all but the bench's are
    ok."""
    args = parse_args(argv)
    # the corpus is tokenized twice (its count here, the pretrain's pieces): on the device's 16
    # cores in parallel
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    s = ScaleRun(args)
    step = s.fig.step
    step("load", s.load)
    step("corpus", s.corpus, "load")
    step("heldout", s.heldout, "load")
    step("distill", s.distill_pool, "corpus")
    step("vocab", s.vocab, "distill")
    pretrain_files = s.pretrain_files()  # the corpus languages the corpus step found
    step("pretrain", lambda: s.pretrain(pretrain_files), "vocab")
    step("finetune", s.finetune, "pretrain", "heldout")
    step("export", s.export, "finetune")
    s.release_target()
    s.benches()
    return s.finish()


def pack_drafter(run: Path, lang: str, out: Path) -> list[str]:
    """``drafter.tar.gz`` in parts of ≤ 15 MiB under ``out``: the finetuned drafter (weights cast to
    bf16: half the size, the dtype engines serve), the vocabulary stage's files, the held-out
    answers and the training metrics and stats — what ``gpu-scale.sh unpack`` turns back into a run
    the CPU exports and measures."""
    from safetensors.torch import load_file, save_file

    tmp = run / "pack"
    shutil.rmtree(tmp, ignore_errors=True)
    final = run / "train" / lang / "final"
    dest = tmp / "train" / lang / "final"
    shutil.copytree(final, dest)
    w = load_file(str(final / "model.safetensors"))
    save_file(
        {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in w.items()},
        str(dest / "model.safetensors"),
        metadata={"format": "pt", "transport": "bf16"},
    )
    keep = [
        run / "vocab",
        run / "synth" / f"{lang}-heldout" / "data.jsonl",
        run / "synth" / f"{lang}-distill" / "stats.json",
        *(run / "train" / lang / s / "metrics.jsonl" for s in ("pretrain", "finetune")),
    ]
    for p in keep:
        if p.exists():
            (tmp / p.relative_to(run)).parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if p.is_dir() else shutil.copy)(p, tmp / p.relative_to(run))
    blob = run / "drafter.tar.gz"
    with tarfile.open(blob, "w:gz") as tar:
        tar.add(tmp, arcname="run")
    data, names = blob.read_bytes(), []
    for i in range(0, len(data), PART):
        names.append(f"drafter.tar.gz.{i // PART:02d}")
        (out / names[-1]).write_bytes(data[i : i + PART])
    return names


if __name__ == "__main__":
    raise SystemExit(main())
