"""Options of the train stage (``configs/train/<recipe>.yaml`` → dotted overrides → this model)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from polyspec.config import StrictModel
from polyspec.drafter_kind import DrafterKind

LK_ETA = 3.0  # lk_hybrid's η: "LK Losses"' best hybrid setting, speculators' default


class DataConfig(StrictModel):
    pretrain: list[str] = Field(
        default_factory=lambda: ["{run}/synth/{lang}-pretrain/data.jsonl"],
        description="general text for the pretrain stage (jsonl: `text`, or ShareGPT "
        "conversations); "
        "online users may name an HF dataset (org/name)",
    )
    finetune: list[str] = Field(
        default_factory=lambda: ["{run}/synth/{lang}/data.jsonl"],
        description="the language's synth data (jsonl)",
    )
    max_length: int = Field(256, ge=8, description="tokens per training sequence")
    pad_to_multiple: int = Field(
        8,
        ge=1,
        description="batch length rounded up to a multiple of this: fewer distinct "
        "shapes for the kernels (1: no rounding); 8 trains fastest on CPU (evidence: "
        "docs/experiments.md#stage-speed-measurements)",
    )
    split_text: bool = Field(
        False,
        description="plain-text records (a corpus' documents) longer than max_length "
        "become several sequences of at most max_length tokens, each after the tokenizer's BOS, "
        "instead of one cut at max_length: the pretrain reads every token of the text",
    )
    group_by_length: bool = Field(
        True,
        description="batches of similar length (transformers' group_by_length): "
        "less padding per step, the same examples per epoch",
    )
    eval_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="held-out share of the finetune data"
    )
    eval_max_examples: int = Field(16, ge=1)
    eval_file: list[str] | None = Field(
        None,
        description="finetune: score held-out acceptance on these files' instructions (a test "
        "set) instead of "
        "a split of the finetune data, which then trains on all of its records",
    )


class EagleConfig(StrictModel):
    arch: Literal["eagle1", "eagle3"] = Field(
        "eagle1",
        description="eagle1: fc over [embedding ‖ last feature], target head; eagle3: three "
        "target layers "
        "fused, own draft-vocabulary head (the speculators / vLLM eagle3 form)",
    )
    vocab_size: int | None = Field(
        8192, ge=1, description="s: top-s ids of the language's ranked list; None = full"
    )
    vocab_file: str = Field("{run}/vocab/{lang}.safetensors")
    vocab_langs: list[str] | None = Field(
        None,
        description="draft vocabulary of a multilingual drafter: these languages' ranked lists "
        "(vocab_file with "
        "{lang} = each) interleaved by rank, duplicates dropped, cut at vocab_size (the EAGLE-3 "
        "pretrain an engine "
        "serves for every language); None: the stage language's own list",
    )
    feature_loss_weight: float = Field(
        1.0, ge=0.0, description="EAGLE-1: SmoothL1 on the next feature"
    )
    token_loss_weight: float = Field(
        0.1, ge=0.0, description="EAGLE-1: CE against the target's next-token distribution"
    )
    token_loss: Literal["kl", "lk_hybrid"] = Field(
        "kl",
        description="kl: CE against the target's distribution over the draft ids; lk_hybrid: "
        "speculators' lk_hybrid of 'LK Losses' (arXiv 2602.23881), per row λ·KL + (1 − λ)·(1 − α), "
        "α = Σ min(p, q) the expected acceptance, λ = exp(−lk_eta·α) (α detached)",
    )
    lk_eta: float = Field(
        LK_ETA, ge=0.0, description="lk_hybrid's η: larger leans on the acceptance term sooner"
    )
    feature_noise: float = Field(
        0.1, ge=0.0, description="uniform noise U(-a, a) on input features (EAGLE)"
    )
    ttt_steps: int = Field(
        1, ge=1, description="EAGLE-3 training-time test: unrolled steps (1 = off)"
    )
    target_probs_gb: float | None = Field(
        None,
        ge=0.0,
        description="host memory (fp16) for the target's distribution "
        "over the s ids at each example's loss rows, kept after its first epoch "
        "instead of recomputed by the head (the same values either way); None: 4 on "
        "CPU, 0 on GPUs (there the GEMM costs less than moving its result)",
    )
    mask_out_of_vocab: bool = Field(
        False,
        description="leave out of the token loss the rows whose target argmax "
        "lies outside the draft vocabulary (EAGLE-3's reference training; costs a "
        "whole-vocabulary head GEMM a loss row)",
    )
    ttt_decay: float = Field(
        0.8, gt=0.0, le=1.0, description="weight of unrolled step i is decay**i"
    )
    num_layers: int = Field(
        1,
        ge=1,
        description="decoder layers of the drafter. EAGLE-1: 1 is the EAGLE form (a second layer "
        "gained less τ than its drafting cost, evidence: "
        "docs/experiments.md#the-eagle-1-drafters-depth-and-its-layers-init); EAGLE-3: the first "
        "layer reads [embedding ‖ fused features] (2H), the others are ordinary decoder layers on "
        "its hidden state (speculators' and vLLM's multi-layer eagle3; llama.cpp's GGUF runs one "
        "layer only)",
    )
    init_layer: Literal["random", "target"] = Field(
        "random",
        description="EAGLE-1 trained from scratch: its decoder layer and final norm start as a "
        "random init or as a copy of the target's last full-attention layer and final norm "
        "(random scored higher, evidence: "
        "docs/experiments.md#the-eagle-1-drafters-depth-and-its-layers-init)",
    )

    lookup_hint: bool = Field(
        False,
        description="EAGLE-1: the drafter also reads, at each entry, the token prompt lookup "
        "proposes next "
        "and its n-gram length (polyspec.lookup; computed from the same tokens in training and "
        "decoding)",
    )

    @model_validator(mode="after")
    def _one_layer_forms(self):
        """Options one form or one layer owns. ``num_layers`` > 1 is either form's (EAGLE-3: the
        speculators / vLLM multi-layer layout); only a copy of the target's layer needs one."""
        if self.lookup_hint and self.arch != "eagle1":
            raise ValueError(
                "eagle.lookup_hint is an EAGLE-1 option (the eagle3 form is the one vLLM serves, "
                "without it)"
            )
        if self.num_layers > 1 and self.init_layer == "target":
            raise ValueError(
                "eagle.init_layer=target copies one target layer: it needs eagle.num_layers=1"
            )
        return self

    @model_validator(mode="after")
    def _lk_eta_needs_lk_hybrid(self):
        if self.token_loss != "lk_hybrid" and self.lk_eta != LK_ETA:
            raise ValueError("eagle.lk_eta is an option of eagle.token_loss=lk_hybrid")
        return self


