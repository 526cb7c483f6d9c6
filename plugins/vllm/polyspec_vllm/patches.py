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
    _patch_eagle_proposer()
    _patch_sampling_params()


# the languages this process's server drafts per request (set where its VllmConfig is checked: the
# API server's process too, which validates each request's tag); None: no per-language drafters
SERVED_LANGUAGES: set[str] | None = None
# (drafter folder, target) pairs found fit: vLLM builds a VllmConfig again for every drafter it
# loads, and each check loads two tokenizers
_CHECKED: set[tuple[str, str]] = set()


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
        if settings is not None and settings.languages:
            found.append("polyspec's per-language drafters")
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
    if (str(spec.model), model_config.model) not in _CHECKED:
        problems = drafter_problems(spec.model, text, getattr(model_config, "tokenizer", None))
        if problems:
            raise PolyspecVllmError(
                f"drafter {spec.model} was not trained for target {model_config.model}: "
                f"{'; '.join(problems)}. Export a drafter for this target "
                "(python -m export --target …) or serve the target it was trained for"
            )
        _CHECKED.add((str(spec.model), model_config.model))
    settings = settings_of(spec)
    if settings is None or (settings.hybrid is None and not settings.languages):
        return
    if settings.languages:
        _check_languages(spec.model, settings.languages, text, model_config)
    if settings.hybrid is not None:
        try:
            settings.hybrid.check(spec.num_speculative_tokens)
        except SettingsError as e:
            raise PolyspecVllmError(str(e)) from None
    if settings.hybrid is not None and spec.draft_sample_method != "greedy":
        raise PolyspecVllmError(
            f"hybrid needs draft_sample_method 'greedy' (got {spec.draft_sample_method!r}): an "
            "n-gram row has no draft probabilities"
        )
    if config.use_v2_model_runner:
        raise PolyspecVllmError(
            "hybrid and per-language drafters run on vLLM's V1 model runner: unset "
            "VLLM_USE_V2_MODEL_RUNNER or set it to 0"
        )
    # the n-gram proposer reads the CPU token lists vLLM fills after its bookkeeping; the language
    # drafters each draft from the same unpadded inputs
    spec.disable_padded_drafter_batch = True
    if settings.hybrid is not None:
        logger.info("polyspec hybrid: %s", settings.hybrid)


def _check_languages(main: str, languages: dict, text_config, model_config) -> None:
    """Every language drafter exists, fits the target and has the multilingual drafter's shapes
    (vLLM builds each from the main drafter's config); the API server then accepts their tags."""
    global SERVED_LANGUAGES
    from polyspec_vllm.checks import drafter_problems, shape_problems

    for lang, folder in languages.items():
        if (str(folder), model_config.model) in _CHECKED:
            continue
        if not (folder / "config.json").is_file():
            raise PolyspecVllmError(
                f"languages.{lang}: {folder} is no drafter folder (no config.json); export it with "
                "python -m export --format engines, or drop the language from polyspec_vllm.json"
            )
        problems = drafter_problems(
            folder, text_config, getattr(model_config, "tokenizer", None)
        ) or shape_problems(main, folder)
        if problems:
            raise PolyspecVllmError(f"languages.{lang}: drafter {folder}: {'; '.join(problems)}")
        _CHECKED.add((str(folder), model_config.model))
    SERVED_LANGUAGES = set(languages)
    logger.info("polyspec adaspec: per-request drafters for %s", ", ".join(sorted(languages)))


def _patch_model_runner() -> None:
    """vLLM 0.32 V1 ``GPUModelRunner.propose_draft_token_ids`` (``CPUModelRunner`` inherits it):
    where the drafter folder asks for ``hybrid``, n-gram rows replace the drafter's
    (``polyspec_vllm.hybrid``); per-language drafters learn the runner, whose requests carry their
    language tags."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.propose_draft_token_ids

    @functools.wraps(original)
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        languages = getattr(self, "drafter", None).__dict__.get("_polyspec_languages")
        if languages is not None:  # the language drafters read each request's tag from the runner
            languages.runner = self
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


def _patch_eagle_proposer() -> None:
    """vLLM 0.32 V1 ``EagleProposer``: where the drafter folder lists ``languages``, the language
    drafters load, warm up and take their KV cache beside it, and ``propose`` drafts each request
    with its language's drafter (``polyspec_vllm.adaspec``)."""
    from vllm.v1.spec_decode.eagle import EagleProposer

    load_model, propose = EagleProposer.load_model, EagleProposer.propose
    initialize_attn_backend, dummy_run = (
        EagleProposer.initialize_attn_backend,
        EagleProposer.dummy_run,
    )

    def drafters_of(self):
        return self.__dict__.get("_polyspec_languages")

    @functools.wraps(load_model)
    def _load_model(self, target_model):
        load_model(self, target_model)
        if self.__dict__.get("_polyspec_sub"):  # a language drafter itself
            return
        settings = settings_of(self.speculative_config)
        if settings is None or not settings.languages:
            return
        from polyspec_vllm.adaspec import LanguageDrafters

        drafters = LanguageDrafters(self, settings.languages)
        drafters.load(target_model)
        self._polyspec_languages = drafters

    @functools.wraps(initialize_attn_backend)
    def _initialize_attn_backend(self, *args, **kwargs):
        initialize_attn_backend(self, *args, **kwargs)
        if drafters_of(self) is not None:
            drafters_of(self).initialize_attn_backend(*args, **kwargs)

    @functools.wraps(dummy_run)
    def _dummy_run(self, *args, **kwargs):
        dummy_run(self, *args, **kwargs)
        if drafters_of(self) is not None:
            drafters_of(self).dummy_run(*args, **kwargs)

    @functools.wraps(propose)
    def _propose(self, *args, **kwargs):
        if drafters_of(self) is None:
            return propose(self, *args, **kwargs)
        return drafters_of(self).propose(functools.partial(propose, self), *args, **kwargs)

    EagleProposer.load_model = _load_model
    EagleProposer.initialize_attn_backend = _initialize_attn_backend
    EagleProposer.dummy_run = _dummy_run
    EagleProposer.propose = _propose


def _patch_sampling_params() -> None:
    """vLLM 0.32 ``SamplingParams._verify_extra_args``: on a server with per-language drafters, a
    request whose language tag (``vllm_xargs`` ``lang``) is no language code is a 400 with one line
    (vLLM answers its VLLMValidationError so)."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    verify = SamplingParams._verify_extra_args

    @functools.wraps(verify)
    def _verify_extra_args(self):
        verify(self)
        if SERVED_LANGUAGES is None:
            return
        from polyspec_vllm.languages import tag_problem

        problem = tag_problem(self.extra_args, SERVED_LANGUAGES)
        if problem:
            raise VLLMValidationError(problem, parameter="extra_args")

    SamplingParams._verify_extra_args = _verify_extra_args
