"""``Decoder``: lossless speculative decoding of a target with a polyspec bundle.

    dec = Decoder(target, bundle, method="adaspec")
    out = dec.generate(prompt_ids, max_new_tokens=128)          # greedy: identical to the target's own
    out.tokens, out.text, out.tau, out.steps[i].lang, …

Methods
- ``ar``: the target alone, its own KV-cache loop (the reference every other method must equal).
- ``chain``: the drafter proposes γ tokens one by one; one target forward verifies them all; the cache
  is cropped back past the first rejection.
- ``tree``: EAGLE-2 dynamic tree: expand the top-k nodes of each level by cumulative log-probability,
  keep the best ``tree_nodes`` nodes, verify them in one forward with a tree attention mask and tree
  position ids, keep the longest accepted branch (greedy only; sampling and contexts a sliding-window
  layer cannot see with a custom mask fall back to ``chain``, said once).
- ``adaspec``: chain (or tree, ``shape="tree"``) with ADASPEC Alg. 2 choosing drafter language and
  vocabulary size every u tokens from the last w (``decoder.adaptive``).
- ``spide``: chain drafting whose length is decided token by token from SPIDE's confidence→acceptance
  table (``decoder.ngram.SpideTable``), up to ``gamma_max``.
- ``pld`` (prompt lookup) and ``ngram-tree`` (Token Recycling / UNISPEC confidence tree): training-free
  draft sources, no bundle needed; verified exactly like the drafter's drafts.

γ (chain draft length) defaults to the bundle's ``calibration.json`` g* for this device
(``python -m decoder.calibrate``), else 4. Options ``lang`` (``auto`` = from the prompt, or a bundle language: fixed), ``size`` (``auto``, an int of
the bundle's sizes: fixed, or ``full``: the whole vocabulary) and ``vocab_lang`` (head language different
from the drafter's, e.g. one English vocabulary for all: FR-Spec) give the ADASPEC Table 2 ablations.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from decoder.adaptive import LanguageSelector
from decoder.drafters import aux_layers, build_runtimes
from decoder.ngram import SpideTable, TokenRecycler, prompt_lookup
from decoder.runner import TargetRunner, additive_mask, tree_mask
from decoder.stopping import Stopper, eos_ids
from decoder.verify import accept_greedy, accept_sampled, sample, warp
from polyspec.errors import PolyspecError

METHODS = ("ar", "chain", "tree", "adaspec", "spide", "pld", "ngram-tree")
NEEDS_BUNDLE = ("chain", "tree", "adaspec", "spide")


@dataclass
class StepStat:
    """One draft-and-verify step (one target forward)."""

    new_tokens: int  # tokens emitted (accepted drafts + the target's own token), after stopping
    accepted: int  # draft tokens the target kept
    drafted: int  # draft tokens proposed (tree: nodes verified)
    lang: str | None
    vocab_size: int | None  # None: full vocabulary
    shape: str  # ar | chain | tree
    draft_s: float
    verify_s: float


@dataclass
class GenerationResult:
    tokens: list[int]
    text: str
    finish_reason: str  # eos | stop | length
    steps: list[StepStat] = field(default_factory=list)
    target_forwards: int = 0  # including the prefill
    prefill_s: float = 0.0
    wall_s: float = 0.0

    @property
    def tau(self) -> float:
        """Tokens per target forward (seed 003's compression ratio τ)."""
        return len(self.tokens) / max(self.target_forwards, 1)

    @property
    def accept_lengths(self) -> list[int]:
        return [s.new_tokens for s in self.steps]

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "text": self.text, "finish_reason": self.finish_reason, "tau": self.tau,
                "target_forwards": self.target_forwards, "prefill_s": self.prefill_s, "wall_s": self.wall_s,
                "steps": [asdict(s) for s in self.steps]}


