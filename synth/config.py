"""Options of the synth stage, declared once (YAML `configs/synth/*.yaml`, then CLI overrides)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from polyspec.config import StrictModel


class SamplingConfig(StrictModel):
    temperature: float = Field(1.0, ge=0.0, description="ADASPEC Alg. 1 samples at T=1.0")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(128, ge=1)


class EngineConfig(StrictModel):
    name: Literal["transformers", "vllm"] = "transformers"
    batch_size: int = Field(16, ge=1, description="transformers: prompts per forward batch")
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")
    dtype: str | None = Field(None, description="None: the target's dtype")
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="vllm: GPUs of the one model replica (more GPUs: one synth job per language, "
        "synth/engines.py)",
    )
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0, description="vllm")
    enforce_eager: bool = Field(
        False,
        description="vllm: no torch.compile / CUDA graphs (start-up ~20 s instead of "
        "~2 min on a 2-core CPU; slower steps)",
    )


class FilterConfig(StrictModel):
    lid_threshold: float | None = Field(
        None, ge=0.0, le=1.0, description="None: the language's own threshold"
    )
    min_instruction_chars: int = Field(8, ge=0)
    max_instruction_chars: int = Field(1000, ge=1)
    min_response_chars: int = Field(16, ge=0)
    max_response_chars: int = Field(4000, ge=1)
    require_language: bool = Field(
        True,
        description="False records the LID label but keeps pairs in any language (debugging, "
        "code-only data)",
    )
    near_duplicate: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="reject an instruction whose word bigrams overlap a kept one's by this "
        "Jaccard similarity or more (MinHash LSH); None: exact duplicates only",
    )
    keep_unfinished_instructions: bool = Field(
        False,
        description="keep instructions that ran into max_new_tokens (usually a runaway few-shot "
        "continuation)",
    )
    keep_unfinished_responses: bool = Field(
        True, description="keep responses cut by max_new_tokens (still the target's own text)"
    )


class SynthConfig(StrictModel):
    """`make synth LANG=vi N=64` == `python -m synth --lang vi --n 64`."""

    lang: str = "vi"
    n: int = Field(64, ge=1, description="pairs to keep")
    max_attempts: int | None = Field(None, ge=1, description="attempt budget (default 8*n)")
    target: str = "gemma3-270m"
    run: str = Field(
        "runs/default", description="run directory; output goes to <run>/synth/<lang>/"
    )
    seed: int = 0
    few_shot: int = Field(6, ge=0, description="seeds shown in the instruction prompt")
    few_shot_variants: int = Field(
        1,
        ge=1,
        description="instruction prompts to rotate through, one per engine batch: variant 0 "
        "shows the first few_shot seeds in file order, variant v a seeded sample of few_shot "
        "seeds in a seeded order (more varied instructions at scale)",
    )
    response_with_system_prompt: bool = Field(
        False,
        description="Alg. 1 line 14 answers the instruction alone; True adds the language's "
        "system prompt",
    )
    translation_max_new_tokens: int = Field(
        256, ge=1, description="Alg. 1 lines 2–10, languages not built in"
    )
    instruction: SamplingConfig = SamplingConfig(max_new_tokens=96)
    response: SamplingConfig = SamplingConfig(max_new_tokens=192)
    engine: EngineConfig = EngineConfig()
    filters: FilterConfig = FilterConfig()

    @property
    def attempt_budget(self) -> int:
        return self.max_attempts or 8 * self.n


class DistillConfig(StrictModel):
    """`python -m synth distill --prompts prompts.jsonl --lang vi` (Yi et al. 2024's
    self-distillation)."""

    lang: str = "vi"
    prompts: str = Field(
        "seeds",
        description="jsonl/ShareGPT file, a synth data.jsonl, 'seeds' (free-text "
        "continuations of the language seeds), 'pool' (the language's distillation pool), "
        "'heldout' (its held-out prompts), 'heldout-chat' (its two-turn chat held-out prompts, "
        "synth/data/heldout-chat.jsonl, English only; never in the pool) or an HF dataset name "
        "when online",
    )
    corpus_prompts: int = Field(
        0,
        ge=0,
        description="prompts 'pool': up to this many prompts about the run's corpus "
        "paragraphs (<run>/corpus/<lang>/data.jsonl) follow the pool's own (synth/pool.py)",
    )
    prompt_field: str = Field(
        "instruction", description="field holding the prompt text in a plain jsonl"
    )
    limit: int | None = Field(None, ge=1, description="use at most this many prompts")
    temperatures: list[float] = Field(default_factory=lambda: [0.0, 0.3, 0.7, 1.0])
    target: str = "gemma3-270m"
    run: str = "runs/default"
    out_name: str = Field("distill", description="output folder <run>/synth/<lang>-<out_name>/")
    seed: int = 0
    continuation: bool = Field(
        False, description="free-text continuation (no prompt format): pretraining text"
    )
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=192)
    engine: EngineConfig = EngineConfig()
    capture_features: bool = Field(
        False,
        description="keep the target's hidden states of every record from the "
        "generating forwards (polyspec/features.py): drafters then train offline",
    )
    feature_layers: Literal["last", "eagle3"] = Field(
        "last",
        description="last: the last layer (EAGLE-1); eagle3: "
        "also the three layers an EAGLE-3 drafter reads",
    )
    batches_per_commit: int = Field(
        8,
        ge=1,
        description="engine batches answered per call and committed together: "
        "the transformers engine refills finished rows from the call's waiting prompts "
        "(continuous batching); a cut run resumes at the last commit",
    )
    max_feature_gb: float = Field(
        20.0, gt=0, description="stop capturing (records go on) past this disk use"
    )
    max_seconds: float | None = Field(
        None,
        gt=0,
        description="stop at the first commit past this many seconds of "
        "this session (a lent GPU's budget): the committed records stand, stats.json says "
        "complete: false, and a rerun goes on from there",
    )
    lid_filter: bool = Field(
        True,
        description="reject sampled (T > 0) answers confidently in another language to "
        "prompts in the language; greedy answers (the decoder's path) and translations are kept",
    )
