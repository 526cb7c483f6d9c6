"""The plugin's patches to vLLM classes, one per class, each installed once per process and each a
no-op unless the drafter folder in the speculative config holds polyspec's files
(``polyspec_vllm.json``, ``polyspec.json``). All read vLLM 0.32.0's internals
(``polyspec_vllm.SUPPORTED_VLLM``)."""

from __future__ import annotations

import functools
import logging

from polyspec_vllm import PolyspecVllmError
from polyspec_vllm.settings import Settings, SettingsError, read

# under vLLM's logger: its handlers and level (VLLM_LOGGING_LEVEL) apply in every process
logger = logging.getLogger("vllm.polyspec_vllm")

_INSTALLED = False


def install() -> None:
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    _patch_vllm_config()
    _patch_model_runner()


def settings_of(speculative_config) -> Settings | None:
    """The polyspec settings of a speculative config's drafter folder (None: vLLM alone)."""
    if speculative_config is None or speculative_config.method not in ("eagle", "eagle3"):
        return None
    try:
        return read(speculative_config.model)
    except SettingsError as e:
        raise PolyspecVllmError(str(e)) from None


def _patch_vllm_config() -> None:
    """vLLM 0.32 ``VllmConfig``: validate polyspec's settings and drafter at start-up, in the
    process that parses the arguments, before any weight loads; and keep a hybrid server on the V1
    runner, the one the hybrid patches (``_get_v2_model_runner_unsupported_features`` is vLLM's own
    switch for features V2 lacks)."""
    from vllm.config import VllmConfig

    post_init = VllmConfig.__post_init__
    unsupported = VllmConfig._get_v2_model_runner_unsupported_features

    @functools.wraps(post_init)
    def __post_init__(self, *args, **kwargs):
        post_init(self, *args, **kwargs)
        _check(self)

    @functools.wraps(unsupported)
    def _get_v2_model_runner_unsupported_features(self):
        found = unsupported(self)
        settings = settings_of(self.speculative_config)
        if settings is not None and settings.hybrid is not None:
            found.append("polyspec's hybrid drafting")
        return found

    VllmConfig.__post_init__ = __post_init__
    VllmConfig._get_v2_model_runner_unsupported_features = _get_v2_model_runner_unsupported_features


def _check(config) -> None:
    """One ``error: polyspec-vllm: …`` line for a configuration the plugin cannot honour."""
    spec = config.speculative_config
    # EAGLE drafters only: a draft_model folder is a whole model, not a speculators export
    if spec is None or spec.model is None or spec.method not in ("eagle", "eagle3"):
        return
    from polyspec_vllm.checks import drafter_problems

    model_config = config.model_config
    text = model_config.hf_text_config
    problems = drafter_problems(spec.model, text, getattr(model_config, "tokenizer", None))
    if problems:
        raise PolyspecVllmError(
            f"drafter {spec.model} was not trained for target {model_config.model}: "
            f"{'; '.join(problems)}. Export a drafter for this target "
            "(python -m export --target …) or serve the target it was trained for"
        )
    settings = settings_of(spec)
    if settings is None or settings.hybrid is None:
        return
    try:
        settings.hybrid.check(spec.num_speculative_tokens)
    except SettingsError as e:
        raise PolyspecVllmError(str(e)) from None
    if spec.draft_sample_method != "greedy":
        raise PolyspecVllmError(
            f"hybrid needs draft_sample_method 'greedy' (got {spec.draft_sample_method!r}): an "
            "n-gram row has no draft probabilities"
        )
    if config.use_v2_model_runner:
        raise PolyspecVllmError(
            "hybrid runs on vLLM's V1 model runner: unset VLLM_USE_V2_MODEL_RUNNER or set it to 0"
        )
    # the n-gram proposer reads the CPU token lists vLLM fills after its bookkeeping
    spec.disable_padded_drafter_batch = True
    logger.info("polyspec hybrid: %s", settings.hybrid)


def _patch_model_runner() -> None:
    """vLLM 0.32 V1 ``GPUModelRunner.propose_draft_token_ids`` (``CPUModelRunner`` inherits it):
    where the drafter folder asks for ``hybrid``, n-gram rows replace the drafter's
    (``polyspec_vllm.hybrid``)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.propose_draft_token_ids

    @functools.wraps(original)
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        hybrid = self.__dict__.get("_polyspec_hybrid", ...)
        if hybrid is ...:
            settings = settings_of(self.speculative_config)
            hybrid = None
            if settings is not None and settings.hybrid is not None:
                from polyspec_vllm.hybrid import HybridProposer

                hybrid = HybridProposer(settings.hybrid, self.vllm_config)
            self._polyspec_hybrid = hybrid
        if hybrid is None:
            return original(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        rows, took, drafted = hybrid.propose(
            self, original, scheduler_output, sampled_token_ids, *args, **kwargs
        )
        if hybrid.stats.add(took, drafted):
            logger.info("polyspec hybrid: %s", hybrid.stats)
        return rows

    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