class Decoder:
    def __init__(self, target, bundle=None, method: str = "adaspec", *, gamma: int | None = None, tree_depth: int = 4,
                 tree_topk: int = 4, tree_nodes: int = 12, shape: str = "chain", lang: str = "auto",
                 size: str | int = "auto", vocab_lang: str | None = None, window: int | None = None,
                 step: int | None = None, offset: float | None = None, gamma_max: int = 8,
                 spide_threshold: float = 0.35, ngram_k: int = 8, ngram_first_width: int = 8,
                 ngram_threshold: float = 0.02, log=None):
        if method not in METHODS:
            raise PolyspecError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        if shape not in ("chain", "tree"):
            raise PolyspecError(f"shape must be chain or tree, not {shape!r}")
        if method in NEEDS_BUNDLE and bundle is None:
            raise PolyspecError(f"method {method!r} needs a bundle (drafters); ar, pld and ngram-tree run without one")
        if (gamma is not None and gamma < 1) or tree_depth < 1 or tree_topk < 1 or tree_nodes < 1:
            raise PolyspecError("gamma, tree_depth, tree_topk and tree_nodes must be ≥ 1")
        self.target, self.method = target, method
        self.shape = {"tree": "tree", "ngram-tree": "tree", "adaspec": shape, "ar": "ar"}.get(method, "chain")
        self.gamma, self.depth, self.topk, self.nodes = gamma or 4, tree_depth, tree_topk, tree_nodes
        self.gamma_max, self.spide_threshold = gamma_max, spide_threshold
        self.ngram_first_width, self.ngram_threshold = ngram_first_width, ngram_threshold
        self.spide = SpideTable() if method == "spide" else None  # both learn online, across requests
        self.recycler = TokenRecycler(target.vocab_size, ngram_k) if method == "ngram-tree" else None
        self.log = log or (lambda msg: None)
        self._said: set[str] = set()
        self.runner = TargetRunner(target)
        self.device = target.model.get_output_embeddings().weight.device
        self.eos = eos_ids(target)
        self.default_stop = list(target.spec.prompt_format.stop)
        self.bundle = None
        if bundle is not None and method in NEEDS_BUNDLE:
            self._open_bundle(bundle, lang, size, vocab_lang, window, step, offset)
            if gamma is None:  # UNISPEC calibration of this device, when the bundle has one
                from decoder.calibrate import load_g_star

                g = load_g_star(self.bundle.root, self.device)
                if g:
                    self.gamma = g
                    self.log(f"γ = {g} from the bundle's calibration for this device")

    # ------------------------------------------------------------------------------------- setup
    def _open_bundle(self, bundle, lang, size, vocab_lang, window, step, offset) -> None:
        from export.bundle import Bundle, load_bundle
        from vocab.masks import load_masks

        if not isinstance(bundle, Bundle):
            bundle = load_bundle(Path(bundle), target_pin=self.target.pin())
        self.bundle = bundle
        langs, sizes = bundle.languages, bundle.vocab_sizes
        for name, value in (("lang", lang), ("vocab_lang", vocab_lang)):
            if value not in (None, "auto") and value not in langs:
                raise PolyspecError(f"{name} {value!r} is not in the bundle ({', '.join(langs)})")
        if size not in ("auto", "full"):
            try:
                size = int(size)
            except (TypeError, ValueError):
                raise PolyspecError(f"size must be auto, full or one of {sizes}, not {size!r}") from None
            if size not in sizes:
                raise PolyspecError(f"size {size} is not one of the bundle's sizes {sizes}")
        self.fixed_lang = None if lang == "auto" else lang
        self.size_opt, self.vocab_lang = size, (None if vocab_lang in (None, "auto") else vocab_lang)
        self.runtimes, self.banks = build_runtimes(bundle, self.target, self.device)
        self.runner.aux_layers = aux_layers(self.runtimes)
        if self.runner.aux_layers and vocab_lang not in (None, "auto"):
            raise PolyspecError("vocab_lang needs EAGLE-1 or small-LM drafters (EAGLE-3 heads cover their own language)")
        mask, _, _ = load_masks(bundle.masks_file())
        a = bundle.manifest["adaptive"]
        self.selector_args = dict(mask=mask, languages=langs, sizes=sizes,
                                  window=window or a["window"], step=step or a["step"],
                                  offset=a["offset"] if offset is None else offset)

    def _say_once(self, msg: str) -> None:
        if msg not in self._said:
            self._said.add(msg)
            self.log(msg)

    # -------------------------------------------------------------------------------- generation
    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int = 128, temperature: float = 0.0,
                 top_p: float = 1.0, stop: list[str] | None = None, seed: int = 0) -> GenerationResult:
        if not prompt_ids:
            raise PolyspecError("empty prompt")
        if max_new_tokens < 1:
            raise PolyspecError("max_new_tokens must be ≥ 1")
        sampling = temperature > 0
        gen = torch.Generator().manual_seed(seed)
        stopper = Stopper(self.target.tokenizer, self.eos, self.default_stop if stop is None else stop, max_new_tokens)
        t_start = time.perf_counter()
        self.runner.reset()
        for rt in getattr(self, "runtimes", {}).values():
            rt.reset()
        P = len(prompt_ids)
        H = self.target.hidden_size * (3 if self.runner.aux_layers else 1)
        feats = torch.empty((P + max_new_tokens + max(self.nodes, self.gamma, self.gamma_max) + 2, H), device=self.device,
                            dtype=self.runner.head.weight.dtype)
        tokens = list(prompt_ids)

        # prefill: features of every prompt position, logits of the last → the first (pending) token
        h, logits = self.runner.forward(tokens, logits_for=slice(-1, None))
        feats[:P] = h
        tokens.append(self._pick(logits[-1], temperature, top_p, gen))
        stopper.push(tokens[-1:])
        prefill_s = time.perf_counter() - t_start

        lang = size = selector = None
        if self.method in NEEDS_BUNDLE:
            selector = LanguageSelector(**self.selector_args, fixed_lang=self.fixed_lang,
                                        fixed_size=self.size_opt if isinstance(self.size_opt, int) else None)
            lang, size = self._initial_choice(selector, prompt_ids)

        steps: list[StepStat] = []
        while not stopper.done:
            pend = len(tokens) - 1  # index of the pending token (not yet in the target cache)
            budget = stopper.remaining  # no point drafting past max_new_tokens
            if self.method == "ar":
                t0 = time.perf_counter()
                h, logits = self.runner.forward(tokens[pend:])
                feats[pend] = h[0]
                new, stat = [self._pick(logits[0], temperature, top_p, gen)], StepStat(
                    0, 0, 0, None, None, "ar", 0.0, time.perf_counter() - t0)
            elif self.shape == "tree" and not sampling and self.runner.tree_fits(self.nodes + 1):
                t0 = time.perf_counter()
                if self.method == "ngram-tree":
                    tree = self.recycler.tree(tokens[pend], self.nodes, self.ngram_first_width, self.topk, self.depth,
                                              self.ngram_threshold)
                else:
                    tree = self._draft_tree(tokens, feats, pend, lang, size, budget)
                new, stat = self._verify_tree(tokens, feats, pend, *tree, t0)
                stat.lang, stat.vocab_size = lang, size
            else:
                if self.shape == "tree":
                    self._say_once("tree: sampling, or a context past the target's sliding window, "
                                   "is drafted as a chain")
                gamma = min(self.gamma_max if self.method == "spide" else self.gamma, budget - 1)
                t0 = time.perf_counter()
                if self.method in ("pld", "ngram-tree"):
                    drafts = prompt_lookup(tokens, gamma) if self.method == "pld" else self._ngram_chain(tokens[pend], gamma)
                    qs = [self._onehot(d) for d in drafts] if sampling else []
                    confs = []
                else:
                    drafts, qs, confs = self._draft_chain(tokens, feats, pend, lang, size, gamma, temperature, gen)
                new, stat = self._verify_chain(tokens, feats, pend, drafts, qs, temperature, top_p, gen, t0)
                stat.lang, stat.vocab_size = lang, size
                if self.spide is not None:
                    self.spide.update(confs, stat.accepted)
            kept = stopper.push(new)
            stat.new_tokens = kept
            steps.append(stat)
            tokens.extend(new[:kept])
            if selector is not None and self.method == "adaspec" and selector.due(kept):
                gen_ids = tokens[P:]
                lang, size = self._resolve(*selector.choose(gen_ids[-selector.window :])[:2])
        self._sync()
        return GenerationResult(tokens=stopper.tokens, text=stopper.text(), finish_reason=stopper.reason, steps=steps,
                                target_forwards=self.runner.forwards, prefill_s=prefill_s,
                                wall_s=time.perf_counter() - t_start)

    def _pick(self, logits: torch.Tensor, temperature: float, top_p: float, gen) -> int:
        if temperature <= 0:
            return int(logits.argmax())
        return sample(warp(logits, temperature, top_p), gen)

    def _initial_choice(self, selector: LanguageSelector, prompt_ids: list[int]) -> tuple[str, int | None]:
        """ℓ from the whole prompt (overlap at the largest size, equal for every language), then Alg. 2
        line 4's first size S[0]; the adaptive mechanism takes over after u tokens."""
        if self.fixed_lang:
            lang = self.fixed_lang
        else:
            probe = LanguageSelector(**{**self.selector_args, "offset": 0.0}, fixed_size=max(selector.sizes))
            lang = probe.choose(prompt_ids)[0]
        size = self.size_opt if isinstance(self.size_opt, int) else min(selector.sizes)
        return self._resolve(lang, size)

    def _resolve(self, lang: str, size: int) -> tuple[str, int | None]:
        if self.size_opt == "full":
            return lang, None
        return lang, size

    def _head(self, lang: str, size: int | None):
        return self.banks[lang].head(self.vocab_lang or lang, size)

    # ---------------------------------------------------------------------------------- chain
    def _draft_chain(self, tokens, feats, pend, lang, size, gamma, temperature, gen):
        """The drafter proposes up to γ tokens one by one (SPIDE: while the estimated acceptance holds)."""
        rt, head = self.runtimes[lang], self._head(lang, size)
        parent = rt.sync(tokens, feats, pend)
        drafts, qs, confs, alive = [], [], [], 1.0
        for i in range(gamma):
            lg = head.logits(parent)
            if self.spide is not None:  # SPIDE: estimated P(this draft survives) from its confidence
                conf = float(torch.softmax(lg, -1).max())
                alive *= self.spide.rate(conf)
                if i > 0 and alive < self.spide_threshold:
                    break
                confs.append(conf)
            if temperature > 0:
                q = torch.softmax(lg / temperature, dim=-1)
                j = sample(q, gen)
                q_full = torch.zeros(self.runner.head.weight.shape[0], dtype=torch.float32, device=q.device)
                q_full[head.ids if head.ids is not None else slice(None)] = q
                qs.append(q_full)
            else:
                j = int(lg.argmax())
            drafts.append(int(head.to_full(torch.tensor(j, device=lg.device))))
            if i < gamma - 1:  # entry for draft i at position pend+1+i, fed the previous predicted feature
                pos = torch.tensor([pend + 1 + i], device=self.device)
                parent = rt.extend(torch.tensor([drafts[-1]], device=self.device), parent.view(1, -1), pos)[-1]
        rt.rollback()
        return drafts, qs, confs

    def _ngram_chain(self, root: int, gamma: int) -> list[int]:
        """Token Recycling drafting a chain (sampling / past the sliding window): follow the top-1 edges."""
        out, t = [], root
        for _ in range(gamma):
            t = int(self.recycler.adj[t, 0])
            if t < 0:
                break
            out.append(t)
        return out

    def _onehot(self, token: int) -> torch.Tensor:
        q = torch.zeros(self.runner.head.weight.shape[0], dtype=torch.float32, device=self.device)
        q[token] = 1.0  # a deterministic draft source: q is a point mass (Leviathan still applies)
        return q

    def _verify_chain(self, tokens, feats, pend, drafts, qs, temperature, top_p, gen, t0):
        """One target forward over [pending, drafts…]; keep the accepted prefix, roll the cache back."""
        self._sync()
        t1 = time.perf_counter()
        h, logits = self.runner.forward([tokens[pend], *drafts])
        if temperature > 0:
            n, nxt = accept_sampled(drafts, qs, warp(logits, temperature, top_p), gen)
        else:
            n, nxt = accept_greedy(drafts, logits)
        self.runner.rollback(len(drafts) - n)
        feats[pend : pend + n + 1] = h[: n + 1]
        if self.recycler is not None:
            self.recycler.update([tokens[pend], *drafts[:n]], logits[: n + 1])
        self._sync()
        t2 = time.perf_counter()
        return drafts[:n] + [nxt], StepStat(0, n, len(drafts), None, None, "chain", t1 - t0, t2 - t1)

    # ----------------------------------------------------------------------------------- tree
    def _draft_tree(self, tokens, feats, pend, lang, size, budget):
        """EAGLE-2 dynamic tree (greedy). Nodes are draft tokens; the root is the pending token.
        → (tokens, parent (-1 = root), depth) of the kept nodes, parents before children."""
        rt, head = self.runtimes[lang], self._head(lang, size)
        root_hidden = rt.sync(tokens, feats, pend)
        dev, dtype = self.device, self.runner.head.weight.dtype
        tok, parent, score, depth = [], [], [], []  # per node; parent -1 = root
        hidden: dict[int, torch.Tensor] = {}  # node → drafter output (its children's logits)
        slot: dict[int, int] = {}  # node → index among the drafter's draft entries
        lp = torch.log_softmax(head.logits(root_hidden), -1)
        v, j = lp.topk(min(self.topk, lp.shape[-1]))
        frontier = []
        for s, jj in zip(v.tolist(), head.to_full(j).tolist()):
            frontier.append(len(tok))
            tok.append(jj), parent.append(-1), score.append(s), depth.append(1)
        max_depth = max(1, min(self.depth, budget - 1))
        for d in range(1, max_depth):
            expand = sorted(frontier, key=lambda n: -score[n])[: self.topk]
            base = rt.cache.get_seq_length()
            anc = []  # the drafter entry of a node sees verified entries, its ancestors' entries and itself
            for n in expand:
                chain, p = [], parent[n]
                while p >= 0:
                    chain.append(slot[p])
                    p = parent[p]
                anc.append(chain)
            n_prev = len(slot)
            verified = base - n_prev
            for i, n in enumerate(expand):
                slot[n] = n_prev + i
            m = torch.zeros((len(expand), base + len(expand)), dtype=torch.bool)
            m[:, :verified] = True
            for i, chain in enumerate(anc):
                m[i, [verified + c for c in chain]] = True
                m[i, base + i] = True
            mask = additive_mask(m, dtype, dev)
            par_h = torch.stack([root_hidden if parent[n] < 0 else hidden[parent[n]] for n in expand])
            pos = torch.full((len(expand),), pend + d, device=dev)
            out = rt.extend(torch.tensor([tok[n] for n in expand], device=dev), par_h, pos, mask)
            frontier = []
            lps = torch.log_softmax(head.logits(out), -1)
            v, j = lps.topk(min(self.topk, lps.shape[-1]), dim=-1)
            full = head.to_full(j)
            for i, n in enumerate(expand):
                hidden[n] = out[i]
                for s, jj in zip(v[i].tolist(), full[i].tolist()):
                    frontier.append(len(tok))
                    tok.append(jj), parent.append(n), score.append(score[n] + s), depth.append(d + 1)
        rt.rollback()
        # keep the best nodes by cumulative log-probability, with their ancestors, in depth order
        keep = set(sorted(range(len(tok)), key=lambda n: -score[n])[: self.nodes])
        for n in list(keep):
            p = parent[n]
            while p >= 0 and p not in keep:
                keep.add(p)
                p = parent[p]
        order = sorted(keep, key=lambda n: (depth[n], n))
        index = {n: i for i, n in enumerate(order)}
        return ([tok[n] for n in order], [-1 if parent[n] < 0 else index[parent[n]] for n in order],
                [depth[n] for n in order])

    def _verify_tree(self, tokens, feats, pend, tok, parent, depth, t0):
        """One target forward over [pending, nodes…] with a tree mask; keep the longest greedy branch."""
        dev, dtype = self.device, self.runner.head.weight.dtype
        parents = [-1] + [p + 1 for p in parent]  # verify input: root at 0, node i at i + 1
        self._sync()
        t1 = time.perf_counter()
        pos = torch.tensor([[pend] + [pend + d for d in depth]], device=dev)
        h, logits = self.runner.forward([tokens[pend], *tok], position_ids=pos,
                                        attention_mask=tree_mask(pend, parents, dtype, dev))
        best = logits.argmax(-1).tolist()
        children: dict[int, dict[int, int]] = {}
        for i, p in enumerate(parents):
            if p >= 0:
                children.setdefault(p, {})[tok[i - 1]] = i
        path, cur = [], 0
        while best[cur] in children.get(cur, {}):
            cur = children[cur][best[cur]]
            path.append(cur)
        self.runner.keep(pend, [0, *path])
        feats[pend : pend + len(path) + 1] = h[[0, *path]]
        if self.recycler is not None:  # every verified node teaches the adjacency matrix
            self.recycler.update([tokens[pend], *tok], logits)
        self._sync()
        t2 = time.perf_counter()
        new = [tok[i - 1] for i in path] + [best[cur]]
        return new, StepStat(0, len(path), len(tok), None, None, "tree", t1 - t0, t2 - t1)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
