"""Drafters at decode time: EAGLE-style (reads the target's features) and small-LM, with reduced
heads.

Both keep their own KV cache and follow one protocol, so chain, tree and ADASPEC drive them alike:

- ``sync(tokens, feats, pending)`` catches up on every verified position the drafter has not seen
  yet (a drafter switched in by ADASPEC Alg. 2 line 43 catches up in one forward) and returns the
  hidden state whose head logits propose the token after ``pending``;
- ``extend(tokens, parent_hidden, positions, mask)`` runs draft tokens (one for chain, a tree level
  for tree) and returns their hidden states;
- ``rollback()`` drops every draft entry again (only verified positions stay cached).

Reduced heads (ADASPEC's "vocabulary simplification"; ADASPEC Alg. 2 lines 5/44): for each language
the rows of the drafter's head for its ranked ids are gathered once up to the largest size S; size s
is the view ``rows[:s]`` of that block, so switching size or language reallocates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from polyspec.drafter_kind import DrafterKind
from polyspec.errors import PolyspecError
from polyspec.lookup import entry_hints, hint_inputs, lookup_hints


@dataclass
class Head:
    """A drafting head: logits = h @ weight.T over ``ids`` (None = the full vocabulary)."""

    weight: torch.Tensor  # [s, H]
    ids: torch.Tensor | None  # [s (+ extra)] full-vocabulary ids of the rows
    softcap: float | None = None
    pre: object = None  # EAGLE-3: the drafter's final norm, applied before its head
    extra: torch.Tensor | None = None  # [e, H] rows added after ``weight`` (a request's prompt ids)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        if self.pre is not None:
            h = self.pre(h)
        h = h.to(self.weight.dtype)
        out = h @ self.weight.T
        if self.extra is not None:
            out = torch.cat([out, h @ self.extra.T], dim=-1)
        out = out.float()
        if self.softcap:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out

    def to_full(self, j: torch.Tensor) -> torch.Tensor:
        return j if self.ids is None else self.ids[j]

    @property
    def size(self) -> int:
        return int(self.weight.shape[0]) + (0 if self.extra is None else int(self.extra.shape[0]))


class HeadBank:
    """Per-language row blocks of one head matrix; ``head(lang, s)`` is a view, ``s=None`` the full
    head.

    An EAGLE-3 drafter owns a head over its draft vocabulary only (rows already in rank order): its
    bank has that one block (``draft_ids``), and sizes above it (or ``full``) use the whole
    block."""

    def __init__(
        self,
        weight: torch.Tensor,
        ranked: dict[str, torch.Tensor],
        max_size: int,
        softcap=None,
        draft_ids: tuple[str, torch.Tensor] | None = None,
        pre=None,
    ):
        self.full, self.blocks = None, {}
        if draft_ids is not None:
            lang, ids = draft_ids
            self.blocks[lang] = Head(weight, ids.to(weight.device), None, pre)
            return
        self.full = Head(weight, None, softcap)
        for lang, ids in ranked.items():
            ids = ids[:max_size].to(weight.device)
            self.blocks[lang] = Head(weight.index_select(0, ids).contiguous(), ids, softcap)

    def head(self, lang: str, size: int | None, prompt_ids: list[int] | None = None) -> Head:
        """``prompt_ids``: a request's prompt — its ids that rank below ``size`` replace the
        lowest-ranked others (``vocab.files.with_prompt_ids``: still at most ``size`` rows; the
        ranked block stays a view, the added rows are gathered once per request). Not for EAGLE-3
        heads, which have rows for their draft vocabulary only."""
        if size is None and self.full is not None:
            return self.full
        if lang not in self.blocks:
            raise PolyspecError(
                f"this drafter's head has no rows for {lang!r} (EAGLE-3 heads cover their own "
                "language)"
            )
        b = self.blocks[lang]
        size = b.size if size is None else min(size, b.size)
        if prompt_ids and self.full is not None:
            from vocab.files import with_prompt_ids

            ids, added = with_prompt_ids(b.ids[:size].cpu().numpy(), size, prompt_ids)
            if added:
                k, ids = len(ids) - added, torch.as_tensor(ids, device=b.ids.device)
                return Head(
                    b.weight[:k], ids, b.softcap, b.pre, self.full.weight.index_select(0, ids[k:])
                )
        return Head(b.weight[:size], b.ids[:size], b.softcap, b.pre)


class _CachedRuntime:
    """What both runtimes share: verified entries cached once (``sync``), drafts run on top."""

    @torch.inference_mode()
    def sync(self, tokens: list[int], feats: torch.Tensor | None, pending: int) -> torch.Tensor:
        if self.done < pending:
            h = self._catch_up(tokens, feats, pending)
            self.done, self.last = pending, h[-1]
        return self.last

    @torch.inference_mode()
    def extend(
        self,
        tokens: torch.Tensor,
        parent_hidden: torch.Tensor,
        positions: torch.Tensor,
        mask=None,
        prefixes: list[list[int]] | None = None,
    ):
        """``prefixes``: for a hinted drafter, each draft entry's token prefix (verified tokens, the
        draft's ancestors, the draft itself)."""
        hints = self._draft_hints(prefixes, tokens.device)
        return self._run(tokens, parent_hidden, positions.view(1, -1), mask, hints)

    def _draft_hints(self, prefixes: list[list[int]] | None, device):
        """The draft entries' prompt-lookup hint inputs; None: this drafter reads none."""
        return None


