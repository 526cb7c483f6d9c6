"""Draft sources: everything that proposes tokens for the target to verify, behind one small interface.

    src = build_source("pld", target, bundle=None, gamma=10)
    src.begin(ctx)                 # a new request (prompt in ctx.tokens); tables that learn online persist
    prop = src.propose(ctx)        # → Proposal: a tree (a chain is a tree whose parents are -1, 0, 1, …)
    …one target forward verifies it (decoder.core)…
    src.update(ctx, verified)      # what the target kept, and its own predictions from that same forward

Modelled on transformers' ``candidate_generator.py`` (get_candidates / update_candidate_strategy): the decoding
loop in ``decoder.core`` knows nothing of how a source drafts; it verifies whatever tree a source proposes.

Implementations (``build_source`` is the factory; method names as in ``decoder.core.METHODS``):
- ``PromptLookup`` (``pld``): the longest recent n-gram that occurred earlier proposes what followed it;
- ``TokenRecycling`` (``ngram-tree``): Token Recycling / UNISPEC adjacency tree (``decoder.ngram``);
- ``SpectraSource`` (``spectra``): SPECTRA CORE + RETRIEVAL (seed 002, ``decoder.spectra``);
- ``DrafterSource`` (``chain``, ``tree``, ``adaspec``, ``spide``): the bundle's trained drafters, EAGLE-2
  dynamic tree or chain, ADASPEC Alg. 2 language/vocabulary switching, SPIDE dynamic length; ``adaspec``
  copies a running loop with prompt lookup instead of the drafter (``lookup_runs``);
- ``HybridSource`` (``hybrid``): one tree merging a loop-aware prompt lookup chain, SPECTRA's guesses within the
  device's flat-verify budget and, on steps where prompt lookup found no match, the drafter's chain; the drafter
  runs only while it pays for itself (measured online).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from decoder.ngram import SpideTable, TokenRecycler, prompt_lookup
from decoder.runner import additive_mask
from decoder.verify import sample, topk
from polyspec.errors import PolyspecError
from polyspec.lookup import MAX_NGRAM, earlier_occurrence


# ---------------------------------------------------------------------------------------- data types
@dataclass
class Proposal:
    """Draft nodes to verify after the pending token. ``parents[i]``: index of node i's parent among the
    nodes, -1 for a child of the pending token (parents always come before children).
    ``q[i]`` (sampling, chains only): the full-vocabulary distribution node i was drawn from."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    origin: list[str] = field(default_factory=list)  # which source proposed each node (hybrid accounting)
    q: list[torch.Tensor] | None = None
    lang: str | None = None
    vocab_size: int | None = None

    @classmethod
    def chain(cls, tokens: list[int], origin: str, q=None, lang=None, vocab_size=None) -> Proposal:
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), [origin] * len(tokens), q, lang, vocab_size)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @property
    def depth(self) -> list[int]:
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def first_chain(self) -> Proposal:
        """The branch through each node's first child (sources list their best guess first)."""
        keep, want = [], -1
        for i, p in enumerate(self.parents):
            if p == want:
                keep.append(i)
                want = i
        return Proposal([self.tokens[i] for i in keep], list(range(-1, len(keep) - 1)),
                        [self.origin[i] for i in keep], None, self.lang, self.vocab_size)


@dataclass
class DecodeState:
    """What a source may read. ``tokens[pend]`` is the pending token (emitted, not yet in the target's cache);
    ``feats[p]`` the target's features at verified position p (EAGLE drafters read them)."""

    tokens: list[int]
    feats: torch.Tensor
    prompt_len: int
    pend: int = 0
    max_depth: int = 0  # drafts past this would overrun max_new_tokens
    tree_ok: bool = True  # False: sampling, or the tree would cross a sliding window → propose a chain
    temperature: float = 0.0
    gen: torch.Generator | None = None
    step_s: float = 0.0  # running mean of one verification forward (s), for cost-aware sources


