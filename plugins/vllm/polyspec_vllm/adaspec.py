"""``languages`` (ADASPEC per request): one server holds a drafter per language — its own layer,
head and frequency-ranked vocabulary (``d2t``) — beside the folder's multilingual drafter, and each
request drafts with its language's (``polyspec_vllm.languages`` says which).

vLLM 0.32 has one EAGLE proposer per server, run on the whole batch each step. Each language
drafter here is a second ``EagleProposer`` of the same shape with its own attention layer name
(``polyspec_<lang>.…``, so vLLM gives it its own KV cache) and its own compiled graph (model tag
``eagle_head_<lang>``). A step runs the drafters of the languages present in the batch — one at
batch 1 — each over the whole batch, and keeps each request's row from its own language's drafter.
A drafter runs on every step its language has a request, so that request's drafter KV cache is
whole; rows it drafts for other requests are dropped. Cost: one drafter forward per language in the
step (measured in ``make check-vllm``: ``adaspec`` on mixed-language batches).

Lossless as any EAGLE row: the rejection sampler verifies each row against the target."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from polyspec_vllm.languages import drafter_keys, request_language

logger = logging.getLogger("vllm.polyspec_vllm")


def _log_every() -> int:
    return max(1, int(os.environ.get("POLYSPEC_VLLM_LOG_EVERY", "256")))


@dataclass
class AdaspecStats:
    """Rows drafted per language ('*': the multilingual drafter) and drafter forwards since start-up
    (logged every ``POLYSPEC_VLLM_LOG_EVERY`` steps)."""

    rows: Counter = field(default_factory=Counter)
    steps: int = 0
    forwards: int = 0  # drafter runs (one per language present in a step)
    log_every: int = field(default_factory=_log_every, repr=False)

    def add(self, keys: list[str | None]) -> bool:
        self.rows.update(k or "*" for k in keys)
        self.steps += 1
        self.forwards += len(set(keys))
        return self.steps % self.log_every == 0


def _language_model(proposer, lang: str, folder: Path):
    """``EagleProposer._get_model`` for a language drafter: the folder's weights, an attention
    layer of its own (prefix) and a compiled graph of its own (model tag)."""
    from vllm.compilation.backends import set_model_tag
    from vllm.model_executor.model_loader import get_model
    from vllm.model_executor.model_loader.utils import get_draft_load_config

    draft_vllm_config = proposer._create_draft_vllm_config()
    model_config = copy.copy(proposer.speculative_config.draft_model_config)
    model_config.model = str(
        folder
    )  # the loader reads the weights from here; shapes are the main's
    with set_model_tag(f"eagle_head_{lang}"):
        return get_model(
            vllm_config=draft_vllm_config,
            model_config=model_config,
            load_config=get_draft_load_config(draft_vllm_config),
            prefix=f"polyspec_{lang}",
        )


def _fresh(cad):
    """A copy of vLLM's CommonAttentionMetadata whose tensors a drafter may change in place
    (``propose`` advances ``seq_lens`` each draft step)."""
    out = copy.copy(cad)
    for f in dataclasses.fields(cad):
        value = getattr(cad, f.name)
        if hasattr(value, "clone"):
            setattr(out, f.name, value.clone())
    return out


def _in_group(cad, runner, gid: int, positions):
    """``cad`` for a drafter whose layer vLLM put in KV cache group ``gid`` (vLLM splits a
    hybrid target's full-attention layers, the drafters' among them, into groups of equal size):
    that group's block table, and the first pass's slots computed from it as vLLM's
    ``BlockTable.compute_slot_mapping`` does (no context parallelism)."""
    import torch

    out = _fresh(cad)
    table = runner.input_batch.block_table[gid]
    blocks = table.get_device_tensor(cad.num_reqs)
    loc = cad.query_start_loc[: cad.num_reqs + 1]
    req = torch.repeat_interleave(torch.arange(cad.num_reqs, device=loc.device), loc[1:] - loc[:-1])
    pos = positions[: req.shape[0]].long()
    size = table.block_size
    out.block_table_tensor = blocks
    out.slot_mapping = blocks[req, pos // size].long() * size + pos % size
    return out


class LanguageDrafters:
    """The language drafters beside the runner's EAGLE proposer (``main``: the folder's own,
    multilingual drafter), and each request's language."""

    def __init__(self, main, folders: dict[str, Path]):
        self.main = main
        self.runner = None  # the model runner (vLLM's proposer keeps none): set on its first step
        self.folders = dict(folders)
        self.drafters: dict[str, object] = {}
        self.lang_of: dict[str, str | None] = {}
        self.stats = AdaspecStats()
        self._tokenizer = None
        self._signature = None

    # -- start-up: the runner calls these on its proposer; the language drafters follow ----------
    def load(self, target_model) -> None:
        from vllm.v1.spec_decode.eagle import EagleProposer

        for lang, folder in self.folders.items():
            sub = EagleProposer(self.main.vllm_config, self.main.device)
            sub._polyspec_sub = True  # its own load_model must not load language drafters again
            sub._get_model = lambda sub=sub, lang=lang, folder=folder: _language_model(
                sub, lang, folder
            )
            sub.load_model(target_model)
            self.drafters[lang] = sub
        logger.info("polyspec adaspec: language drafters %s", sorted(self.drafters))

    def initialize_attn_backend(self, *args, **kwargs) -> None:
        for sub in self.drafters.values():
            sub.initialize_attn_backend(*args, **kwargs)
        groups = {lang: sub.kv_cache_gid for lang, sub in self.drafters.items()}
        logger.info(
            "polyspec adaspec: KV cache groups: multilingual %d, %s",
            self.main.kv_cache_gid,
            ", ".join(f"{lang} {gid}" for lang, gid in sorted(groups.items())),
        )

    def dummy_run(self, *args, **kwargs) -> None:
        for sub in self.drafters.values():
            sub.dummy_run(*args, **kwargs)

    # -- each step -------------------------------------------------------------------------------
    def _prompt_text(self, state) -> str:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            mc = self.main.vllm_config.model_config
            self._tokenizer = AutoTokenizer.from_pretrained(
                mc.tokenizer, trust_remote_code=mc.trust_remote_code
            )
        return self._tokenizer.decode(state.prompt_token_ids or [], skip_special_tokens=True)

    def languages(self, req_ids: list[str]) -> list[str | None]:
        """Each request's language, decided once per request (its tag, else the language ID)."""
        requests = self.runner.requests
        if len(self.lang_of) > 4 * max(len(req_ids), 256):  # finished requests
            self.lang_of = {r: self.lang_of[r] for r in req_ids if r in self.lang_of}
        out = []
        for rid in req_ids:
            if rid not in self.lang_of:
                state = requests[rid]
                extra = getattr(state.sampling_params, "extra_args", None)
                self.lang_of[rid] = request_language(extra, lambda s=state: self._prompt_text(s))
            out.append(self.lang_of[rid])
        return out

    def propose(self, main_propose, *args, **kwargs):
        """``EagleProposer.propose`` per language: each language present drafts the whole batch,
        each request keeps its language's row (the multilingual drafter's where its language has
        none)."""
        import torch

        if self._signature is None:
            self._signature = inspect.signature(main_propose)
        bound = self._signature.bind(*args, **kwargs).arguments
        cad = bound["common_attn_metadata"]
        batch = cad.batch_size()
        keys = drafter_keys(
            self.languages(self.runner.input_batch.req_ids[:batch]), set(self.drafters)
        )
        if self.stats.add(keys):
            logger.info("polyspec adaspec: %s", self.stats)
        groups = list(dict.fromkeys(keys))
        out = None
        for k in groups:
            if k is None:
                drafted = main_propose(**{**bound, "common_attn_metadata": _fresh(cad)})
            else:
                sub = self.drafters[k]
                sub_cad = (
                    _fresh(cad)
                    if sub.kv_cache_gid == self.main.kv_cache_gid
                    else _in_group(cad, self.runner, sub.kv_cache_gid, bound["target_positions"])
                )
                drafted = sub.propose(**{**bound, "common_attn_metadata": sub_cad})
            if len(groups) == 1:
                return drafted
            rows = torch.tensor(
                [i for i, key in enumerate(keys) if key == k], device=drafted.device
            )
            if out is None:
                out = drafted.clone()
            out[rows] = drafted[rows]
        return out