class EagleRuntime(_CachedRuntime):
    """Entry p = [embed(x_p) ‖ f_{p-1}] at position p → f̂_p, whose head logits propose x_{p+1}."""

    kind = "eagle"

    def __init__(self, drafter, embed, head_weight, softcap=None):
        from transformers import DynamicCache

        self.drafter, self.embed = drafter, embed
        self.head_weight, self.softcap = head_weight, softcap
        self._cache_cls = DynamicCache
        self.reset()

    def reset(self) -> None:
        self.cache = self._cache_cls()
        self.done = 0  # entries 1..done are cached (all verified)
        self.last = None  # f̂ of entry `done`

    @property
    def hinted(self) -> bool:
        """Entries read the prompt-lookup hint of their token prefix (``eagle.lookup_hint``,
        ``polyspec.lookup``)."""
        return bool(getattr(self.drafter, "lookup_hint", False))

    def _catch_up(self, tokens: list[int], feats: torch.Tensor, pending: int) -> torch.Tensor:
        """The hidden states of entries done+1..pending, run as one forward."""
        p = torch.arange(self.done + 1, pending + 1, device=feats.device)
        x = torch.as_tensor(tokens[self.done + 1 : pending + 1], device=feats.device)
        hints = None
        # entry q reads the hint of tokens[..q]: a few entries one scan each, a prompt in one pass
        if self.hinted:
            if pending - self.done <= 8:
                hints = entry_hints(
                    self.embed,
                    [tokens[: q + 1] for q in range(self.done + 1, pending + 1)],
                    feats.device,
                )
            else:
                ids, n = (
                    torch.tensor([v[self.done + 1 : pending + 1]], device=feats.device)
                    for v in lookup_hints(tokens[: pending + 1])
                )
                hints = hint_inputs(self.embed, ids, n)
        return self._run(x, feats[p - 1], p.view(1, -1), None, hints)

    def _draft_hints(self, prefixes: list[list[int]] | None, device):
        """The draft entries' prompt-lookup hint inputs (None for a drafter without hints)."""
        if not self.hinted:
            return None
        if prefixes is None:
            raise PolyspecError(
                "this drafter reads prompt-lookup hints: extend() needs each draft's prefix"
            )
        return entry_hints(self.embed, prefixes, device)

    def _run(self, tokens, feats, positions, mask, hints=None):
        emb = self.embed(tokens.view(1, -1))
        kw = {} if hints is None else {"hints": hints}
        out, self.cache = self.drafter(
            emb,
            feats.view(1, -1, feats.shape[-1]),
            position_ids=positions,
            attention_mask=mask,
            past_key_values=self.cache,
            use_cache=True,
            **kw,
        )
        return out[0]

    def rollback(self) -> None:
        extra = self.cache.get_seq_length() - self.done
        if extra > 0:
            self.cache.crop(-extra)


