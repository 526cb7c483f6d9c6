"""Pipeline profiles (``configs/pipelines/<profile>.yaml``): what each stage runs, as the stages'
own config files plus dotted overrides, and how long each stage is expected to take (for the
ETA)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from polyspec.config import StrictModel


class SynthStage(StrictModel):
    config: str = "configs/synth/default.yaml"
    n: int = Field(64, ge=1)
    overrides: list[str] = Field(default_factory=list)


class DistillStage(StrictModel):
    """Self-distillation (Yi et al. 2024). ``on-policy``: the target answers the language's prompt
    pool (synth/pool.py) at T = 0 and sampled temperatures, its hidden states captured in the same
    pass, plus its greedy answers to the held-out prompts (the training score, vocabulary coverage);
    drafters then train on the captured features (``features=captured``). ``continuation``:
    free-text continuations of the seeds (the older path)."""

    config: str = "configs/synth/distill.yaml"
    mode: Literal["on-policy", "continuation"] = "on-policy"
    temperatures: list[float] = Field(default_factory=lambda: [0.0, 0.7])
    limit: int | None = Field(
        None, ge=1, description="on-policy: pool prompts per language (None: all)"
    )
    overrides: list[str] = Field(default_factory=list)


class CorpusStage(StrictModel):
    """General text for the pretrain (Yi et al. 2024's P step): ``corpus:<l>`` builds the language's
    corpus (python -m corpus: Debian's translated documentation, offline) and ``prefill:<l>``
    captures the target's features on its first ``tokens`` tokens; the pretrain then reads them
    beside the distilled answers (``features=captured``)."""

    enabled: bool = False
    config: str = "configs/corpus/default.yaml"
    tokens: int = Field(
        200_000,
        ge=1,
        description="per language: corpus tokens the prefill captures for the pretrain",
    )
    seq_len: int = Field(256, ge=16, description="tokens per prefill chunk (BOS included)")
    overrides: list[str] = Field(
        default_factory=list, description="python -m corpus key=value overrides"
    )


class VocabStage(StrictModel):
    config: str = "configs/vocab/default.yaml"
    sources: str = "wordfreq,synth@0.5"
    overrides: list[str] = Field(default_factory=list)


class EngineTrack(StrictModel):
    """EAGLE-3 drafters for serving engines (vLLM, SGLang, llama.cpp), trained beside the profile's
    own drafters when those are of a form no engine loads (EAGLE-1, prompt-lookup hints): a
    multilingual pretrain over every language's data with one interleaved draft vocabulary, then a
    finetune per language, written under ``<run>/<train_dir>/``. Its drafters are exported as
    ``<run>/export/engines/`` (python -m export engines)."""

    recipe: str = "configs/train/eagle3-cpu.yaml"
    train_dir: str = "train-eagle3"
    pretrain_overrides: list[str] = Field(default_factory=list)
    finetune_overrides: list[str] = Field(default_factory=list)


class TrainStage(StrictModel):
    recipe: str = "configs/train/eagle-cpu.yaml"
    accelerate_args: list[str] = Field(
        default_factory=lambda: [
            "--num_processes",
            "1",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
        ]
    )
    pretrain_overrides: list[str] = Field(
        default_factory=list, description="the one multilingual pretrain run"
    )
    finetune_overrides: list[str] = Field(
        default_factory=list, description="each language's finetune"
    )
    engine: EngineTrack | None = Field(
        None,
        description="EAGLE-3 drafters for engines beside these (None: the recipe's "
        "own drafters must be EAGLE-3, which engines load)",
    )


class ExportStage(StrictModel):
    sizes: list[int] = Field(default_factory=lambda: [8192, 16384, 32768])
    window: int = 10
    step: int = 5
    offset: float = 2


class CalibrateStage(StrictModel):
    enabled: bool = True
    sizes: list[int] = Field(default_factory=lambda: [1, 2, 3, 4])
    # ≥ 8: fewer let one prompt decide g* (decoder.calibrate reports the bootstrap stability)
    prompts: int = 8
    max_new_tokens: int = 32


class EvalStage(StrictModel):
    methods: list[str] = Field(
        default_factory=lambda: ["ar", "hf-generate", "adaspec", "eagle-full", "pld"]
    )
    per_cell: int | None = 1
    max_new_tokens: int = 64
    repeats: int = 1
    questions: str | None = Field(
        None, description="Spec-Bench question.jsonl (default: built-in mini Multi-SpecBench)"
    )


class Profile(StrictModel):
    name: str
    description: str = ""
    langs: list[str] = Field(default_factory=lambda: ["vi", "de", "ja"])
    target: str = "gemma3-270m"
    seed: int = 0
    gpu_only: bool = Field(False, description="needs GPUs (validated by DRY_RUN=1 here, not run)")
    synth: SynthStage = SynthStage()
    distill: DistillStage = DistillStage()
    corpus: CorpusStage = CorpusStage()
    vocab: VocabStage = VocabStage()
    train: TrainStage = TrainStage()
    export: ExportStage = ExportStage()
    calibrate: CalibrateStage = CalibrateStage()
    eval: EvalStage = EvalStage()
    eta_minutes: dict[str, float] = Field(
        default_factory=dict,
        description="expected minutes per stage kind (synth, distill, vocab, pretrain, "
        "finetune, export, calibrate, eval, report, corpus, prefill), per language where the "
        "stage is per language",
    )