@dataclass
class Verified:
    """One verification forward. ``inputs`` = [pending, *nodes]; ``parents`` index into inputs (-1 for the
    pending token); ``logits`` [n, V] of the target after each input; ``path`` = indices into inputs of the
    accepted branch (starts with 0); ``kept`` = tokens emitted after stopping rules; ``verify_s`` seconds."""

    inputs: list[int]
    parents: list[int]
    logits: torch.Tensor
    path: list[int]
    origin: list[str]
    kept: int = 0
    verify_s: float = 0.0
    _top: tuple | None = None

    @property
    def accepted(self) -> int:
        return len(self.path) - 1

    def proposed_by(self, name: str) -> int:
        """Nodes of this step that source ``name`` proposed (merged nodes name every proposer: "a+b")."""
        return sum(1 for o in self.origin if name in o.split("+"))

    def kept_from(self, name: str) -> int:
        """Nodes on the kept branch that source ``name`` proposed."""
        return sum(1 for i in self.path[1:] if name in self.origin[i - 1].split("+"))

    def top(self, k: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """(rows, ids [r, k], confidences [r, k]) of the target's top-k next tokens after the inputs of the kept
        branch (``rows`` = ``path``: off-branch rows follow rejected tokens, and ranking them all would cost
        as much as a forward at 262K ids). Confidences are softmax-normalised over the top k (no pass over the
        whole vocabulary); they rank and prune guesses, which the target verifies anyway. Computed once per
        step and shared by every source that learns from it."""
        if self._top is None or self._top[1].shape[1] < k:
            v, j = topk(self.logits[self.path], k)
            self._top = (self.path, j, torch.softmax(v.float(), -1))
        return self._top[0], self._top[1][:, :k], self._top[2][:, :k]


class DraftSource:
    """The interface. ``propose`` must respect ``ctx.max_depth`` and return a chain when ``not ctx.tree_ok``."""

    name = "source"
    needs_feats = False

    def begin(self, ctx: DecodeState) -> None:
        """A new request; ``ctx.tokens`` is the prompt plus the first pending token."""

    def propose(self, ctx: DecodeState) -> Proposal:
        raise NotImplementedError

    def update(self, ctx: DecodeState, v: Verified) -> None:
        """After the step: ``ctx.tokens`` already holds the kept tokens (the new pending one last)."""


# ------------------------------------------------------------------------------------ n-gram sources
class PromptLookup(DraftSource):
    """PLD (transformers' ``prompt_lookup_num_tokens``): the most recent earlier occurrence of the longest
    suffix n-gram (n = 3..1) proposes the ``gamma`` tokens that followed it.

    ``grow_to`` (the hybrid's lookup; ``pld`` itself stays transformers' method): a loop-aware variant — the copy
    runs on into its own proposal when the loop's period is shorter than the depth (``prompt_lookup(extend=)``),
    and after a step that kept the whole chain the next one is twice as deep, up to ``grow_to``; any rejection
    resets it to ``gamma``. The base model's greedy loops are where PLD's whole chains get kept."""

    name = "pld"

    def __init__(self, gamma: int = 10, max_ngram: int = 3, grow_to: int | None = None):
        self.gamma, self.max_ngram, self.grow_to = gamma, max_ngram, grow_to
        self.depth = gamma

    def begin(self, ctx: DecodeState) -> None:
        self.depth = self.gamma

    def propose(self, ctx: DecodeState) -> Proposal:
        g = min(self.depth, ctx.max_depth)
        tokens = prompt_lookup(ctx.tokens[: ctx.pend + 1], g, self.max_ngram, extend=self.grow_to is not None) if g > 0 else []
        return Proposal.chain(tokens, self.name)

    def update(self, ctx: DecodeState, v: Verified) -> None:
        if self.grow_to is None:
            return
        proposed = v.proposed_by(self.name)
        whole = proposed > 0 and v.kept_from(self.name) >= proposed
        self.depth = min(2 * self.depth, self.grow_to) if whole else self.gamma


class TokenRecycling(DraftSource):
    """Token Recycling / UNISPEC confidence tree from an adjacency matrix refreshed by every verification."""

    name = "ngram-tree"

    def __init__(self, vocab_size: int, k: int = 8, nodes: int = 12, first_width: int = 8, width: int = 4,
                 depth: int = 4, threshold: float = 0.02, gamma: int = 4):
        self.recycler = TokenRecycler(vocab_size, k)
        self.nodes, self.first_width, self.width, self.depth = nodes, first_width, width, depth
        self.threshold, self.gamma = threshold, gamma

    def propose(self, ctx: DecodeState) -> Proposal:
        root = ctx.tokens[ctx.pend]
        if not ctx.tree_ok:  # follow the top-1 edges
            out, t = [], root
            for _ in range(min(self.gamma, ctx.max_depth)):
                t = int(self.recycler.adj[t, 0])
                if t < 0:
                    break
                out.append(t)
            return Proposal.chain(out, self.name)
        tok, parent, _ = self.recycler.tree(root, self.nodes, self.first_width, self.width,
                                            min(self.depth, ctx.max_depth + 1), self.threshold)
        return Proposal(tok, parent, [self.name] * len(tok))

    def update(self, ctx: DecodeState, v: Verified) -> None:
        rows, ids, probs = v.top(self.recycler.k)  # the kept branch's inputs teach their rows
        self.recycler.set_rows([v.inputs[i] for i in rows], ids, probs)


class SpectraSource(DraftSource):
    """SPECTRA (seed 002): CORE's forward/backward n-gram guesses first, RETRIEVAL's fill the budget."""

    name = "spectra"

    def __init__(self, spectra, nodes: int = 12, topk: int = 8):
        self.spectra, self.nodes, self.topk = spectra, nodes, topk

    def begin(self, ctx: DecodeState) -> None:
        self.spectra.observe(ctx.tokens[: ctx.prompt_len])  # the prompt is known text (Alg. 1 line 3)

    def propose(self, ctx: DecodeState) -> Proposal:
        if ctx.max_depth < 1:
            return Proposal()
        tok, parent = self.spectra.propose(ctx.tokens[: ctx.pend + 1], self.nodes, ctx.max_depth)
        p = Proposal(list(tok), list(parent), [self.name] * len(tok))
        return p if ctx.tree_ok else p.first_chain()

    def update(self, ctx: DecodeState, v: Verified) -> None:
        rows, ids, probs = v.top(self.topk)
        top_ids: list[list[int]] = [[] for _ in v.inputs]
        top_probs: list[list[float]] = [[] for _ in v.inputs]
        for r, i, p in zip(rows, ids.tolist(), probs.tolist()):
            top_ids[r], top_probs[r] = i, p
        self.spectra.update(v.inputs, v.parents, top_ids, top_probs, v.path, ctx.tokens[: ctx.pend + 1])


# ------------------------------------------------------------------------------------ trained drafters
class DrafterSource(DraftSource):
    """The bundle's drafters (EAGLE-1 / EAGLE-3 / small-LM) as chain, EAGLE-2 dynamic tree, ADASPEC or SPIDE.

    ADASPEC Alg. 2: the first language comes from the whole prompt (overlap at the largest size), the first
    size is S[0] (line 4); then every u generated tokens the last w choose (ℓ, s) (lines 24–41) and the
    drafter and its reduced head switch (lines 42–44).

    ``lookup_runs`` (a ``PromptLookup(grow_to=)``; greedy only): where the verified text's last three tokens
    occurred earlier (prompt lookup's longest match: a loop or a copy is running), the step proposes prompt
    lookup's loop-aware chain instead of running the drafter — free, and as deep as the loop goes. Measured on the
    demo's held-out greedy answers (vi, de, ja; 1,036–1,618 answer positions each): such positions are 61–76 % of
    the answer, prompt lookup's next token is the target's at 84–92 % of them, and its 20-token chain keeps
    10.3–12.3 tokens on average — where a drafter's chain of γ keeps at most γ, at ~3 ms per drafted token. Every
    other step runs the drafter (which, reading prompt lookup's hint, ``eagle.lookup_hint``, learned when the
    weaker matches are worth copying)."""

    needs_feats = True

    def __init__(self, target, bundle, *, mode: str = "chain", adaptive: bool = False, gamma: int = 4,
                 depth: int = 4, topk: int = 4, nodes: int = 12, lang: str = "auto", size="auto",
                 vocab_lang: str | None = None, window=None, step=None, offset=None, gamma_max: int = 8,
                 spide_threshold: float | None = None, name: str = "drafter", lookup_runs: PromptLookup | None = None):
        from decoder.drafters import build_runtimes
        from vocab.masks import load_masks

        self.name, self.mode, self.adaptive = name, mode, adaptive
        self.runs = lookup_runs
        self.gamma, self.depth, self.topk, self.nodes = gamma, depth, topk, nodes
        self.gamma_max, self.spide_threshold = gamma_max, spide_threshold
        self.spide = SpideTable() if spide_threshold is not None else None  # learns online, across requests
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
                raise PolyspecError(f"size must be auto, full or one of {sizes}, not {size!r}") from None
            if size not in sizes:
                raise PolyspecError(f"size {size} is not one of the bundle's sizes {sizes}")
        self.fixed_lang = None if lang == "auto" else lang
        self.size_opt, self.vocab_lang = size, (None if vocab_lang in (None, "auto") else vocab_lang)
        self.runtimes, self.banks = build_runtimes(bundle, target, self.device)
        first = next(iter(self.runtimes.values()))
        d = getattr(first, "drafter", None)
        self.aux_layers = list(d.aux_layers) if getattr(d, "arch_name", "") == "eagle3" else None
        if self.aux_layers and self.vocab_lang:
            raise PolyspecError("vocab_lang needs EAGLE-1 or small-LM drafters (EAGLE-3 heads cover their own language)")
        mask, _, _ = load_masks(bundle.masks_file())
        a = bundle.manifest["adaptive"]
        self.selector_args = dict(mask=mask, languages=langs, sizes=sizes, window=window or a["window"],
                                  step=step or a["step"], offset=a["offset"] if offset is None else offset)
        self.lang = self.size = self.selector = None
        self.prompt_ids, self._heads = [], {}  # this request's prompt, and its heads per (language, head language, size)

    # ADASPEC Alg. 2 -------------------------------------------------------------------------------
    def begin(self, ctx: DecodeState) -> None:
        from decoder.adaptive import LanguageSelector

        for rt in self.runtimes.values():
            rt.reset()
        self.prompt_ids, self._heads = ctx.tokens[: ctx.prompt_len], {}
        if self.runs is not None:
            self.runs.begin(ctx)
        self.selector = LanguageSelector(**self.selector_args, fixed_lang=self.fixed_lang,
                                         fixed_size=self.size_opt if isinstance(self.size_opt, int) else None)
        if self.fixed_lang:
            lang = self.fixed_lang
        else:
            probe = LanguageSelector(**{**self.selector_args, "offset": 0.0}, fixed_size=max(self.selector.sizes))
            lang = probe.choose(self.prompt_ids)[0]
        size = self.size_opt if isinstance(self.size_opt, int) else min(self.selector.sizes)
        self.lang, self.size = lang, (None if self.size_opt == "full" else size)

    @property
    def max_nodes(self) -> int | None:
        """With loop runs, the most tokens one step may propose (a run goes deeper than γ or the tree's nodes);
        None: the decoder's default bound."""
        if self.runs is None:
            return None
        return max(self.nodes, self.gamma, self.gamma_max, self.runs.grow_to or self.runs.gamma)

    def update(self, ctx: DecodeState, v: Verified) -> None:
        if self.runs is not None:
            self.runs.update(ctx, v)  # a loop run kept whole: the next one goes twice as deep
        if self.adaptive and self.selector.due(v.kept):
            lang, size = self.selector.choose(ctx.tokens[ctx.prompt_len :][-self.selector.window :])[:2]
            self.lang, self.size = lang, (None if self.size_opt == "full" else size)

    def head(self):
        """The drafting head of the current (language, size): the ranked block, with this request's prompt ids
        among its rows (built once per request and key)."""
        key = (self.lang, self.vocab_lang or self.lang, self.size)
        if key not in self._heads:
            self._heads[key] = self.banks[self.lang].head(key[1], self.size, prompt_ids=self.prompt_ids)
        return self._heads[key]

    # drafting ---------------------------------------------------------------------------------------
    def propose(self, ctx: DecodeState) -> Proposal:
        run = self.loop_run(ctx)
        if run.tokens:
            return run
        if self.mode == "tree" and ctx.tree_ok:
            return self.draft_tree(ctx)
        gamma = min(self.gamma_max if self.spide is not None else self.gamma, ctx.max_depth)
        tokens, qs, _ = self.draft_chain(ctx, gamma, self.spide_threshold)
        return Proposal.chain(tokens, self.name, qs if ctx.temperature > 0 else None, self.lang, self.size)

    def loop_run(self, ctx: DecodeState) -> Proposal:
        """Prompt lookup's chain where the verified text's last ``MAX_NGRAM`` tokens occurred earlier (greedy,
        ``lookup_runs``); else nothing. The drafter does not run: its cache catches up at its next step (``sync``)."""
        if self.runs is None or ctx.temperature > 0 or ctx.max_depth < 1:
            return Proposal()
        found = earlier_occurrence(ctx.tokens[: ctx.pend + 1], MAX_NGRAM, MAX_NGRAM)
        if found is None:
            return Proposal()
        return Proposal.chain(self.runs.propose(ctx).tokens, self.runs.name, None, self.lang, self.size)

    def draft_chain(self, ctx: DecodeState, gamma: int, threshold: float | None = None):
        """Up to γ tokens one by one; with a threshold, stop once the estimated probability that the next draft
        survives (SPIDE: Π rate(confidence)) falls under it. → (tokens, q per token when sampling, confidences)."""
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
            if i < gamma - 1:  # entry for draft i at position pend+1+i, fed the previous predicted feature
                pos = torch.tensor([ctx.pend + 1 + i], device=self.device)
                parent = rt.extend(torch.tensor([drafts[-1]], device=self.device), parent.view(1, -1), pos,
                                   prefixes=[ctx.tokens[: ctx.pend + 1] + drafts])[-1]
        rt.rollback()
        return drafts, qs, self.confs

    def learn_lengths(self, v: Verified) -> None:
        """SPIDE's table: drafts 0..accepted-1 kept, draft ``accepted`` rejected (later ones not judged)."""
        if self.spide is not None and self.confs:
            n = 0
            for i in v.path[1:]:  # this drafter's chain nodes on the kept branch, from the root
                if self.name not in v.origin[i - 1].split("+"):
                    break
                n += 1
            self.spide.update(self.confs, n)

    def draft_tree(self, ctx: DecodeState) -> Proposal:
        """EAGLE-2 dynamic tree (greedy): expand the top-k nodes of each level by cumulative log-probability,
        keep the best ``nodes`` nodes with their ancestors, parents first."""
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
            par_h = torch.stack([root_hidden if parent[n] < 0 else hidden[parent[n]] for n in expand])
            pos = torch.full((len(expand),), ctx.pend + d, device=dev)
            verified_ids = ctx.tokens[: ctx.pend + 1]
            out = rt.extend(torch.tensor([tok[n] for n in expand], device=dev), par_h, pos, mask,
                            prefixes=[verified_ids + [tok[a] for a in reversed(_ancestors(n, parent))] + [tok[n]]
                                      for n in expand])
            frontier = []
            lps = torch.log_softmax(head.logits(out).float(), -1)
            v, j = lps.topk(min(self.topk, lps.shape[-1]), dim=-1)
            full = head.to_full(j)
            for i, n in enumerate(expand):
                hidden[n] = out[i]
                for s, jj in zip(v[i].tolist(), full[i].tolist()):
                    frontier.append(len(tok))
                    tok.append(jj), parent.append(n), score.append(score[n] + s), depth.append(d + 1)
        rt.rollback()
        keep = set(sorted(range(len(tok)), key=lambda n: -score[n])[: self.nodes])
        for n in list(keep):
            p = parent[n]
            while p >= 0 and p not in keep:
                keep.add(p)
                p = parent[p]
        order = sorted(keep, key=lambda n: (depth[n], n))
        index = {n: i for i, n in enumerate(order)}
        return Proposal([tok[n] for n in order], [-1 if parent[n] < 0 else index[parent[n]] for n in order],
                        [self.name] * len(order), None, self.lang, self.size)


def _ancestors(n: int, parent: list[int]) -> list[int]:
    """Node n's ancestors in a draft tree, nearest first."""
    out, p = [], parent[n]
    while p >= 0:
        out.append(p)
        p = parent[p]
    return out


class SpideSource(DrafterSource):
    """SPIDE (seed 001): chain drafting whose length follows the confidence → acceptance table."""

    def update(self, ctx: DecodeState, v: Verified) -> None:
        self.learn_lengths(v)
        super().update(ctx, v)


# ---------------------------------------------------------------------------------------------- hybrid
@dataclass
class _Arm:
    """Running means of the tokens and the seconds of one kind of hybrid step (with or without the drafter)."""

    n: int = 0
    tokens: float = 0.0
    secs: float = 0.0

    def add(self, tokens: float, secs: float, memory: float = 0.1) -> None:
        self.n += 1
        a = max(memory, 1.0 / self.n)  # the plain mean until 1/n < memory, then an exponential one
        self.tokens += a * (tokens - self.tokens)
        self.secs += a * (secs - self.secs)

    @property
    def rate(self) -> float:
        """Tokens per second."""
        return self.tokens / self.secs if self.secs > 0 else 0.0


class HybridSource(DraftSource):
    """The drafter and the n-gram sources in one verification forward (greedy: one merged tree).

    Each step the n-gram sources propose for free: prompt lookup's loop-aware chain (``PromptLookup(grow_to=)``)
    first, whole, then SPECTRA's guesses filling the device's flat-verify budget (``nodes``, ``calibration.json``
    ``tree_budget``); the candidates are merged into one trie (shared prefixes share nodes) and whichever branch
    the target follows wins the step. The trained drafter runs only where prompt lookup found no match — measured
    on the cpu-full bundle (en, 568 steps), the drafter added 0.06 tokens per step beside a prompt-lookup match
    and 0.8 where there was none — and there only while it pays. Whether it pays is measured, not modelled: on
    no-match steps the hybrid keeps two running means per drafter language, tokens per second of the steps that
    ran the drafter and of those that did not (each from the start of ``propose`` to the end of ``update``:
    drafting, the larger verification, every table update); the first ``warmup`` steps of each kind alternate,
    then the faster kind runs and the other is re-measured every ``probe_every`` no-match steps. Inside a step
    the drafter drafts a chain token by token while the estimated probability that the next draft survives
    (SPIDE table of its confidences) times the time an accepted token saves exceeds its measured cost per token.
    Sampling: a chain from the source with the best recent acceptance (Leviathan rejection sampling stays exact).
    """

    name = "hybrid"
    needs_feats = True

    def __init__(self, drafter: DrafterSource | None, ngram: list[DraftSource], nodes: int = 12,
                 gamma_max: int = 6, probe_every: int = 8, warmup: int = 3):
        if not ngram or not isinstance(ngram[0], PromptLookup):
            raise PolyspecError("hybrid: the first n-gram source must be prompt lookup (its match decides the drafter)")
        self.drafter, self.ngram, self.nodes = drafter, ngram, nodes
        self.gamma_max, self.probe_every, self.warmup = gamma_max, probe_every, warmup
        self.draft_tok_s = 0.002  # running mean cost of one drafted token (s); measured from the first step
        self.arms: dict[str | None, dict[bool, _Arm]] = {}  # drafter language → {ran the drafter: its steps}
        self.acc_rate = {s.name: 0.5 for s in ngram} | ({drafter.name: 0.5} if drafter else {})
        self.since_probe = 0  # no-match decisions since the other kind was last re-measured
        self.used_drafter = self.no_match = False
        self._t0, self._measured = 0.0, None  # the step being timed, and the arm it counts for
        self._warm_lang = None  # the drafter language whose cache is warm (its first step catches up a whole prompt)
        if drafter is not None:
            drafter.spide = drafter.spide or SpideTable()

    @property
    def max_nodes(self) -> int:
        """The most nodes one step can propose (prompt lookup's chain goes in whole, past the budget)."""
        return max([self.nodes] + [max(s.gamma, s.grow_to or 0) for s in self.ngram if isinstance(s, PromptLookup)])

    def begin(self, ctx: DecodeState) -> None:
        self._warm_lang = None
        for s in self.sources:
            s.begin(ctx)

    @property
    def sources(self) -> list[DraftSource]:
        return ([self.drafter] if self.drafter else []) + self.ngram

    def _tau(self) -> float:
        """Rough tokens per step from the sources' recent acceptance."""
        return 1.0 + sum(self.acc_rate.values()) / max(len(self.acc_rate), 1)

    def arm(self, ran_drafter: bool) -> _Arm:
        """The measured no-match steps of the current drafter language that ran (or skipped) the drafter."""
        lang = getattr(self.drafter, "lang", None)
        return self.arms.setdefault(lang, {True: _Arm(), False: _Arm()})[ran_drafter]

    def _drafter_pays(self, ctx: DecodeState) -> bool:
        """Whether this no-match step runs the drafter: alternate until both kinds are measured, then the one
        with more tokens per second, the other one every ``probe_every``-th step (its estimate stays current)."""
        if self.drafter is None or ctx.max_depth < 1:
            return False
        on, off = self.arm(True), self.arm(False)
        if min(on.n, off.n) < self.warmup:
            return on.n <= off.n
        better = on.rate > off.rate
        self.since_probe += 1
        if self.since_probe >= self.probe_every:
            self.since_probe = 0
            return not better
        return better

    def propose(self, ctx: DecodeState) -> Proposal:
        self._t0 = time.perf_counter()
        self.used_drafter = self.no_match = False  # set below for the greedy tree only: update() measures those
        if ctx.temperature > 0 or not ctx.tree_ok:
            best = max(self.sources, key=lambda s: self.acc_rate[s.name])
            p = best.propose(ctx) if best is not self.drafter else self._drafter_chain(ctx)
            return p if p.is_chain else p.first_chain()  # sampling: core gives n-gram drafts point-mass q
        cands = [s.propose(ctx) for s in self.ngram]
        self.no_match = ctx.max_depth >= 1 and not cands[0].tokens  # cands[0]: prompt lookup (the factory's order)
        self.used_drafter = self.no_match and self._drafter_pays(ctx)
        self._measured = self.arm(self.used_drafter) if self.no_match else None
        if self.used_drafter:
            if self.drafter.lang != self._warm_lang:  # its first step of a request or language syncs a whole
                self._measured, self._warm_lang = None, self.drafter.lang  # prompt: a one-off, not its step cost
            cands.insert(1, self._drafter_chain(ctx))
        # prompt lookup's chain (first) goes in whole, as deep as it matched; the others fill the device's flat
        # budget only (past it every extra node costs verification time: on the 2-core CPU in bf16 verify(k)
        # rises from ~1.1 forwards at 6 tokens to ~2 at 15), so they pay where PLD has little or nothing
        return merge(cands, max(self.nodes, len(cands[0].tokens)), ctx.max_depth)

    def _drafter_chain(self, ctx: DecodeState) -> Proposal:
        """Draft while P(all drafts so far survive) · (time an accepted token saves) > cost of one more draft."""
        d = self.drafter
        tau = self._tau()
        saved = (ctx.step_s or 0.03) / tau
        threshold = min(0.9, self.draft_tok_s / max(saved, 1e-6))
        t0 = time.perf_counter()
        tokens, qs, _ = d.draft_chain(ctx, min(self.gamma_max, ctx.max_depth), threshold)
        if tokens:
            self.draft_tok_s = 0.8 * self.draft_tok_s + 0.2 * (time.perf_counter() - t0) / (len(tokens) + 1)
        return Proposal.chain(tokens, d.name, qs if ctx.temperature > 0 else None, d.lang, d.size)

    def update(self, ctx: DecodeState, v: Verified) -> None:
        for name in [s.name for s in self.sources]:  # acceptance per source: did the kept path run through its nodes?
            if v.proposed_by(name):
                self.acc_rate[name] = 0.9 * self.acc_rate[name] + 0.1 * min(v.kept_from(name), 4) / 4
        if self.used_drafter and self.drafter is not None:
            self.drafter.learn_lengths(v)
        for s in self.sources:
            s.update(ctx, v)
        if self._measured is not None:  # the whole step: drafting, verification, the updates above
            if ctx.feats.is_cuda:
                torch.cuda.synchronize(ctx.feats.device)
            self._measured.add(v.kept or 1 + v.accepted, time.perf_counter() - self._t0)


def merge(cands: list[Proposal], budget: int, max_depth: int) -> Proposal:
    """Union of proposals as one trie (shared prefixes share nodes), in the order given, at most ``budget``
    nodes and ``max_depth`` deep; a node's origin names every source that proposed it ("a+b")."""
    out = Proposal()
    children: dict[tuple[int, int], int] = {}  # (parent node, token) → node
    for c in cands:
        depth = c.depth
        where: list[int] = []  # candidate node → merged node (or -2: dropped)
        for i, (t, p) in enumerate(zip(c.tokens, c.parents)):
            mp = -1 if p < 0 else where[p]
            if mp == -2 or depth[i] > max_depth:
                where.append(-2)
                continue
            key = (mp, t)
            if key in children:
                n = children[key]
                if c.origin[i] not in out.origin[n].split("+"):
                    out.origin[n] += "+" + c.origin[i]
            elif len(out.tokens) < budget:
                n = children[key] = len(out.tokens)
                out.tokens.append(t), out.parents.append(mp), out.origin.append(c.origin[i])
            else:
                n = -2
            where.append(n)
        if c.lang is not None and out.lang is None:
            out.lang, out.vocab_size = c.lang, c.vocab_size
    return out


# --------------------------------------------------------------------------------------------- factory
def build_source(method: str, target, bundle=None, *, gamma: int | None = None, tree_depth: int = 4,
                 tree_topk: int = 4, tree_nodes: int = 12, shape: str = "chain", lang: str = "auto", size="auto",
                 vocab_lang: str | None = None, window=None, step=None, offset=None, gamma_max: int = 8,
                 spide_threshold: float = 0.35, ngram_k: int = 8, ngram_first_width: int = 8,
                 ngram_threshold: float = 0.02, spectra=None, lookup_runs: bool = True, log=None) -> DraftSource | None:
    """method → its draft source (None for ``ar``). ``spectra``: a ``decoder.spectra.Spectra`` to share.
    ``lookup_runs``: ``adaspec`` copies running loops with prompt lookup (``DrafterSource``)."""
    vocab = int(target.model.get_output_embeddings().weight.shape[0])
    g = gamma or 4

    def drafter(**kw):
        return DrafterSource(target, bundle, gamma=g, depth=tree_depth, topk=tree_topk, nodes=tree_nodes,
                             lang=lang, size=size, vocab_lang=vocab_lang, window=window, step=step, offset=offset,
                             gamma_max=gamma_max, **kw)

    def loop_lookup():  # the hybrid's and adaspec's prompt lookup: 10 deep, 20 after a chain kept whole
        return PromptLookup(10, grow_to=20)

    def new_spectra():
        if spectra is not None:
            return spectra
        from decoder.spectra import Spectra

        return Spectra(vocab, guess_len=10)

    if method == "ar":
        return None
    if method == "pld":
        return PromptLookup(gamma or 10)
    if method == "ngram-tree":
        return TokenRecycling(vocab, ngram_k, tree_nodes, ngram_first_width, tree_topk, tree_depth, ngram_threshold, g)
    if method == "spectra":  # at least as deep as prompt lookup's chain (10): loops repay long guesses
        return SpectraSource(new_spectra(), max(tree_nodes, 10))
    if method in ("chain", "tree"):
        return drafter(mode=method, name=method)
    if method == "adaspec":
        return drafter(mode=shape, adaptive=True, name="adaspec", lookup_runs=loop_lookup() if lookup_runs else None)
    if method == "spide":
        return SpideSource(target, bundle, gamma=g, lang=lang, size=size, vocab_lang=vocab_lang, window=window,
                           step=step, offset=offset, gamma_max=gamma_max, spide_threshold=spide_threshold,
                           name="spide")
    if method == "hybrid":
        d = drafter(mode="chain", adaptive=True, name="drafter") if bundle is not None else None
        # the same node budget as spectra alone: the calibrated flat budget, but at least PLD's depth (measured
        # on the 2-core CPU: a 5-node flat budget cut the base model's long, looping guesses; spectra at 10
        # nodes ran 3.8× AR, hybrid at 5 branch nodes 3.2×)
        nodes = max(tree_nodes, 10)
        return HybridSource(d, [loop_lookup(), SpectraSource(new_spectra(), nodes)], nodes=nodes, gamma_max=gamma_max)
    raise PolyspecError(f"unknown method {method!r}")
