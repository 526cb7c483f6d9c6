"""Generation engines behind one interface: ``engine.generate(requests) -> results``.

- ``transformers``: our own batched sampling loop (left padding, KV cache, CPU or CUDA) with
  continuous batching (finished rows are replaced by waiting requests within one ``generate`` call).
  Each request carries its own seed and is sampled with its own ``torch.Generator``, so a sample
  depends only on (prompt, seed) and a resumed run reproduces an uninterrupted one exactly.
- ``vllm``: offline ``LLM.generate`` with one ``SamplingParams`` per request (``seed`` set per
  request) and tensor parallelism from the config, in vLLM's own process (``polyspec.vllm_process``:
  ``make setup-vllm`` on CPU, ``pip install 'polyspec[vllm]'`` on GPUs). Captured features come from
  the target's prefill over each answer (vLLM returns no hidden states to the offline ``LLM``).

Both engines receive the same token ids for a prompt: :func:`polyspec.prompts.encode` (a chat
template carries its own BOS; a completion prompt gets the tokenizer's). vLLM is given those ids
(``{"prompt_token_ids": ids}``, vLLM's ``TokensPrompt``), never the text: from text it would add a
BOS of its own in front of the template's (two BOS tokens: another prompt than the transformers
engine's).

Data parallelism: the offline ``LLM`` serves one model replica (``tensor_parallel_size`` GPUs);
vLLM's own offline data parallelism needs one process per rank. Languages are independent synth jobs
with their own output folders, so on a node with more GPUs run one job per language, each on its own
devices, e.g. ``CUDA_VISIBLE_DEVICES=0,1 python -m synth --lang vi engine.name=vllm
engine.tensor_parallel_size=2 &`` ``CUDA_VISIBLE_DEVICES=2,3 python -m synth --lang de …`` (never
two jobs on the same language and run).

Both stop at EOS or at any of the request's stop strings; the stop string is not part of the text.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from polyspec.errors import PolyspecError
from polyspec.features import prefill_features
from polyspec.generation import Stopper, eos_ids, top_p_filter
from polyspec.prompts import encode


@dataclass
class Request:
    prompt: str
    seed: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)


@dataclass
class Result:
    text: str
    num_tokens: int  # generated tokens, up to and including the stop (or EOS)
    finished: bool  # stopped at EOS or a stop string (False: ran into max_new_tokens)
    # with ``capture``: prompt + generated ids and the target's hidden states at those positions
    # ({"f": [n, H] last layer after the final norm, "aux": [n, 3H] the chosen layers}); n =
    # len(ids)
    ids: list[int] | None = None
    features: dict[str, torch.Tensor] | None = None
    prompt_tokens: int = 0  # with ``capture``: ids[:prompt_tokens] is the prompt
    # mean negative log-likelihood of the generated tokens under the target's own (untempered)
    # distribution, given the prompt, from the generating forwards: SPECTRA's corpus refinement
    # ranks by it (no second pass)
    nll: float | None = None


class Engine(Protocol):
    def generate(
        self, requests: list[Request], capture: list[int] | None = None
    ) -> list[Result]: ...


# ------------------------------------------------------------------------------------- transformers


class TransformersEngine:
    """Batched sampling with per-request generators on a loaded :class:`polyspec.targets.Target`,
    with continuous batching: up to ``batch_size`` rows generate together, and when rows finish,
    waiting requests are prefilled and join the running batch (their KV cache left-padded to the
    batch's, or the batch's to theirs), so that the forward stays full instead of running on the
    rows that are left."""

    def __init__(self, target: Any, batch_size: int = 16):
        self.target = target
        self.batch_size = batch_size
        # admit waiting requests once this many rows are free (each admission is one prefill
        # forward, which reads every weight once: a row at a time would pay that per row)
        self.refill = max(1, batch_size // 8)
        self.stats = {"tokens": 0, "seconds": 0.0}

    def generate(self, requests: list[Request], capture: list[int] | None = None) -> list[Result]:
        """``capture``: None, or the ``output_hidden_states`` indices to keep beside the last layer
        ([]: the last layer only): the features a drafter trains on, taken from the generating
        forwards themselves."""
        if not requests:
            return []
        t0 = time.perf_counter()
        res = self._generate(requests, capture)
        self.stats["seconds"] += time.perf_counter() - t0
        self.stats["tokens"] += sum(r.num_tokens for r in res)
        return res

    @torch.inference_mode()
    def _generate(self, reqs: list[Request], capture: list[int] | None = None) -> list[Result]:
        tok, model, dev = self.target.tokenizer, self.target.model, self.target.device
        # the ids vLLM gets too
        encoded = [encode(self.target.spec.prompt_format, tok, r.prompt) for r in reqs]
        n = len(reqs)
        gens = [torch.Generator(device="cpu").manual_seed(r.seed) for r in reqs]
        eos = eos_ids(self.target)
        # where each row's answer ends
        stoppers = [Stopper(tok, eos, r.stop, r.max_new_tokens) for r in reqs]
        # each row's sampled tokens (EOS or stop included), its Stopper's
        new_tokens = [s.tokens for s in stoppers]
        nll = [0.0] * n  # sum of -log p(token) at T = 1
        grab = _FeatureGrab(model, capture, n) if capture is not None else None
        # set by the first prefill's cache (_joinable); False: a group starts when the last is done
        can_join = None

        def take(rows: list[int], logits: torch.Tensor) -> list[int]:
            """Sample each row with its own generator; return the positions (in ``rows``) still
            generating."""
            # ~2 % of a 32-row fp32 step (AVX2 host); saves SPECTRA a scoring pass
            lse = torch.logsumexp(logits, dim=-1)
            picked = _sample_rows(
                logits,
                [reqs[b].temperature for b in rows],
                [reqs[b].top_p for b in rows],
                [gens[b] for b in rows],
            )
            token_nll = (
                lse
                - logits.gather(1, torch.tensor(picked, device=logits.device).unsqueeze(1)).squeeze(
                    1
                )
            ).tolist()
            going = []
            for j, (b, t) in enumerate(zip(rows, picked)):
                nll[b] += token_nll[j]
                stoppers[b].push([t])  # EOS, a stop string or max_new_tokens ends the row
                if not stoppers[b].done:
                    going.append(j)
            return going

        queue = deque(range(n))
        live: list[int] = []  # rows generating, in cache order
        nxt: list[int] = []  # the token each live row is fed next
        # the live rows' cache and its [rows, columns] mask (left padding is 0)
        past, mask = None, None
        while queue or live:
            free = self.batch_size - len(live)
            if queue and (not live or (can_join and free >= min(self.refill, len(queue)))):
                # 1. prefill waiting requests (each distinct prompt once), sample their first
                #    tokens, join the batch
                rows = [queue.popleft() for _ in range(min(free, len(queue)))]
                new_past, new_mask, logits = self._prefill(rows, encoded, capture, grab)
                can_join = _joinable(model, new_past) if can_join is None else can_join
                going = take(rows, logits)
                if len(going) < len(rows):
                    new_past.batch_select_indices(torch.tensor(going, dtype=torch.long, device=dev))
                    new_mask = new_mask[going]
                if going:
                    past, mask = _join(past, mask, new_past, new_mask)
                    live += [rows[j] for j in going]
                    nxt += [new_tokens[rows[j]][-1] for j in going]
                continue
            # 2. one token for every live row
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
            o = model(
                input_ids=torch.tensor(nxt, device=dev).unsqueeze(1),
                attention_mask=mask,
                position_ids=(mask.cumsum(-1) - 1)[:, -1:],
                past_key_values=past,
                use_cache=True,
                logits_to_keep=1,
                output_hidden_states=bool(capture),
            )
            past = o.past_key_values
            if grab is not None:  # the token each live row was fed
                grab.take(o, live, [slice(0, 1)] * len(live))
            # sampled where the logits are (a GPU: no |V|-wide copies)
            going = take(live, o.logits[:, -1, :].float())
            # 3. finished rows leave the cache, and columns no live row uses with them
            if len(going) < len(live):
                past.batch_select_indices(torch.tensor(going, dtype=torch.long, device=dev))
                mask = mask[going]
                live = [live[j] for j in going]
                if live:
                    mask = _trim(past, mask)
                else:
                    past = mask = None
            nxt = [new_tokens[b][-1] for b in live]
        if grab is not None:
            grab.close()
        results = []
        for b, st in enumerate(stoppers):
            res = Result(
                text=st.text(),
                num_tokens=len(new_tokens[b]),
                finished=st.reason != "length",
                nll=nll[b] / len(new_tokens[b]) if new_tokens[b] else None,
            )
            # a row's last sampled token is never fed: its feature does not exist
            if grab is not None:
                res.features = grab.rows(b)
                res.ids = (encoded[b] + new_tokens[b])[: res.features["f"].shape[0]]
                res.prompt_tokens = len(encoded[b])
            results.append(res)
        return results

    def _prefill(
        self, rows: list[int], encoded: list[list[int]], capture, grab
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """One forward over the rows' distinct prompts, left-padded (positions count real tokens
        only); rows that share a prompt (a pool prompt at each temperature, Alg. 1's one few-shot
        prefix) share its forward, and the cache, mask and logits are fanned out to every row."""
        dev, pad = self.target.device, self.target.tokenizer.pad_token_id
        distinct: dict[tuple[int, ...], int] = {}
        # row j reads forward row src[j]
        src = [distinct.setdefault(tuple(encoded[b]), len(distinct)) for b in rows]
        prompts = list(distinct)
        L = max(len(e) for e in prompts)
        ids = torch.full((len(prompts), L), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, e in enumerate(prompts):
            ids[j, L - len(e) :] = torch.tensor(e)
            mask[j, L - len(e) :] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        o = self.target.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            # the LM head only where we sample: L x |V| otherwise
            past_key_values=_roomy_cache(self.target.model),
            use_cache=True,
            logits_to_keep=1,
            output_hidden_states=bool(capture),
        )
        if grab is not None:
            grab.take(o, rows, [slice(L - len(encoded[b]), L) for b in rows], src)
        logits, past = o.logits[:, -1, :].float(), o.past_key_values
        if len(prompts) < len(rows):
            past.batch_select_indices(torch.tensor(src, dtype=torch.long, device=dev))
            mask, logits = mask[src], logits[src]
        return past, mask, logits


def _joinable(model: Any, cache: Any) -> bool:
    """Requests can join a running batch when every cache layer is a plain or sliding-window KV
    layer: left padding keeps each row's tokens contiguous and right-aligned, which both masks read
    the same way (chunked attention counts padded columns into its chunks, and other caches hold
    other state)."""
    kinds = set(getattr(getattr(model, "config", None), "layer_types", None) or ["full_attention"])
    layers = getattr(cache, "layers", None) or [None]
    return kinds <= {"full_attention", "sliding_attention"} and all(
        type(layer) in (DynamicLayer, DynamicSlidingWindowLayer, _RoomyLayer, _RoomySlidingLayer)
        for layer in layers
    )


def _pad_left(cache: Any, d: int) -> None:
    """Put ``d`` masked columns in front of every row of ``cache`` (a sliding layer keeps its last
    window − 1)."""
    for layer in cache.layers:
        add = d
        if isinstance(layer, DynamicSlidingWindowLayer):
            add = min(layer.cumulative_length + d, layer.sliding_window - 1) - layer.keys.shape[-2]
            layer.cumulative_length += d
        if add > 0:  # keys and values apart: their head sizes may differ (MLA)
            layer.keys, layer.values = (
                torch.cat([x.new_zeros((*x.shape[:2], add, x.shape[-1])), x], -2)
                for x in (layer.keys, layer.values)
            )


def _join(
    past: Any, mask: torch.Tensor | None, new_past: Any, new_mask: torch.Tensor
) -> tuple[Any, torch.Tensor]:
    """The running batch's cache and mask with the new rows appended, both left-padded to the
    longer."""
    if past is None:
        return new_past, new_mask
    L = max(mask.shape[1], new_mask.shape[1])
    _pad_left(past, L - mask.shape[1])
    _pad_left(new_past, L - new_mask.shape[1])
    for a, b in zip(past.layers, new_past.layers):
        a.keys, a.values = torch.cat([a.keys, b.keys]), torch.cat([a.values, b.values])
    mask = torch.cat([torch.nn.functional.pad(m, (L - m.shape[1], 0)) for m in (mask, new_mask)])
    return past, mask


def _trim(cache: Any, mask: torch.Tensor) -> torch.Tensor:
    """Drop the leading columns that are padding in every row (rows that held them have left):
    attention then runs over the live rows' span only."""
    k = int(mask.any(0).nonzero()[0])
    if k == 0:
        return mask
    for layer in cache.layers:
        if isinstance(layer, DynamicSlidingWindowLayer):
            layer.cumulative_length -= k
            keep = min(layer.cumulative_length, layer.sliding_window - 1)
            layer.keys, layer.values = layer.keys[:, :, -keep:], layer.values[:, :, -keep:]
        else:
            layer.keys, layer.values = layer.keys[:, :, k:], layer.values[:, :, k:]
    return mask[:, k:]