class SmallLMConfig(StrictModel):
    hidden_size: int = Field(256, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(768, ge=8)


class OptimConfig(StrictModel):
    lr: float = Field(3e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_ratio: float = Field(
        0.03,
        ge=0.0,
        lt=1.0,
        description="Yi et al. 2024 (Towards Fast Multilingual LLM Inference), Appendix F",
    )
    max_grad_norm: float = Field(1.0, gt=0)
    batch_size: int = Field(4, ge=1, description="sequences per device per micro-step")
    grad_accum: int = Field(1, ge=1)


class StageConfig(StrictModel):
    steps: int = Field(200, ge=1, description="optimizer steps (when epochs is None)")
    epochs: float | None = Field(
        None,
        gt=0,
        description="passes over the stage's training examples: sets the steps "
        "(ceil(epochs · examples / global batch)); None: steps",
    )
    lr: float | None = Field(None, gt=0, description="None: optim.lr")


class TrainConfig(StrictModel):
    """`accelerate launch train/drafter.py --config configs/train/eagle-cpu.yaml lang=vi`."""

    lang: str = "vi"
    target: str = "gemma3-270m"
    target_dtype: str = Field(
        "float32",
        description="dtype of the frozen target computing the features online: float32 "
        "(default; the fp32 drafter trains on exact features) or auto/bfloat16",
    )
    run: str = "runs/default"
    train_dir: str = Field(
        "train",
        description="folder under the run the stages write: <run>/<train_dir>/<lang>/ (a "
        "second drafter form trained beside the first, e.g. the EAGLE-3 drafters engines load)",
    )
    drafter_type: Literal["eagle", "small-lm"] = "eagle"
    stage: Literal["pretrain", "finetune", "both"] = "both"
    init_from: str | None = Field(
        None, description="finetune: weights to start from (default: this run's pretrain final)"
    )
    seed: int = 0
    features: Literal["online", "offline", "captured"] = Field(
        "online",
        description="online: the target runs in every step; offline: its last layer precomputed "
        "once; "
        "captured: read from the shards `synth distill capture_features=true` kept while "
        "generating (no target pass)",
    )
    mixed_precision: Literal["no", "bf16", "fp16", "auto"] = Field(
        "auto",
        description="auto: bf16 where bf16 is native (CUDA, AVX512-BF16 / AMX CPUs; not DeepSpeed "
        "on CPU), else no",
    )
    data: DataConfig = DataConfig()
    eagle: EagleConfig = EagleConfig()
    small_lm: SmallLMConfig = SmallLMConfig()
    optim: OptimConfig = OptimConfig()
    pretrain: StageConfig = StageConfig(steps=200)
    finetune: StageConfig = StageConfig(steps=200)
    checkpoint_every: int = Field(50, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    eval_every: int = Field(50, ge=1)
    eval_depth: int = Field(
        4,
        ge=1,
        description="γ of the score: the decoder's greedy chain procedure with γ drafts "
        "per step on held-out prompts (tau = answer tokens / target forwards)",
    )
    log_every: int = Field(10, ge=1)
    max_seconds: float | None = Field(
        None,
        gt=0,
        description="a time budget for the stage's training (a lent GPU's): "
        "after 10 steps the planned steps shrink to what the measured rate affords, so "
        "the cosine schedule anneals within it; past it the stage ends at the next step. "
        "final/ is written either way",
    )
    eval_only: bool = Field(
        False,
        description="evaluate the stage's starting weights (random init unless init_from) and stop",
    )
    report_to: Literal["wandb", "tensorboard", "none"] = Field(
        "wandb", description="wandb runs offline by default"
    )
    device: str = "auto"

    @property
    def drafter_kind(self) -> DrafterKind:
        """The kind of drafter this recipe trains: ``eagle.arch``'s for ``drafter_type`` eagle, else
        a small LM."""
        return (
            DrafterKind(self.eagle.arch) if self.drafter_type == "eagle" else DrafterKind.SMALL_LM
        )
