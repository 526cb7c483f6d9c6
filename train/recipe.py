"""One stage (pretrain or finetune) of one language's drafter: :class:`DrafterRecipe` builds its
components in order (``setup``), runs the training loop (``train``), scores held-out answers
(``evaluate``) and saves drafter folders and checkpoints (``train.checkpoint``).
``train/drafter.py`` is the entry point that runs the stages.

The loop reads top to bottom: lr → forward/backward in the accumulation context → clip → step → log
→ evaluate/save.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, parse_flag_from_env, set_seed
from torch.optim.lr_scheduler import LambdaLR
from tqdm.auto import tqdm
from transformers.integrations.deepspeed import unset_hf_deepspeed_config

from polyspec.device import resolve_dtype
from polyspec.drafter_kind import DrafterKind
from polyspec.drafter_models import (
    Eagle3Drafter,
    EagleDrafter,
    build_small_lm,
    copy_target_layer,
    eagle_layer_config,
    load_drafter,
    save_drafter,
)
from polyspec.errors import PolyspecError
from polyspec.faults import maybe_kill
from polyspec.features import FeatureReader
from polyspec.generation import cut_at_stop
from polyspec.io import atomic_write_json, sha256_file
from polyspec.targets import check_pin, greedy_generate, load_target
from train import checkpoint
from train.config import TrainConfig
from train.data import all_captured, build_dataset, collate, split, step_indices
from train.features import FeatureStore
from train.objectives import (
    TargetProbs,
    eagle_loss,
    in_vocab_rows,
    loss_rows,
    small_lm_loss,
    target_features,
)
from train.score import score_eagle, small_lm_chain, summarize
from vocab.files import interleave_ranked, load_ranked

# steps a stage with ``max_seconds`` runs before it measures its rate and fits the schedule to the
# budget
REPLAN_AFTER = 10


def cosine_with_warmup(planned: dict):
    """The learning-rate factor of transformers' ``get_cosine_schedule_with_warmup`` (linear
    warm-up, then half a cosine to 0), over ``planned["total"]`` steps read at every step: a time
    budget may shorten the stage and the schedule still ends at 0 (a plain function, so LambdaLR's
    state dict holds no closure state)."""

    def factor(step: int) -> float:
        warm, total = planned["warmup"], planned["total"]
        if step < warm:
            return step / max(1, warm)
        progress = (step - warm) / max(1, total - warm)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    return factor


class DrafterRecipe:
    """setup → train → cleanup, for one stage of one language."""

    def __init__(self, cfg: TrainConfig, stage: str):
        self.cfg, self.stage = cfg, stage
        self.out = Path(cfg.run) / cfg.train_dir / cfg.lang / stage

    # ------------------------------------------------------------------------------------- setup
    def setup(self, target=None, timing_only: bool = False) -> None:
        """``timing_only`` (python -m train.bench): no checkpoint is resumed and no held-out answers
        are made, so nothing is written into the run (with ``features: offline``, only the feature
        store training builds too)."""
        cfg = self.cfg
        # 1. accelerator (DDP / DeepSpeed / mixed precision come from `accelerate launch`)
        mp = resolve_mixed_precision(cfg.mixed_precision)
        log_with = None if cfg.report_to == "none" else cfg.report_to
        self.acc = self._make_accelerator(mp, log_with)
        self._batch_shape_from_config()
        set_seed(cfg.seed, device_specific=False)
        # 2. frozen target, its embedding and head (never trained, never saved with the drafter); it
        #    and the drafter are built whole, also under ZeRO-3 (prepare shards the drafter)
        whole = self._whole_models()
        self._load_frozen_target(target)
        # 3. data: pretrain = general text, every token; finetune = synth data, response tokens only
        captured = cfg.features == "captured"
        ds = self._build_train_data(captured)
        held = self._split_held_out(ds, captured)
        self._keep_data_facts(ds, captured)
        # 4. the language's reduced vocabulary (top-s ranked ids) and the head rows it keeps
        self._draft_vocabulary()
        self._offline_features(ds.files)
        # 5. drafter, optimizer, cosine schedule with warmup (Yi et al. 2024, "Towards Fast
        #    Multilingual LLM Inference", Appendix F)
        self.model = self._build_drafter()
        self._check_shard_layers(held)
        # EAGLE-3: aux
        self.eval_seqs = (
            [] if timing_only else self._eval_sequences(held[: cfg.data.eval_max_examples])
        )
        whole.close()
        self._optimizer_and_schedule()
        # 6. counters, resume, trackers (feature noise draws from the global torch RNG, which
        #    save_state keeps per process)
        self.step, self.best = 0, -1.0
        # tokens read and seconds trained by earlier launches of this stage (None: resumed from a
        # checkpoint that predates the count)
        self.before: dict | None = {"tokens": 0, "seconds": 0.0}
        if not timing_only:
            self._resume()
        if log_with:
            self._init_trackers()

    def _make_accelerator(self, mp: str, log_with: str | None) -> Accelerator:
        """The stage's Accelerator, its process-group backend named for a CPU distributed launch."""
        # A distributed launch without CUDA names the process-group backend: left unset,
        # DeepSpeed's CPU accelerator starts the group itself and accelerate counts one process
        # while DeepSpeed sees all of them (train_batch_size mismatch); a plain process must not
        # name one (accelerate would take it for a distributed run)
        # by torchrun (accelerate launch, several processes)
        launched = int(os.environ.get("LOCAL_RANK", -1)) != -1
        handlers = (
            [InitProcessGroupKwargs(backend="gloo")]
            if launched and not torch.cuda.is_available()
            else []
        )
        return Accelerator(
            mixed_precision=mp,
            gradient_accumulation_steps=self.cfg.optim.grad_accum,
            log_with=log_with,
            project_dir=str(self.out),
            kwargs_handlers=handlers,
        )

    def _load_frozen_target(self, target) -> None:
        """The frozen target (the one given, or loaded), its input embedding and logit softcap."""
        cfg = self.cfg
        self.target = target or load_target(
            cfg.target, device=self.acc.device, dtype=cfg.target_dtype
        )
        self.embed = self.target.model.get_input_embeddings()
        self.softcap = getattr(self.target.model.config, "final_logit_softcapping", None)

    def _build_train_data(self, captured: bool):
        """The stage's dataset: its data files' examples (response tokens only when finetuning)."""
        cfg = self.cfg
        patterns = cfg.data.pretrain if self.stage == "pretrain" else cfg.data.finetune
        return build_dataset(
            patterns,
            self.target,
            cfg.run,
            cfg.lang,
            cfg.data.max_length,
            response_only=self.stage == "finetune",
            captured=captured,
            split_text=cfg.data.split_text,
        )

    def _split_held_out(self, ds, captured: bool) -> list:
        """``self.train_set`` and the held-out examples (returned): a finetune's ``eval_file``, or
        a split of the dataset."""
        cfg = self.cfg
        # an independent test set (held-out prompts)
        if self.stage == "finetune" and cfg.data.eval_file:
            self.train_set = ds.examples
            held = build_dataset(
                cfg.data.eval_file,
                self.target,
                cfg.run,
                cfg.lang,
                4 * cfg.data.max_length,
                True,
                captured=captured and all_captured(cfg.data.eval_file, cfg.run, cfg.lang),
            ).examples
        else:
            self.train_set, held = split(ds, cfg.data.eval_fraction, cfg.seed)
        return held

    def _keep_data_facts(self, ds, captured: bool) -> None:
        """The data files, skipped lines, lengths (``group_by_length``) and the feature reader."""
        self.data_files, self.skipped = ds.files, ds.skipped
        self.lengths = (
            [len(e.input_ids) for e in self.train_set] if self.cfg.data.group_by_length else None
        )
        self.reader = (
            FeatureReader(self.target.spec.name, self.target.tokenizer_sha256) if captured else None
        )

    def _draft_vocabulary(self) -> None:
        """The draft ids and their target head rows, the kept target distributions, the mask of
        draft ids (``eagle.mask_out_of_vocab``)."""
        cfg = self.cfg
        self.ids_s, self.vocab_meta = self._reduced_vocab()
        self.head_w = self.target.model.get_output_embeddings().weight[self.ids_s].detach()
        gb = cfg.eagle.target_probs_gb
        gb = (4.0 if self.acc.device.type == "cpu" else 0.0) if gb is None else gb
        self.probs = TargetProbs(self.head_w, self.softcap, gb * 2**30) if gb > 0 else None
        # eagle.mask_out_of_vocab: which of the target's ids the draft vocabulary holds
        self.in_draft = None
        if cfg.eagle.mask_out_of_vocab and cfg.drafter_type == "eagle":
            full = self.target.model.get_output_embeddings().weight
            self.in_draft = torch.zeros(full.shape[0], dtype=torch.bool, device=full.device)
            self.in_draft[self.ids_s] = True

    def _offline_features(self, files: list[str]) -> None:
        """``features: offline`` (EAGLE-1 only): the target's features of the training examples,
        stored once under the run."""
        cfg = self.cfg
        self.features = None
        if cfg.features == "offline" and cfg.drafter_kind is DrafterKind.EAGLE3:
            raise PolyspecError(
                "features: offline stores the last layer only; EAGLE-3 drafters train with "
                "features: online"
            )
        if cfg.features == "offline" and cfg.drafter_type == "eagle":
            # keyed by what determines them, so languages sharing a pretrain corpus share the
            # features
            key = hashlib.sha256(
                json.dumps(
                    [
                        self.target.tokenizer_sha256,
                        self.target.spec.name,
                        cfg.data.max_length,
                        cfg.seed,
                        cfg.data.eval_fraction,
                        _fingerprint(files),
                    ]
                ).encode()
            ).hexdigest()[:16]
            root = Path(cfg.run) / "train" / "features" / key
            self.features = FeatureStore(
                root, self.train_set, self.target, is_main=self.acc.is_main_process
            )
            self.acc.wait_for_everyone()

    def _check_shard_layers(self, held: list) -> None:
        """Captured features' shards must hold the target layers this EAGLE-3 drafter reads."""
        if self.reader is not None and self.aux_layers:
            for path in sorted({ex.feat[0] for ex in self.train_set + held if ex.feat}):
                got = self.reader.aux_layers(path)
                if got != list(self.aux_layers):
                    raise PolyspecError(
                        f"{path} holds target layers {got}, the EAGLE-3 drafter reads "
                        f"{self.aux_layers}: "
                        "distill with feature_layers=eagle3 (or train with features=online)"
                    )

    def _optimizer_and_schedule(self) -> None:
        """AdamW on the drafter's trainable parameters, the warmup-cosine schedule, ``prepare``."""
        cfg = self.cfg
        steps = self.steps = self._steps()
        lr = self.stage_cfg.lr or cfg.optim.lr
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(
            params, lr=lr, betas=tuple(cfg.optim.betas), weight_decay=cfg.optim.weight_decay
        )
        # stepped once per optimizer step by us (accelerate would step it once per process)
        self.planned = {"warmup": math.ceil(cfg.optim.warmup_ratio * steps), "total": steps}
        self.sched = LambdaLR(self.opt, cosine_with_warmup(self.planned))
        self.model, self.opt = self.acc.prepare(self.model, self.opt)

    def _batch_shape_from_config(self) -> None:
        """The train config owns the batch shape (``batches`` feeds optim.batch_size × grad_accum
        per process): DeepSpeed's ``auto`` values are filled from it — our stream is no DataLoader
        that ``prepare`` could read them from — and an accelerate config that sets them otherwise is
        refused."""
        o = self.cfg.optim
        # ACCELERATE_GRADIENT_ACCUMULATION_STEPS
        if self.acc.gradient_accumulation_steps != o.grad_accum:
            raise PolyspecError(
                f"accelerate is set to {self.acc.gradient_accumulation_steps} gradient "
                "accumulation steps, "
                f"the train config to {o.grad_accum}: remove it from the accelerate config "
                "(optim.grad_accum)"
            )
        plugin = self.acc.state.deepspeed_plugin
        if plugin is None:
            return
        ds = plugin.deepspeed_config
        for key, value, field in (
            ("train_micro_batch_size_per_gpu", o.batch_size, "optim.batch_size"),
            ("gradient_accumulation_steps", o.grad_accum, "optim.grad_accum"),
            ("gradient_clipping", o.max_grad_norm, "optim.max_grad_norm"),
        ):
            if ds.get(key, "auto") == "auto":
                ds[key] = value
            elif ds[key] != value:
                raise PolyspecError(
                    f"the DeepSpeed config sets {key}={ds[key]}, the train config {field}={value}: "
                    f"remove it from the DeepSpeed/accelerate config"
                )

    def _whole_models(self) -> contextlib.ExitStack:
        """Under ZeRO-3 accelerate shows transformers its DeepSpeed config even with
        ``zero3_init_flag: false``, and transformers then builds every model sharded
        (``zero.Init``): the frozen target would come out empty. Hidden until ``close()``, which
        shows it again."""
        stack = contextlib.ExitStack()
        plugin = self.acc.state.deepspeed_plugin
        if plugin is not None and plugin.zero_stage == 3:
            unset_hf_deepspeed_config()
            stack.callback(plugin.set_deepspeed_weakref)
        return stack

    def _steps(self) -> int:
        """``epochs`` (when set) decides the optimizer steps: passes over the training examples."""
        sc, o = self.stage_cfg, self.cfg.optim
        if sc.epochs is None:
            return sc.steps
        return max(
            1,
            math.ceil(
                sc.epochs
                * len(self.train_set)
                / (o.batch_size * o.grad_accum * self.acc.num_processes)
            ),
        )

    @property
    def stage_cfg(self):
        return self.cfg.pretrain if self.stage == "pretrain" else self.cfg.finetune

    def _reduced_vocab(self) -> tuple[torch.Tensor, dict]:
        cfg, V = self.cfg, self.target.vocab_size
        s = cfg.eagle.vocab_size
        if s is None:  # full vocabulary
            return torch.arange(V, device=self.acc.device), {"size": V, "file": None}
        if s > V:
            raise PolyspecError(f"eagle.vocab_size {s} is larger than the target vocabulary ({V})")
        # one multilingual draft vocabulary (the pretrain an engine serves for all)
        if cfg.eagle.vocab_langs:
            paths = [
                cfg.eagle.vocab_file.format(run=cfg.run, lang=lang)
                for lang in cfg.eagle.vocab_langs
            ]
            lists = [
                load_ranked(p, tokenizer_sha256=self.target.tokenizer_sha256).top(s) for p in paths
            ]
            ids = torch.as_tensor(interleave_ranked(lists, s), device=self.acc.device)
            return ids, {
                "size": s,
                "file": paths[0],
                "files": paths,
                "langs": list(cfg.eagle.vocab_langs),
                "sha256": hashlib.sha256(
                    "".join(sha256_file(p) for p in paths).encode()
                ).hexdigest(),
            }
        path = cfg.eagle.vocab_file.format(run=cfg.run, lang=cfg.lang)
        ranked = load_ranked(path, tokenizer_sha256=self.target.tokenizer_sha256)
        ids = torch.as_tensor(ranked.top(s).astype(np.int64), device=self.acc.device)
        return ids, {"size": s, "file": path, "sha256": sha256_file(path)}

    def _build_drafter(self):
        cfg = self.cfg
        init = cfg.init_from or (
            str(self.out.parent / "pretrain" / "final") if self.stage == "finetune" else None
        )
        if init and Path(init).is_dir():
            model, meta = load_drafter(init)
            if meta.get("drafter_type") != cfg.drafter_type:
                raise PolyspecError(
                    f"{init} holds a {meta.get('drafter_type')} drafter, not {cfg.drafter_type}"
                )
            if meta.get("target", {}).get("tokenizer_sha256") != self.target.tokenizer_sha256:
                raise PolyspecError(f"{init} was trained for another target tokenizer")
            check_pin(meta.get("target", {}), self.target.pin(), f"drafter {init}")
            self.init_from = init
        elif cfg.init_from:
            raise PolyspecError(f"init_from {cfg.init_from} is not a drafter folder")
        else:
            self.init_from = None
            if cfg.drafter_kind is DrafterKind.EAGLE3:
                model = Eagle3Drafter.for_target(
                    self.target, self.ids_s.cpu(), num_layers=cfg.eagle.num_layers
                )
            elif cfg.drafter_type == "eagle":
                model = EagleDrafter(
                    eagle_layer_config(self.target.model.config, cfg.eagle.num_layers),
                    lookup_hint=cfg.eagle.lookup_hint,
                )
                if cfg.eagle.init_layer == "target":
                    idx = copy_target_layer(model, self.target.model)
                    if self.acc.is_main_process:
                        print(
                            "[train] eagle: decoder layer and final norm start as the target's "
                            f"layer {idx}",
                            flush=True,
                        )
            else:
                sl = cfg.small_lm
                model = build_small_lm(
                    self.target, sl.hidden_size, sl.num_layers, sl.num_heads, sl.intermediate_size
                )
        if cfg.drafter_type == "eagle" and model.hidden_size != self.target.hidden_size:
            raise PolyspecError(
                f"drafter hidden size {model.hidden_size} ≠ target hidden size "
                f"{self.target.hidden_size}"
            )
        if cfg.drafter_type == "eagle" and DrafterKind.of(model) is not cfg.drafter_kind:
            raise PolyspecError(
                f"{self.init_from} holds an {model.arch_name} drafter, the config asks for "
                f"{cfg.eagle.arch}"
            )
        if DrafterKind.of(model) is DrafterKind.EAGLE3 and model.num_layers != cfg.eagle.num_layers:
            raise PolyspecError(
                f"{self.init_from}: eagle.num_layers is {cfg.eagle.num_layers} in the config, "
                f"{model.num_layers} in the drafter it starts from"
            )
        if (
            cfg.drafter_type == "eagle"
            and getattr(model, "lookup_hint", False) != cfg.eagle.lookup_hint
        ):
            raise PolyspecError(
                f"{self.init_from}: eagle.lookup_hint is {cfg.eagle.lookup_hint} in the config, "
                f"{not cfg.eagle.lookup_hint} in the drafter it starts from"
            )
        if DrafterKind.of(model) is DrafterKind.EAGLE3 and not torch.equal(
            model.draft_ids.cpu(), self.ids_s.cpu()
        ):
            # a multilingual pretrain's head → this language's draft vocabulary: the rows of ids
            # both hold are kept, the others start as the target's rows (as a new drafter's head
            # does)
            kept = model.rehead(self.ids_s.cpu(), self.target.model.get_output_embeddings().weight)
            if self.acc.is_main_process:
                print(
                    f"[train] eagle3: draft vocabulary of {self.init_from} → this stage's "
                    f"top-{len(self.ids_s)} ids "
                    f"({kept} head rows kept, {len(self.ids_s) - kept} from the target's head)",
                    flush=True,
                )
        self.aux_layers = getattr(model, "aux_layers", None)
        return model.to(self.acc.device).train()

    @torch.no_grad()
    def _eval_sequences(self, held) -> list[dict]:
        """Held-out prompts + the target's own greedy answers ending where the decoder ends (EOS,
        stop strings, max tokens). Captured held-out records (``synth distill --prompts heldout
        capture_features=true``) bring their ids and features; otherwise the answers are generated
        here once and cached on disk."""
        if held and all(ex.feat for ex in held):
            out = []
            for ex in held:
                path, rid = ex.feat
                seq = torch.tensor([ex.input_ids], device=self.acc.device)
                d = {
                    "seq": seq,
                    "start": ex.loss_mask.index(1),
                    "f": self.reader.get(path, rid, "f")[None].float(),
                }
                if self.aux_layers:
                    d["aux"] = self.reader.get(path, rid, "aux")[None].float()
                out.append(d)
            return out
        cache = self.out / "eval_sequences.json"
        key = hashlib.sha256(
            json.dumps(["stop-v2", [ex.input_ids for ex in held]]).encode()
        ).hexdigest()[:16]
        cached = json.loads(cache.read_text()) if cache.is_file() else {}
        # made from these held-out examples
        if isinstance(cached, dict) and cached.get("key") == key:
            data = cached["sequences"]
        else:
            data = []
            stop = self.target.spec.prompt_format.stop
            # finetune: the prompt is the instruction; pretrain: the first half of the text
            for ex in held:
                start = (
                    ex.loss_mask.index(1)
                    if self.stage == "finetune"
                    else max(1, len(ex.input_ids) // 2)
                )
                prompt = ex.input_ids[:start]
                new = greedy_generate(
                    self.target, prompt, max(8, min(96, self.cfg.data.max_length - start))
                )
                if self.stage == "finetune":
                    new = cut_at_stop(self.target.tokenizer, new, stop)
                data.append({"ids": prompt + new, "start": start})
            if self.acc.is_main_process:
                atomic_write_json(cache, {"key": key, "sequences": data})
        return [
            {"seq": torch.tensor([d["ids"]], device=self.acc.device), "start": d["start"]}
            for d in data
        ]

    def _init_trackers(self) -> None:
        run_name = f"{self.cfg.lang}-{self.stage}"
        kw = {}
        if self.cfg.report_to == "wandb":
            os.environ.setdefault("WANDB_MODE", "offline")  # never needs a network or an account
            kw = {"wandb": {"dir": str(self.out), "name": run_name}}
        self.acc.init_trackers(
            "polyspec", config=json.loads(self.cfg.model_dump_json()), init_kwargs=kw
        )

    # ---------------------------------------------------------------------------------- training
    def batches(self):
        """Deterministic stream of batches across epochs; ``self.step`` tells where to resume.

        Each process takes its slice of every global batch (DDP), so the global batch is the same
        whatever the number of processes."""
        per_step = self.cfg.optim.batch_size * self.cfg.optim.grad_accum * self.acc.num_processes
        micro = self.cfg.optim.batch_size
        for idx in step_indices(
            len(self.train_set), per_step, self.cfg.seed, self.step, self.lengths, micro
        ):
            mine = idx[self.acc.process_index * micro * self.cfg.optim.grad_accum :][
                : micro * self.cfg.optim.grad_accum
            ]
            for a in range(self.cfg.optim.grad_accum):
                part = mine[a * micro : (a + 1) * micro]
                yield collate(
                    [self.train_set[i] for i in part],
                    self.target.tokenizer.pad_token_id,
                    part,
                    self.cfg.data.pad_to_multiple,
                )

    def loss(self, batch) -> tuple[torch.Tensor, dict]:
        batch = {k: v.to(self.acc.device) for k, v in batch.items()}
        if self.cfg.drafter_type == "small-lm":
            return small_lm_loss(self.model, batch)
        aux = None
        if self.reader is not None:  # captured while the target generated: no target pass at all
            idx, T = batch["index"].tolist(), batch["input_ids"].shape[1]
            f = self._captured(idx, T, "f")
            aux = self._captured(idx, T, "aux") if self.aux_layers else None
        elif self.features is not None:  # offline: precomputed once, read back
            f = self.features.get(
                batch["index"].tolist(), batch["input_ids"].shape[1], self.acc.device
            )
        elif self.aux_layers:  # EAGLE-3: three target layers as input, the last one for the targets
            f, aux = target_features(
                self.target.model, batch["input_ids"], batch["attention_mask"], self.aux_layers
            )
        else:  # online: the frozen target inside the step
            f = target_features(self.target.model, batch["input_ids"], batch["attention_mask"])
        # the head GEMMs too, not only the drafter's forward that prepare() wraps
        with self.acc.autocast():
            # the target's distribution at the loss rows, kept after an example's first epoch (None:
            # computed there)
            p0 = self.probs(batch["index"].tolist(), f, batch["loss_mask"]) if self.probs else None
            keep0 = None
            if self.in_draft is not None:  # the step-0 loss rows whose target argmax is a draft id
                full = self.target.model.get_output_embeddings().weight.detach()
                keep0 = in_vocab_rows(
                    f[:, 1:][loss_rows(batch["loss_mask"]).bool()], full, self.in_draft
                )
            loss, metrics = eagle_loss(
                self.model,
                self.embed,
                self.head_w,
                batch,
                f,
                self.cfg.eagle,
                self.softcap,
                aux=aux,
                p0=p0,
                keep0=keep0,
            )
            if keep0 is not None:
                metrics["in_vocab"] = float(keep0.float().mean()) if keep0.numel() else 1.0
            return loss, metrics

    def _captured(self, indices: list[int], T: int, name: str, examples=None) -> torch.Tensor:
        """[B, T, ·] float32 features of examples (right-padded with zeros), from the captured
        shards."""
        rows = []
        for i in indices:
            path, rid = (examples or self.train_set)[i].feat
            x = self.reader.get(path, rid, name)[:T].float()
            rows.append(torch.nn.functional.pad(x, (0, 0, 0, T - x.shape[0])))
        return torch.stack(rows).to(self.acc.device)

    def train(self) -> dict:
        cfg, steps = self.cfg, self.steps
        self._log_line(
            {
                "event": "start",
                "stage": self.stage,
                "step": self.step,
                "train_examples": len(self.train_set),
                "skipped_lines": self.skipped,
                "init_from": self.init_from,
            }
        )
        bar = tqdm(
            total=steps,
            initial=self.step,
            desc=f"{cfg.lang}/{self.stage}",
            disable=not self.acc.is_main_process,
            dynamic_ncols=True,
        )
        stream, t0, tokens, last_loss = self.batches(), time.time(), 0, None
        first = self.step
        while self.step < steps:
            loss, metrics, n = self.train_step(stream)
            tokens += n
            self.step += 1
            loss_val = last_loss = float(self.acc.reduce(loss.detach(), reduction="mean"))
            record = {
                "step": self.step,
                "loss": round(loss_val, 6),
                "lr": self.sched.get_last_lr()[0],
                "tokens_per_s": round(tokens / max(time.time() - t0, 1e-9), 1),
                **metrics,
            }
            if self.step % cfg.log_every == 0 or self.step == steps:
                self._log_line(record)
                self.acc.log(
                    {
                        f"{self.stage}/{k}": v
                        for k, v in record.items()
                        if isinstance(v, (int, float))
                    },
                    step=self.step,
                )
            bar.set_postfix(
                loss=f"{loss_val:.4f}", tok_s=record["tokens_per_s"], best=f"{self.best:.3f}"
            )
            bar.update(1)
            if self.step % cfg.eval_every == 0 or self.step == steps:
                ev = self.evaluate()
                self._log_line({"step": self.step, "eval": ev})
                self.acc.log(
                    {f"{self.stage}/tau": ev["tau"], f"{self.stage}/accept_len": ev["accept_len"]},
                    step=self.step,
                )
                # no held-out sequence scored: no best/
                if ev["tau"] > self.best and ev["sequences"] > 0:
                    self.best = ev["tau"]
                    self._save_weights(self.out / "best", {"eval": ev, "step": self.step})
            if (
                cfg.max_seconds is not None
                and self.step - first == REPLAN_AFTER
                and self.step < steps
            ):
                # the steps the budget affords at the rate so far: the schedule anneals within the
                # budget
                elapsed = time.time() - t0
                fit = self.step + int((cfg.max_seconds - elapsed) / (elapsed / REPLAN_AFTER))
                if fit < steps:
                    self._log_line(
                        {
                            "event": "replanned",
                            "step": self.step,
                            "steps": steps,
                            "to": max(fit, self.step),
                        }
                    )
                    steps = self.planned["total"] = max(fit, self.step)
                    # the warm-up keeps its share of the stage
                    self.planned["warmup"] = min(
                        self.planned["warmup"],
                        max(self.step, math.ceil(cfg.optim.warmup_ratio * steps)),
                    )
                    bar.total = steps
            out_of_time = cfg.max_seconds is not None and time.time() - t0 > cfg.max_seconds
            if self.step % cfg.checkpoint_every == 0 or self.step == steps or out_of_time:
                # the last one too: a rerun of a finished stage trains nothing
                self.save_checkpoint(self._progress(tokens, time.time() - t0))
            if out_of_time:
                self._log_line({"event": "max_seconds", "step": self.step, "steps": steps})
                break
        bar.close()
        final_eval = self.evaluate()
        self._save_weights(self.out / "final", {"eval": final_eval, "step": self.step})
        elapsed = time.time() - t0  # one reading: the launch's and the stage's seconds agree
        tok_s = round(tokens / max(elapsed, 1e-9), 1)
        whole = self._progress(tokens, elapsed)
        self._log_line(
            {
                "event": "end",
                "stage": self.stage,
                "train_tokens_per_s": tok_s,  # this launch's
                "seconds": round(elapsed, 1),
                # every launch's, a resumed stage's whole run
                "stage_tokens": whole and whole["tokens"],
                "stage_seconds": whole and whole["seconds"],
            }
        )
        return {
            "stage": self.stage,
            "steps": self.step,
            "final_loss": last_loss,
            "eval": final_eval,
            "best_tau": self.best,
            "train_tokens_per_s": tok_s,
        }

    def train_step(self, stream) -> tuple[torch.Tensor, dict, int]:
        """One optimizer step: grad_accum micro-batches forward/backward in the accumulation context
        → clip → step → schedule. → (last micro-batch loss, its metrics, tokens of every process's
        batches)."""
        tokens = 0
        for _ in range(self.cfg.optim.grad_accum):
            batch = next(stream)
            tokens += int(batch["attention_mask"].sum()) * self.acc.num_processes
            with self.acc.accumulate(self.model):  # no gradient sync until the last micro-batch
                loss, metrics = self.loss(batch)
                self.acc.backward(loss)
                if self.acc.sync_gradients:
                    self.acc.clip_grad_norm_(self.model.parameters(), self.cfg.optim.max_grad_norm)
                    self.opt.step()
                    self.sched.step()
                    self.opt.zero_grad(set_to_none=True)
        return loss, metrics, tokens

    @torch.no_grad()
    def evaluate(self) -> dict:
        """The decoder's greedy chain procedure (γ = eval_depth) replayed on the held-out answers
        (train/score.py): τ = answer tokens per target forward, accepted drafts per step,
        α_1..α_γ."""
        model = self.acc.unwrap_model(self.model)
        model.eval()
        k = self.cfg.eval_depth
        if self.cfg.drafter_type == "eagle":
            seqs = []
            for d in self.eval_seqs:
                if d.get("f") is None:  # not captured: the target's features of the held-out answer
                    got = target_features(
                        self.target.model, d["seq"], torch.ones_like(d["seq"]), self.aux_layers
                    )
                    d = {**d, "f": got[0], "aux": got[1]} if self.aux_layers else {**d, "f": got}
                seqs.append(d)
            result = score_eagle(model, self.embed, self.head_w, self.ids_s, seqs, k, self.softcap)
        else:
            ids_s = self.ids_s if len(self.ids_s) < self.target.vocab_size else None
            result = summarize(
                [
                    (
                        d["seq"].shape[1] - d["start"],
                        small_lm_chain(model, ids_s, d["seq"], d["start"], k),
                    )
                    for d in self.eval_seqs
                ],
                k,
            )
        model.train()
        return result

    # ------------------------------------------------------------------------------- checkpoints
    def _meta(self) -> dict:
        return {
            "target": self.target.pin(),
            "lang": self.cfg.lang,
            "stage": self.stage,
            "vocab": self.vocab_meta,
            "train_config": json.loads(self.cfg.model_dump_json()),
            "data_files": self.data_files,
        }

    def _save_weights(self, path: Path, extra: dict) -> None:
        """A drafter folder (``load_drafter``). Every process takes part: under ZeRO-3 accelerate
        gathers the sharded parameters (``stage3_gather_16bit_weights_on_model_save``); the main
        process writes them."""
        state = self.acc.get_state_dict(self.model)
        if self.acc.is_main_process:
            save_drafter(
                path, self.acc.unwrap_model(self.model), {**self._meta(), **extra}, state=state
            )
        self.acc.wait_for_everyone()

    def _progress(self, tokens: int, seconds: float) -> dict | None:
        """The stage's tokens read and seconds trained so far: this launch's (``tokens`` in
        ``seconds``) and the earlier ones'; None where an earlier launch's count is unknown."""
        if self.before is None:
            return None
        return {
            "tokens": self.before["tokens"] + tokens,
            "seconds": round(self.before["seconds"] + seconds, 1),
        }

    def save_checkpoint(self, progress: dict | None) -> None:
        """The stage's resumable state (``train.checkpoint``): model, optimizer, RNG, data position,
        scheduler, progress."""
        checkpoint.save_checkpoint(
            self.acc,
            self.out,
            self.step,
            self.best,
            self.sched,
            self._config_hash(),
            self.cfg.keep_checkpoints,
            progress,
        )

    def _resume(self) -> None:
        got = checkpoint.resume(self.acc, self.out, self.sched, self._config_hash())
        if got is None:
            return
        ck, self.step, self.best, self.before = got
        if self.acc.is_main_process:
            print(f"[train] resumed {self.cfg.lang}/{self.stage} from {ck.name}", flush=True)

    def _config_hash(self) -> str:
        return checkpoint.config_hash(
            self.cfg,
            self.stage,
            self.target.tokenizer_sha256,
            self.vocab_meta,
            self.data_files,
            self.init_from,
            self.acc,
        )

    def _log_line(self, rec: dict) -> None:
        if self.acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, default=float) + "\n")
            # a step's training record: the crash tests' kill point (polyspec.faults)
            if "loss" in rec:
                maybe_kill("step", rec["step"])

    def cleanup(self) -> None:
        """Ends the stage. The prepared drafter and optimizer go first, while the process group
        still lives: accelerate's ``free_memory`` calls DeepSpeed's ``engine.destroy()`` (ZeRO-3's
        parameter and gradient hooks, its gathered-parameter buffers), so no gloo work handle
        outlives the group (``end_training`` destroys it) into interpreter shutdown, where a rank
        can abort (evidence: docs/experiments.md#a-rank-aborting-at-shutdown)."""
        self.model = self.opt = self.sched = None
        self.acc.free_memory()
        gc.collect()
        self.acc.end_training()


def resolve_mixed_precision(mp: str) -> str:
    """``auto`` → bf16 autocast where bf16 is native (CUDA; AVX512-BF16 / AMX CPUs, where the step
    is ~2x the fp32 one), as ``dtype: auto`` decides for the target (``POLYSPEC_DTYPE`` included);
    DeepSpeed on CPU keeps fp32."""
    if mp != "auto":
        return mp
    # accelerate launch --cpu (flags read as accelerate reads them)
    use_cpu = parse_flag_from_env("ACCELERATE_USE_CPU")
    dev = torch.device("cuda") if torch.cuda.is_available() and not use_cpu else torch.device("cpu")
    cpu_ds = dev.type == "cpu" and parse_flag_from_env("ACCELERATE_USE_DEEPSPEED")
    return "bf16" if resolve_dtype("auto", dev) == torch.bfloat16 and not cpu_ds else "no"


def _fingerprint(paths: list[str]) -> list:
    return [(p, Path(p).stat().st_size, sha256_file(p)) for p in paths]