class _Roomy:
    """A KV cache layer whose keys and values sit in a buffer with spare columns after them, so a
    decode step writes its token's column in place instead of copying the whole cache
    (``DynamicLayer.update``'s ``torch.cat``: ~7 % of a 128-row distillation step, AMD host).
    ``keys``/``values`` read as views of the buffer. Assigning them a slice of the buffer (a trim)
    moves its bounds; anything else (padding, a join) copies into a fresh buffer; a row selection
    copies the buffer once."""

    room = 64  # spare columns per buffer: one copy every 64 decode steps

    def _buffered(self, name: str, x: torch.Tensor | None) -> None:
        # not initialized yet (None, or transformers' empty placeholder)
        if x is None or x.dim() < 3:
            self.__dict__[name] = (x, 0, 0)
            return
        buf = self.__dict__.get(name, (None,))[0]
        if (
            buf is not None
            and buf.dim() == x.dim()
            and x.shape[:-2] == buf.shape[:-2]
            and x.stride() == buf.stride()
            and x.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
        ):
            lo, extra = divmod(x.storage_offset() - buf.storage_offset(), buf.stride(-2))
            # columns of the buffer (a trim): no copy
            if extra == 0 and 0 <= lo and lo + x.shape[-2] <= buf.shape[-2]:
                self.__dict__[name] = (buf, lo, lo + x.shape[-2])
                return
        buf = x.new_empty((*x.shape[:-2], x.shape[-2] + self.room, x.shape[-1]))
        buf[..., : x.shape[-2], :] = x
        self.__dict__[name] = (buf, 0, x.shape[-2])

    def _view(self, name: str) -> torch.Tensor | None:
        buf, lo, hi = self.__dict__.get(name, (None, 0, 0))
        return buf if buf is None or buf.dim() < 3 else buf[..., lo:hi, :]

    keys = property(lambda self: self._view("_k"), lambda self, x: self._buffered("_k", x))
    values = property(lambda self: self._view("_v"), lambda self, x: self._buffered("_v", x))

    def _append(self, name: str, x: torch.Tensor, keep: int | None = None) -> torch.Tensor:
        """Write ``x``'s columns after the buffer's; return every column (old ones and ``x``); then
        keep only the last ``keep`` (a sliding window's)."""
        buf, lo, hi = self.__dict__[name]
        if buf is None or buf.dim() < 3:
            self._buffered(name, x)
        elif hi + x.shape[-2] > buf.shape[-2] or buf.shape[:-2] != x.shape[:-2]:
            self._buffered(name, torch.cat([buf[..., lo:hi, :], x], -2))
        else:
            buf[..., hi : hi + x.shape[-2], :] = x
            self.__dict__[name] = (buf, lo, hi + x.shape[-2])
        full = self._view(name)
        if keep is not None:
            buf, lo, hi = self.__dict__[name]
            self.__dict__[name] = (buf, max(lo, hi - keep), hi)
        return full

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices``: one copy of the buffer, room included."""
        for name in ("_k", "_v"):
            buf, lo, hi = self.__dict__[name]
            if buf is not None and buf.dim() >= 3:
                self.__dict__[name] = (buf[indices], lo, hi)


class _RoomyLayer(_Roomy, DynamicLayer):
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return self._append("_k", key_states), self._append("_v", value_states)


class _RoomySlidingLayer(_Roomy, DynamicSlidingWindowLayer):
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        # transformers' own path (assisted decoding); never taken by the engine
        if self.record_past:
            return super().update(key_states, value_states, *args, **kwargs)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        # as DynamicSlidingWindowLayer: return every column, cache the last window − 1
        keep = self.sliding_window - 1
        return self._append("_k", key_states, keep), self._append("_v", value_states, keep)


def _roomy_cache(model: Any) -> DynamicCache:
    """The model's own ``DynamicCache`` with its plain and sliding-window layers made
    :class:`_Roomy`."""
    cache = DynamicCache(config=model.config)
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
            cache.layers[i] = _RoomyLayer()
        elif type(layer) is DynamicSlidingWindowLayer:
            cache.layers[i] = _RoomySlidingLayer(sliding_window=layer.sliding_window)
    return cache


class _FeatureGrab:
    """The target's hidden states from the generating forwards (no second pass): the base model's
    output (last layer after the final norm, what the LM head reads) through a forward hook, and
    ``aux`` layers from ``output_hidden_states``. Kept per row on the CPU in the model's dtype."""

    def __init__(self, model: Any, aux: list[int], rows: int):
        self.aux, self.last = list(aux), None
        self.parts: list[dict[str, list[torch.Tensor]]] = [
            {"f": [], "aux": []} for _ in range(rows)
        ]
        self._hook = model.get_decoder().register_forward_hook(self._keep)

    def _keep(self, module, args, output) -> None:
        self.last = output[0] if isinstance(output, tuple) else output.last_hidden_state

    def take(
        self, out: Any, live: list[int], where: list[slice], src: list[int] | None = None
    ) -> None:
        """Row ``live[j]`` keeps positions ``where[j]`` of the forward's row ``src[j]`` (default
        j)."""
        for j, (b, sl) in enumerate(zip(live, where)):
            r = j if src is None else src[j]  # rows sharing a prompt were prefilled once
            self.parts[b]["f"].append(self.last[r, sl].cpu())
            if self.aux:
                self.parts[b]["aux"].append(
                    torch.cat([out.hidden_states[i][r, sl] for i in self.aux], -1).cpu()
                )

    def rows(self, b: int) -> dict[str, torch.Tensor]:
        got = {"f": torch.cat(self.parts[b]["f"])}
        if self.aux:
            got["aux"] = torch.cat(self.parts[b]["aux"])
        return got

    def close(self) -> None:
        self._hook.remove()