class SmallLMRuntime(_CachedRuntime):
    """A causal LM over the token stream: entry p = x_p; its hidden state proposes x_{p+1}."""

    kind = "small-lm"

    def __init__(self, model):
        from transformers import DynamicCache

        self.model, self.base = model, model.get_decoder()
        self.head_weight, self.softcap = model.get_output_embeddings().weight, None
        self._cache_cls = DynamicCache
        self.reset()

    def reset(self) -> None:
        self.cache = self._cache_cls()
        self.done = -1  # tokens 0..done are cached
        self.last = None

    def _catch_up(self, tokens: list[int], feats, pending: int) -> torch.Tensor:
        """The hidden states of tokens done+1..pending, run as one forward."""
        dev = self.head_weight.device
        p = torch.arange(self.done + 1, pending + 1, device=dev)
        x = torch.as_tensor(tokens[self.done + 1 : pending + 1], device=dev)
        return self._run(x, None, p.view(1, -1), None)

    def _run(self, tokens, feats, positions, mask, hints=None):
        """``feats`` and ``hints`` are not read: a small LM reads its tokens alone."""
        out = self.base(
            input_ids=tokens.view(1, -1),
            position_ids=positions,
            attention_mask=mask,
            past_key_values=self.cache,
            use_cache=True,
        )
        return out.last_hidden_state[0]

    def rollback(self) -> None:
        extra = self.cache.get_seq_length() - (self.done + 1)
        if extra > 0:
            self.cache.crop(-extra)


def build_runtimes(bundle, target, device) -> tuple[dict, dict[str, HeadBank]]:
    """Load every drafter of a bundle (safetensors, via ``polyspec.drafter_models.load_drafter``)
    and its head bank."""
    from polyspec.drafter_models import load_drafter
    from polyspec.packed import pack_linears

    max_size = max(bundle.vocab_sizes)
    ranked = {
        lang: torch.as_tensor(bundle.ranked(lang).ranked_ids).long() for lang in bundle.languages
    }
    runtimes, banks = {}, {}
    softcap = getattr(target.model.config, "final_logit_softcapping", None)
    dtype = target.model.get_output_embeddings().weight.dtype
    shared_bank, archs = None, set()
    for lang in bundle.languages:
        model, _ = load_drafter(bundle.drafter_dir(lang), device=device)
        model.to(dtype).requires_grad_(False)
        # CPU bf16/fp32: oneDNN-prepacked weights, as the target's (polyspec.packed)
        pack_linears(model)
        kind = DrafterKind.of(model)
        archs.add(kind)
        if kind is DrafterKind.EAGLE3:  # own head over its draft vocabulary
            rt = EagleRuntime(model, target.model.get_input_embeddings(), model.lm_head.weight)
            banks[lang] = HeadBank(
                model.lm_head.weight.detach(),
                {},
                0,
                draft_ids=(lang, model.draft_ids),
                pre=model.norm,
            )
        elif bundle.manifest["drafter_type"] == "eagle":
            rt = EagleRuntime(
                model,
                target.model.get_input_embeddings(),
                target.model.get_output_embeddings().weight,
                softcap,
            )
            if shared_bank is None:  # the frozen target head is the same for every language
                shared_bank = HeadBank(rt.head_weight.detach(), ranked, max_size, softcap)
            banks[lang] = shared_bank
        else:
            rt = SmallLMRuntime(model)
            banks[lang] = HeadBank(rt.head_weight.detach(), ranked, max_size)
        runtimes[lang] = rt
    if len(archs) != 1:
        raise PolyspecError(
            f"bundle {bundle.root} mixes drafter forms {sorted(k.value for k in archs)}; one form "
            "per bundle"
        )
    return runtimes, banks


def aux_layers(runtimes: dict) -> list[int] | None:
    """The target layers EAGLE-3 drafters read (None for EAGLE-1 and small-LM drafters)."""
    first = next(iter(runtimes.values()))
    return (
        list(first.drafter.aux_layers)
        if DrafterKind.of(getattr(first, "drafter", None)) is DrafterKind.EAGLE3
        else None
    )
