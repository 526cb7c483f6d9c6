"""The bundle's trained drafters as a draft source: chain, EAGLE-2 dynamic tree, ADASPEC Alg. 2
language and vocabulary switching, SPIDE dynamic draft length (methods ``chain``, ``tree``,
``adaspec``, ``spide``)."""

from __future__ import annotations

import torch

from decoder.drafts.adaptive import LanguageSelector
from decoder.drafts.ngram import PromptLookup
from decoder.drafts.runtimes import build_runtimes
from decoder.drafts.tables import SpideTable
from decoder.drafts.types import DecodeState, DraftSource, Proposal, Verified
from decoder.loop.runner import additive_mask
from decoder.loop.verify import sample
from decoder.options import DecodeOptions
from polyspec.drafter_kind import DrafterKind
from polyspec.errors import PolyspecError
from polyspec.lookup import MAX_NGRAM, earlier_occurrence
from vocab.masks import load_masks


class DrafterSource(DraftSource):
    """The bundle's drafters (EAGLE-1 / EAGLE-3 / small-LM) as chain, EAGLE-2 dynamic tree, ADASPEC
    or SPIDE.

    ADASPEC Alg. 2: the first language comes from the whole prompt (overlap at the largest size),
    the first size is S[0] (line 4); then every u generated tokens the last w choose (ℓ, s) (lines
    24–41) and the drafter and its reduced head switch (lines 42–44).

    ``lookup_runs`` (a ``PromptLookup(grow_to=)``; greedy only): where the verified text's last
    three tokens occurred earlier (prompt lookup's longest match: a loop or a copy is running), the
    step proposes prompt lookup's loop-aware chain instead of running the drafter — free, and as
    deep as the loop goes: such positions are most of a greedy answer, and there prompt lookup's
    chain keeps far more than a drafter's chain of γ (evidence:
    docs/experiments.md#results-adaspec-copies-the-answers-running-loops-with-prompt-lookup--now-faster-than-prompt-lookup-measured-2026-11-25-commit-ac33755).
    Every other step runs the drafter (which, reading prompt lookup's hint, ``eagle.lookup_hint``,
    learned when the weaker matches are worth copying)."""

    needs_feats = True

    def __init__(
        self,
        target,
        bundle,
        options: DecodeOptions,
        *,
        mode: str = "chain",
        adaptive: bool = False,
        spide_threshold: float | None = None,
        name: str = "drafter",
        lookup_runs: PromptLookup | None = None,
    ):
        """``options``: the decoder's, ``tree_nodes`` set; it reads γ (None: 4), the tree shape,
        ``gamma_max``, ``lang``, ``size``, ``vocab_lang`` and ADASPEC's ``window``/``step``/
        ``offset``. ``spide_threshold``: SPIDE's (None: no SPIDE table, chains of γ)."""
        o = options
        lang, size, vocab_lang = o.lang, o.size, o.vocab_lang
        self.name, self.mode, self.adaptive = name, mode, adaptive
        self.tree_capable = mode == "tree"
        self.runs = lookup_runs
        self.gamma, self.depth, self.topk, self.nodes = (
            o.gamma or 4,
            o.tree_depth,
            o.tree_topk,
            o.tree_nodes,
        )
        self.gamma_max, self.spide_threshold = o.gamma_max, spide_threshold
        # learns online, across requests
        self.spide = SpideTable() if spide_threshold is not None else None
        self.device = target.model.get_output_embeddings().weight.device
        self.vocab_size = int(target.model.get_output_embeddings().weight.shape[0])
        self.dtype = target.model.get_output_embeddings().weight.dtype
        langs, sizes = bundle.languages, bundle.vocab_sizes
        for what, value in (("lang", lang), ("vocab_lang", vocab_lang)):
            if value not in (None, "auto") and value not in langs:
                raise PolyspecError(f"{what} {value!r} is not in the bundle ({', '.join(langs)})")
        if size not in ("auto", "full"):
            try:
                size = int(size)
            except (TypeError, ValueError):
                raise PolyspecError(
                    f"size must be auto, full or one of {sizes}, not {size!r}"
                ) from None
            if size not in sizes:
                raise PolyspecError(f"size {size} is not one of the bundle's sizes {sizes}")
        self.fixed_lang = None if lang == "auto" else lang
        self.size_opt, self.vocab_lang = (
            size,
            (None if vocab_lang in (None, "auto") else vocab_lang),
        )
        self.runtimes, self.banks = build_runtimes(bundle, target, self.device)
        first = next(iter(self.runtimes.values()))
        d = getattr(first, "drafter", None)
        self.aux_layers = list(d.aux_layers) if DrafterKind.of(d) is DrafterKind.EAGLE3 else None
        if self.aux_layers and self.vocab_lang:
            raise PolyspecError(
                "vocab_lang needs EAGLE-1 or small-LM drafters (EAGLE-3 heads cover their own "
                "language)"
            )
        mask, _, _ = load_masks(bundle.masks_file())
        a = bundle.manifest["adaptive"]
        self.selector_args = dict(
            mask=mask,
            languages=langs,
            sizes=sizes,
            window=o.window or a["window"],
            step=o.step or a["step"],
            offset=a["offset"] if o.offset is None else o.offset,
        )
        self.lang = self.size = self.selector = None
        # this request's prompt, and its heads per (language, head language, size)
        self.prompt_ids, self._heads = [], {}

    # ADASPEC Alg. 2 -------------------------------------------------------------------------------
    def begin(self, ctx: DecodeState) -> None:
        for rt in self.runtimes.values():
            rt.reset()
        self.prompt_ids, self._heads = ctx.tokens[: ctx.prompt_len], {}
        if self.runs is not None:
            self.runs.begin(ctx)
        self.selector = LanguageSelector(
            **self.selector_args,
            fixed_lang=self.fixed_lang,
            fixed_size=self.size_opt if isinstance(self.size_opt, int) else None,
        )
        if self.fixed_lang:
            lang = self.fixed_lang
        else:
            probe = LanguageSelector(
                **{**self.selector_args, "offset": 0.0}, fixed_size=max(self.selector.sizes)
            )
            lang = probe.choose(self.prompt_ids)[0]
        size = self.size_opt if isinstance(self.size_opt, int) else min(self.selector.sizes)
        self.lang, self.size = lang, (None if self.size_opt == "full" else size)

    @property
    def max_nodes(self) -> int | None:
        """With loop runs, the most tokens one step may propose (a run goes deeper than γ or the
        tree's nodes); None: the decoder's default bound."""
        if self.runs is None:
            return None
        return max(self.nodes, self.gamma, self.gamma_max, self.runs.grow_to or self.runs.gamma)

    def update(self, ctx: DecodeState, v: Verified) -> None:
        if self.runs is not None:
            self.runs.update(ctx, v)  # a loop run kept whole: the next one goes twice as deep
        self.advance(ctx, v.kept)

    def advance(self, ctx: DecodeState, kept: int) -> None:
        """``kept`` more tokens were verified (``ctx.tokens`` holds them): ADASPEC Alg. 2 lines
        24–44, every u generated tokens the last w choose the drafter language and vocabulary
        size."""
        if self.adaptive and self.selector.due(kept):
            lang, size = self.selector.choose(
                ctx.tokens[ctx.prompt_len :][-self.selector.window :]
            )[:2]
            self.lang, self.size = lang, (None if self.size_opt == "full" else size)

    def head(self):
        """The drafting head of the current (language, size): the ranked block, with this request's
        prompt ids among its rows (built once per request and key)."""
        key = (self.lang, self.vocab_lang or self.lang, self.size)
        if key not in self._heads:
            self._heads[key] = self.banks[self.lang].head(
                key[1], self.size, prompt_ids=self.prompt_ids
            )
        return self._heads[key]

    # drafting -------------------------------------------------------------------------------------
    def propose(self, ctx: DecodeState) -> Proposal:
        run = self.loop_run(ctx)
        if run.tokens:
            return run
        if self.mode == "tree" and ctx.tree_ok:
            return self.draft_tree(ctx)
        gamma = min(self.gamma_max if self.spide is not None else self.gamma, ctx.max_depth)
        tokens, qs, _ = self.draft_chain(ctx, gamma, self.spide_threshold)
        return Proposal.chain(
            tokens, self.name, qs if ctx.temperature > 0 else None, self.lang, self.size
        )

    def loop_run(self, ctx: DecodeState) -> Proposal:
        """Prompt lookup's chain where the verified text's last ``MAX_NGRAM`` tokens occurred
        earlier (greedy, ``lookup_runs``); else nothing. The drafter does not run: its cache catches
        up at its next step (``sync``)."""
        if self.runs is None or ctx.temperature > 0 or ctx.max_depth < 1:
            return Proposal()
        found = earlier_occurrence(ctx.tokens[: ctx.pend + 1], MAX_NGRAM, MAX_NGRAM)
        if found is None:
            return Proposal()
        return Proposal.chain(
            self.runs.propose(ctx).tokens, self.runs.name, None, self.lang, self.size
        )

    def draft_chain(self, ctx: DecodeState, gamma: int, threshold: float | None = None):
        """Up to γ tokens one by one; with a threshold, stop once the estimated probability that the
        next draft survives (SPIDE: Π rate(confidence)) falls under it. → (tokens, q per token when
        sampling, confidences)."""
        rt, head = self.runtimes[self.lang], self.head()
        self.confs = []
        if gamma < 1:
            return [], [], []
        parent = rt.sync(ctx.tokens, ctx.feats, ctx.pend)
        drafts, qs, alive = [], [], 1.0
        for i in range(gamma):
            lg = head.logits(parent)
            if threshold is not None:
                conf = float(torch.softmax(lg.float(), -1).max())
                alive *= self.spide.rate(conf)
                if i > 0 and alive < threshold:
                    break
                self.confs.append(conf)
            if ctx.temperature > 0:
                q = torch.softmax(lg.float() / ctx.temperature, dim=-1)
                j = sample(q, ctx.gen)
                q_full = torch.zeros(self.vocab_size, dtype=torch.float32, device=q.device)
                q_full[head.ids if head.ids is not None else slice(None)] = q
                qs.append(q_full)
            else:
                j = int(lg.argmax())
            drafts.append(int(head.to_full(torch.tensor(j, device=lg.device))))
            # entry for draft i at position pend+1+i, fed the previous predicted feature
            if i < gamma - 1:
                pos = torch.tensor([ctx.pend + 1 + i], device=self.device)
                parent = rt.extend(
                    torch.tensor([drafts[-1]], device=self.device),
                    parent.view(1, -1),
                    pos,
                    prefixes=[ctx.tokens[: ctx.pend + 1] + drafts],
                )[-1]
        rt.rollback()
        return drafts, qs, self.confs

    def learn_lengths(self, v: Verified) -> None:
        """SPIDE's table: drafts 0..accepted-1 kept, draft ``accepted`` rejected (later ones not
        judged)."""
        if self.spide is not None and self.confs:
            n = 0
            for i in v.path[1:]:  # this drafter's chain nodes on the kept branch, from the root
                if self.name not in v.origin[i - 1].split("+"):
                    break
                n += 1
            self.spide.update(self.confs, n)

    def draft_tree(self, ctx: DecodeState) -> Proposal:
        """EAGLE-2 dynamic tree (greedy): expand the top-k nodes of each level by cumulative
        log-probability, keep the best ``nodes`` nodes with their ancestors, parents first."""
        rt, head = self.runtimes[self.lang], self.head()
        root_hidden = rt.sync(ctx.tokens, ctx.feats, ctx.pend)
        dev = self.device
        tok, parent, score, depth = [], [], [], []  # per node; parent -1 = root
        hidden: dict[int, torch.Tensor] = {}  # node → drafter output (its children's logits)
        slot: dict[int, int] = {}  # node → index among the drafter's draft entries
        lp = torch.log_softmax(head.logits(root_hidden).float(), -1)
        v, j = lp.topk(min(self.topk, lp.shape[-1]))
        frontier = []
        for s, jj in zip(v.tolist(), head.to_full(j).tolist()):
            frontier.append(len(tok))
            tok.append(jj), parent.append(-1), score.append(s), depth.append(1)
        max_depth = max(1, min(self.depth, ctx.max_depth))
        for d in range(1, max_depth):
            expand = sorted(frontier, key=lambda n: -score[n])[: self.topk]
            base = rt.cache.get_seq_length()
            # the drafter entry of a node sees verified entries, its ancestors' entries and itself
            anc = [[slot[a] for a in _ancestors(n, parent)] for n in expand]
            n_prev = len(slot)
            verified = base - n_prev
            for i, n in enumerate(expand):
                slot[n] = n_prev + i
            m = torch.zeros((len(expand), base + len(expand)), dtype=torch.bool)
            m[:, :verified] = True
            for i, chain in enumerate(anc):
                m[i, [verified + c for c in chain]] = True
                m[i, base + i] = True
            mask = additive_mask(m, self.dtype, dev)
            par_h = torch.stack(
                [root_hidden if parent[n] < 0 else hidden[parent[n]] for n in expand]
            )
            pos = torch.full((len(expand),), ctx.pend + d, device=dev)
            verified_ids = ctx.tokens[: ctx.pend + 1]
            out = rt.extend(
                torch.tensor([tok[n] for n in expand], device=dev),
                par_h,
                pos,
                mask,
                prefixes=[
                    verified_ids + [tok[a] for a in reversed(_ancestors(n, parent))] + [tok[n]]
                    for n in expand
                ],
            )
            frontier = []
            lps = torch.log_softmax(head.logits(out).float(), -1)
            v, j = lps.topk(min(self.topk, lps.shape[-1]), dim=-1)
            full = head.to_full(j)
            for i, n in enumerate(expand):
                hidden[n] = out[i]
                for s, jj in zip(v[i].tolist(), full[i].tolist()):
                    frontier.append(len(tok))
                    (
                        tok.append(jj),
                        parent.append(n),
                        score.append(score[n] + s),
                        depth.append(d + 1),
                    )
        rt.rollback()
        keep = set(sorted(range(len(tok)), key=lambda n: -score[n])[: self.nodes])
        for n in list(keep):
            p = parent[n]
            while p >= 0 and p not in keep:
                keep.add(p)
                p = parent[p]
        order = sorted(keep, key=lambda n: (depth[n], n))
        index = {n: i for i, n in enumerate(order)}
        return Proposal(
            [tok[n] for n in order],
            [-1 if parent[n] < 0 else index[parent[n]] for n in order],
            [self.name] * len(order),
            None,
            self.lang,
            self.size,
        )


def _ancestors(n: int, parent: list[int]) -> list[int]:
    """Node n's ancestors in a draft tree, nearest first."""
    out, p = [], parent[n]
    while p >= 0:
        out.append(p)
        p = parent[p]
    return out


class SpideSource(DrafterSource):
    """SPIDE: chain drafting whose length follows the confidence → acceptance table."""

    def update(self, ctx: DecodeState, v: Verified) -> None:
        self.learn_lengths(v)
        super().update(ctx, v)
