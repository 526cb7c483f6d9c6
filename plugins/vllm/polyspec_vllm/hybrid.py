"""``hybrid``: per request and step, vLLM's prompt-lookup proposal where the context's last
``ngram_min`` … ``ngram_max`` tokens occurred before (its continuation is drafted,
``num_speculative_tokens`` long), else the EAGLE drafter's ``drafter_tokens``. The rule of
polyspec's own ``hybrid`` method and ArcticInference's suffix + drafter; upstream vLLM PR #24344
proposes it.

Lossless at temperature 0 and distribution-preserving when sampling: each draft row is a proposal
the rejection sampler verifies against the target (vLLM treats greedy-drafted rows as one-hot
proposals, as it does n-gram rows), whichever proposer made it; the plugin refuses the
``probabilistic`` draft sampling, whose draft probabilities would not describe an n-gram row.

On a step where every request has an n-gram row the drafter drafts nothing: it still reads the
step's verified tokens (its forward at ``num_speculative_tokens`` 0, as vLLM's dynamic speculative
decoding keeps an EAGLE drafter's KV cache whole), but skips its head and its further steps. Where
the batch-size schedule (``num_speculative_tokens_per_batch_size``) drafts nothing, neither
proposer runs, and above ``drafter_max_batch`` requests the drafter does not (that forward alone
cost throughput at 4 and 16 requests: docs/experiments.md); a request that drafts again later reads
a drafter KV cache with gaps (fewer drafts kept, outputs unchanged).

``choose`` and ``drafter_tokens`` are the rules; ``HybridProposer`` runs both proposers for vLLM's
V1 runner (``polyspec_vllm.patches``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from polyspec_vllm.settings import Hybrid


def choose(
    ngram_rows: Sequence[Sequence[int]], drafter_rows: Sequence[Sequence[int]], drafter_tokens: int
) -> tuple[list[list[int]], list[bool]]:
    """Row i: the n-gram proposal where it has one (a match reached ngram_min), else the
    drafter's first ``drafter_tokens``. → (draft rows, whether each row is the n-gram's)."""
    if len(ngram_rows) != len(drafter_rows):
        raise ValueError(f"{len(ngram_rows)} n-gram rows for {len(drafter_rows)} drafter rows")
    rows, took = [], []
    for ngram, drafted in zip(ngram_rows, drafter_rows):
        took.append(bool(ngram))
        rows.append(list(ngram) if ngram else list(drafted[:drafter_tokens]))
    return rows, took


def drafter_tokens(
    ngram_rows: Sequence[Sequence[int]],
    sampled: Sequence[Sequence[int]],
    k: int,
    own: int,
    max_batch: int | None = None,
) -> int | None:
    """How many tokens the drafter drafts this step: None (its forward does not run) where more
    than ``max_batch`` requests sampled a token (there its rows lost to n-gram rows alone, as
    ``make check-vllm`` measures); 0 (its forward runs, its KV cache stays whole) where every
    request that sampled a token has an n-gram row (one that sampled none, still in its prompt,
    takes no draft); else its own length (at most the step's ``k``)."""
    live = [ngram for ngram, new in zip(ngram_rows, sampled) if len(new)]
    if max_batch is not None and len(live) > max_batch:
        return None
    if all(live):
        return 0
    return min(k, own)


def _log_every() -> int:
    return max(1, int(os.environ.get("POLYSPEC_VLLM_LOG_EVERY", "256")))


@dataclass
class HybridStats:
    """Rows drafted by each proposer since start-up, and the steps whose batch had both (logged by
    the runner patch every ``POLYSPEC_VLLM_LOG_EVERY`` steps, default 256)."""

    ngram_rows: int = 0
    drafter_rows: int = 0
    steps: int = 0
    mixed_steps: int = 0
    ngram_only_steps: int = 0  # steps whose drafter drafted nothing (every row an n-gram one)
    log_every: int = field(default_factory=_log_every, repr=False)

    def add(self, took: list[bool], drafted: int) -> bool:
        """Count a step's rows (``drafted``: the drafter's length that step); True when it is time
        to log."""
        n = sum(took)
        self.ngram_rows += n
        self.drafter_rows += len(took) - n
        self.steps += 1
        self.mixed_steps += 0 < n < len(took)
        self.ngram_only_steps += drafted == 0
        return self.steps % self.log_every == 0


class HybridProposer:
    """vLLM's own ``NgramProposer`` with the hybrid's match lengths, beside the runner's EAGLE
    proposer. vLLM forces ``prompt_lookup_min/max`` to 0 for ``eagle3``, so the n-gram proposer is
    built from its own small config (the fields ``NgramProposer.__init__`` reads)."""

    def __init__(self, hybrid: Hybrid, vllm_config):
        from types import SimpleNamespace

        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        spec = vllm_config.speculative_config
        self.hybrid = hybrid
        self.stats = HybridStats()
        self.ngram = NgramProposer(
            SimpleNamespace(
                speculative_config=SimpleNamespace(
                    prompt_lookup_min=hybrid.ngram_min,
                    prompt_lookup_max=hybrid.ngram_max,
                    num_speculative_tokens=spec.num_speculative_tokens,
                ),
                model_config=vllm_config.model_config,
                scheduler_config=vllm_config.scheduler_config,
                parallel_config=vllm_config.parallel_config,
            )
        )

    def propose(self, runner, original, scheduler_output, sampled_token_ids, *args, **kwargs):
        """The runner's ``propose_draft_token_ids`` with the n-gram rows swapped in. The drafter
        drafts ``drafter_tokens`` (its own calibrated length; none on a step where every row is an
        n-gram one), the n-gram rows the step's full length.
        → (rows, which rows are n-gram ones, the drafter's length): vLLM takes rows of different
        lengths."""
        k = scheduler_output.num_spec_tokens_to_schedule
        if k == 0:  # the batch-size schedule drafts nothing here: no drafter forward either
            return [[] for _ in sampled_token_ids], [False] * len(sampled_token_ids), 0
        batch = runner.input_batch
        ngram = self.ngram.propose(
            k, sampled_token_ids, batch.num_tokens_no_spec, batch.token_ids_cpu
        )
        h = self.hybrid
        own = drafter_tokens(ngram, sampled_token_ids, k, h.drafter_tokens, h.drafter_max_batch)
        if own is None:  # the n-gram rows alone, without the drafter's forward
            return [list(r) for r in ngram], [bool(r) for r in ngram], 0
        scheduler_output.num_spec_tokens_to_schedule = own
        try:
            drafted = original(runner, scheduler_output, sampled_token_ids, *args, **kwargs)
        finally:
            scheduler_output.num_spec_tokens_to_schedule = k
        drafted = drafted.tolist() if hasattr(drafted, "tolist") else drafted
        rows, took = choose(ngram, drafted, self.hybrid.drafter_tokens)
        return rows, took, own