def _sample(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> int:
    """One row's token: :func:`_sample_rows` for a single row."""
    return _sample_rows(logits[None], [temperature], [top_p], [gen])[0]


def _sample_rows(
    logits: torch.Tensor,
    temperatures: list[float],
    top_ps: list[float],
    gens: list[torch.Generator],
) -> list[int]:
    """Each row of ``logits`` [rows, V] sampled with its own temperature, top-p and generator; T ≤ 0
    is argmax. Rows are batched by kind: the greedy rows' argmax, and each (T, top-p)'s softmax and
    CDF, run as one call each (per-row calls over a 262K vocabulary cost ~7 % of a 128-row
    distillation step, AMD host). Every row's result equals its own one-row computation: the
    reductions run along each row alone."""
    out = [0] * len(temperatures)
    groups: dict[tuple[float, float], list[int]] = {}
    for j, (t, p) in enumerate(zip(temperatures, top_ps)):
        groups.setdefault((0.0, 1.0) if t <= 0 else (t, p), []).append(j)
    for (t, p), rows in groups.items():
        x = logits[rows] if len(rows) < logits.shape[0] else logits
        if t <= 0:
            for j, tok in zip(rows, x.argmax(-1).tolist()):
                out[j] = tok
            continue
        # not renormalised: the draw scales by the total
        probs = top_p_filter(torch.softmax(x / t, dim=-1), p)
        # inverse CDF with one uniform draw per row: torch.multinomial over a 262K vocabulary cost
        # 5.5 ms a call on this CPU, more than the batched forward it follows (half the
        # distillation's wall time at T > 0) fp64: fp32 rounding near 1.0 would shift mass between
        # tail ids
        cdf = probs.cumsum(-1, dtype=torch.float64)
        total = cdf[:, -1]
        if not bool((torch.isfinite(total) & (total > 0)).all()):
            raise PolyspecError("sampling: the logits hold NaN/inf or no probability mass")
        u = torch.cat(
            [1.0 - torch.rand((1,), generator=gens[j], dtype=torch.float64) for j in rows]
        )
        # in (0, total]: a zero-probability id is never hit
        u = (u.to(cdf.device) * total).unsqueeze(-1)
        for j, tok in zip(
            rows, torch.searchsorted(cdf, u).squeeze(-1).clamp_(max=cdf.shape[-1] - 1).tolist()
        ):
            out[j] = tok
    return out


# --------------------------------------------------------------------------------------------- vLLM


class VLLMEngine:
    """vLLM offline inference on the target's token ids, run by :mod:`polyspec.vllm_process` (vLLM's
    own environment on CPU, ``make setup-vllm``; or ``pip install vllm`` beside polyspec on a GPU
    machine). ``target`` needs its tokenizer, and its weights too for ``capture``: vLLM returns
    tokens and logprobs, and the features a drafter trains on come from the target's prefill over
    prompt + answer (:func:`polyspec.features.prefill_features`, the corpus prefill's path), in the
    layout the transformers engine captures. ``llm`` may be passed in (tests use a fake with vLLM's
    API)."""

    def __init__(
        self,
        target: Any,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.9,
        enforce_eager: bool = False,
        llm: Any = None,
        sampling_params_cls: Any = None,
    ):
        if llm is None:
            from polyspec.vllm_process import RemoteLLM

            spec = target.spec
            llm = RemoteLLM(
                dict(
                    model=str(target.path or spec.model_id),
                    revision=None if target.path else spec.revision,
                    tensor_parallel_size=tensor_parallel_size,
                    dtype=dtype,
                    gpu_memory_utilization=gpu_memory_utilization,
                    trust_remote_code=spec.trust_remote_code,
                    enforce_eager=enforce_eager,
                    seed=0,
                )
            )
            sampling_params_cls = sampling_params_cls or llm.sampling_params_cls
        self.target = target
        self.llm = llm
        self.sampling_params_cls = sampling_params_cls
        self.stats = {
            "tokens": 0,
            "seconds": 0.0,
            "capture_seconds": 0.0,
            "version": getattr(getattr(llm, "process", None), "version", None),
        }

    def prompt(self, text: str) -> dict[str, list[int]]:
        """vLLM's ``TokensPrompt`` (a TypedDict) of a rendered prompt: the transformers engine's
        ids."""
        return {
            "prompt_token_ids": encode(self.target.spec.prompt_format, self.target.tokenizer, text)
        }

    def generate(self, requests: list[Request], capture: list[int] | None = None) -> list[Result]:
        if capture is not None and getattr(self.target, "model", None) is None:
            raise PolyspecError(
                "capture_features with engine.name=vllm needs the target's weights as well: the "
                "features come from its prefill over the answers (load it with_model=True)"
            )
        params = [
            self.sampling_params_cls(
                temperature=r.temperature,
                top_p=r.top_p,
                max_tokens=r.max_new_tokens,
                stop=list(r.stop) or None,
                seed=r.seed,
                logprobs=0,  # the sampled token's logprob only: cumulative_logprob gives Result.nll
            )
            for r in requests
        ]
        prompts = [self.prompt(r.prompt) for r in requests]
        t0 = time.perf_counter()
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        self.stats["seconds"] += time.perf_counter() - t0
        results, seqs = [], []
        for p, out in zip(prompts, outputs):  # vLLM returns outputs in request order
            c = out.outputs[0]
            n = len(c.token_ids)
            self.stats["tokens"] += n
            # raw (untempered) logprobs: vLLM's default logprobs_mode
            cum = getattr(c, "cumulative_logprob", None)
            results.append(
                Result(
                    text=c.text,
                    num_tokens=n,
                    finished=c.finish_reason == "stop",
                    nll=-cum / n if cum is not None and n else None,
                )
            )
            seqs.append(p["prompt_token_ids"] + list(c.token_ids))
        if capture is not None:
            self._capture(results, seqs, [len(p["prompt_token_ids"]) for p in prompts], capture)
        return results

    def _capture(
        self, results: list[Result], seqs: list[list[int]], starts: list[int], layers: list[int]
    ) -> None:
        """The target's features over each prompt + answer less its last token: a row's last sampled
        token is never fed to the target while generating, so the transformers engine's capture
        stops before it too."""
        t0 = time.perf_counter()
        fed = [ids[:-1] for ids in seqs]
        for r, ids, start, f in zip(
            results, fed, starts, prefill_features(self.target, fed, layers)
        ):
            r.ids, r.prompt_tokens, r.features = ids, start, f
        self.stats["capture_seconds"] += time.perf_counter() - t0

    def close(self) -> None:
        """Stops a vLLM process this engine started (a passed-in ``llm`` is the caller's)."""
        if hasattr(self.llm, "close"):
            self.llm.close()


def make_engine(cfg: Any, target: Any) -> Engine:
    """``cfg`` is a :class:`synth.config.EngineConfig`; transformers needs the target's weights,
    vLLM its tokenizer (and path or hub id)."""
    if cfg.name == "vllm":
        return VLLMEngine(
            target,
            tensor_parallel_size=cfg.tensor_parallel_size,
            dtype=cfg.dtype or "auto",
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enforce_eager=cfg.enforce_eager,
        )
    return TransformersEngine(target, batch_size=cfg.batch_size)


def engine_record(cfg: Any, engine: Engine) -> dict:
    """What a stage's stats.json says of the engine that ran: its name and, this session, the
    seconds of its generate calls (vLLM: also the prefill that captured features)."""
    st = getattr(engine, "stats", {}) or {}
    # milliseconds: a 4-prompt prefill on a fast CPU takes < 0.05 s and read 0.0 at 0.1 s
    return {
        "engine": cfg.name,
        "engine_seconds_this_session": round(st.get("seconds", 0.0), 3),
        **({"engine_version": st["version"]} if st.get("version") else {}),
        **(
            {"capture_seconds_this_session": round(st["capture_seconds"], 3)}
            if st.get("capture_seconds")
            else {}
        ),
    }


def open_engine(
    cfg: Any,
    target_name: str,
    target: Any = None,
    engine: Engine | None = None,
    need_model: bool = False,
) -> tuple[Any, Engine]:
    """The target (its weights for the transformers engine, or ``need_model``: vLLM's captured
    features) and its engine; given ones are kept."""
    if target is None:
        from polyspec.targets import load_target

        target = load_target(
            target_name,
            device=cfg.device,
            dtype=cfg.dtype,
            with_model=cfg.name != "vllm" or need_model,
        )
    if engine is None:
        engine = make_engine(cfg, target)
    return target, engine
