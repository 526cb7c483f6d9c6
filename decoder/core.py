"""``Decoder``: lossless speculative decoding of a target with a polyspec bundle.

    dec = Decoder(target, bundle, method="adaspec")
    out = dec.generate(prompt_ids, max_new_tokens=128)  # greedy: identical to the target's own
    out.tokens, out.text, out.tau, out.steps[i].lang, …

Methods
- ``ar``: the target alone, its own KV-cache loop (the reference every other method must equal).
- ``chain``: the drafter proposes γ tokens one by one; one target forward verifies them all; the
  cache is cropped back past the first rejection.
- ``tree``: EAGLE-2 dynamic tree: expand the top-k nodes of each level by cumulative
  log-probability, keep the best ``tree_nodes`` nodes, verify them in one forward with a tree
  attention mask and tree position ids, keep the longest accepted branch (greedy only; sampling and
  contexts a sliding-window layer cannot see with a custom mask fall back to ``chain``, said once).
- ``adaspec``: chain (or tree, ``shape="tree"``) with ADASPEC Alg. 2 choosing drafter language and
  vocabulary size every u tokens from the last w (``decoder.drafts.adaptive``); greedy steps whose
  last three verified tokens occurred earlier (a loop or a copy is running) propose prompt lookup's
  chain instead of running the drafter (``lookup_runs``, on by default;
  ``decoder.drafts.trained.DrafterSource``).
- ``spide``: chain drafting whose length is decided token by token from SPIDE's
  confidence→acceptance table (``decoder.drafts.tables.SpideTable``), up to ``gamma_max``.
- ``spide-parallel``: ``spide`` plus SPIDE's parallel draft verification
  (``decoder.drafts.spide_parallel``): while the target verifies a chain, a second thread (CUDA:
  stream) drafts its continuation; when the chain is kept whole and the target's next token is the
  continuation's first, the rest is the next chain, with no drafting pass.
- ``pld`` (prompt lookup) and ``ngram-tree`` (Token Recycling / UNISPEC confidence tree):
  training-free draft sources, no bundle needed; verified exactly like the drafter's drafts.
- ``spectra`` (SPECTRA CORE + RETRIEVAL) and ``hybrid`` (prompt lookup, SPECTRA and the drafter
  where it pays, in one tree).

Each method is one entry of the registry ``decoder.methods`` (its draft source, whether it needs a
bundle, which calibrated defaults it reads); what the loop needs while decoding it reads from the
built draft source (``decoder.drafts.types.DraftSource``: features, trees, EAGLE-3 layers, its node
bound).

The options are one dataclass, ``decoder.options.DecodeOptions``: ``Decoder(target, bundle, method,
options=DecodeOptions(gamma=3))`` or the same fields as keywords
(``Decoder(target, bundle, method, gamma=3)``). γ (chain draft length) defaults to the bundle's
``calibration.json`` g* for this device (``python -m decoder.calibrate``), else 4. Options ``lang``
(``auto`` = from the prompt, or a bundle language: fixed), ``size`` (``auto``, an int of the
bundle's sizes: fixed, or ``full``: the whole vocabulary) and ``vocab_lang`` (head language
different from the drafter's, e.g. one English vocabulary for all: FR-Spec) give the ADASPEC Table 2
ablations.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from decoder.calibrate.file import load_entry
from decoder.drafts.spectra import Spectra, refined_corpus
from decoder.drafts.types import DecodeState, Proposal, Verified
from decoder.loop.runner import TargetRunner
from decoder.loop.verify import accept_greedy, accept_sampled, argmax, sample, warp
from decoder.methods import METHODS, get_method
from decoder.options import DecodeOptions
from export.bundle import Bundle, load_bundle
from polyspec.errors import PolyspecError
from polyspec.generation import Stopper, eos_ids

_REFINED: dict = {}  # (target, corpus files) → SPECTRA-RETRIEVAL's perplexity-refined sequences


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
    # who proposed the step's first draft ("adaspec", "pld": adaspec's loop run, "a+b": merged)
    source: str = ""
    # drafting beside the verification (spide-parallel; decoder.drafts.types.Verified)
    # "hit": its continuation is the next step's draft; "drop": discarded; "": none
    parallel: str = ""
    spec_s: float = 0.0  # seconds that drafting took
    hidden_s: float = 0.0  # of which hidden behind the verification


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
        """Tokens per target forward (the compression ratio τ)."""
        return len(self.tokens) / max(self.target_forwards, 1)

    @property
    def accept_lengths(self) -> list[int]:
        return [s.new_tokens for s in self.steps]

    @property
    def parallel_hits(self) -> int:
        """Steps whose draft was drafted beside the previous verification (spide-parallel's
        continuations used)."""
        return sum(s.parallel == "hit" for s in self.steps)

    @property
    def parallel_drops(self) -> int:
        return sum(s.parallel == "drop" for s in self.steps)

    @property
    def spec_s(self) -> float:
        """Seconds of drafting beside verifications."""
        return sum(s.spec_s for s in self.steps)

    @property
    def overlap_s(self) -> float:
        """Of ``spec_s``, the seconds hidden behind verifications."""
        return sum(s.hidden_s for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "tau": self.tau,
            "target_forwards": self.target_forwards,
            "prefill_s": self.prefill_s,
            "wall_s": self.wall_s,
            "parallel_hits": self.parallel_hits,
            "parallel_drops": self.parallel_drops,
            "spec_s": self.spec_s,
            "overlap_s": self.overlap_s,
            "steps": [asdict(s) for s in self.steps],
        }


# tree node budget where the bundle holds no calibration for this device: inside the flat part of
# the cost curves measured on CPUs and GPUs (evidence:
# docs/experiments.md#uncalibrated-tree-node-budgets); `python -m decoder.calibrate` measures the
# device's own
UNCALIBRATED_TREE_NODES = {"cpu": 12, "cuda": 32}


class Decoder:
    def __init__(
        self,
        target,
        bundle=None,
        method: str = "adaspec",
        *,
        options: DecodeOptions | None = None,
        log=None,
        **overrides,
    ):
        """``options``: ``decoder.options.DecodeOptions`` (declared there, with their defaults);
        ``overrides``: any of its fields as keywords, over ``options``
        (``Decoder(target, bundle, "chain", gamma=3)``). ``self.options`` holds them as the draft
        source got them: γ, node budget and SPECTRA's tables filled in."""
        # an unknown keyword: TypeError, as for any call
        o = replace(options or DecodeOptions(), **overrides)
        gamma, tree_nodes, spectra = o.gamma, o.tree_nodes, o.spectra
        entry = get_method(method, kind="decoder")
        if o.shape not in ("chain", "tree"):
            raise PolyspecError(f"shape must be chain or tree, not {o.shape!r}")
        if entry.needs_bundle and bundle is None:
            free = [m.name for m in METHODS.values() if m.kind == "decoder" and not m.needs_bundle]
            raise PolyspecError(
                f"method {method!r} needs a bundle (drafters); {', '.join(free)} run without one"
            )
        if (
            (gamma is not None and gamma < 1)
            or o.tree_depth < 1
            or o.tree_topk < 1
            or (tree_nodes is not None and tree_nodes < 1)
        ):
            raise PolyspecError("gamma, tree_depth, tree_topk and tree_nodes must be ≥ 1")
        self.target, self.method = target, method
        self.log = log or (lambda msg: None)
        self._said: set[str] = set()
        self.runner = TargetRunner(target)
        self.device = target.model.get_output_embeddings().weight.device
        self.vocab_size = int(target.model.get_output_embeddings().weight.shape[0])
        self.eos = eos_ids(target)
        self.default_stop = list(target.spec.prompt_format.stop)
        self.bundle = None
        if bundle is not None and entry.source is not None:  # ar drafts nothing: no bundle to load
            self.bundle = (
                bundle
                if isinstance(bundle, Bundle)
                else load_bundle(Path(bundle), target_pin=target.pin())
            )
        cal = self._calibration()
        if gamma is None and cal.get("g_star") and "g_star" in entry.calibration:
            gamma = int(cal["g_star"])
            self.log(f"γ = {gamma} from the bundle's calibration for this device")
        tree_measured = (
            tree_nodes is None
            and bool(cal.get("tree_budget"))
            and "tree_budget" in entry.calibration
        )
        if tree_nodes is None:
            # the budget counts the tokens one forward verifies, the pending token among them: nodes
            # = budget − 1 (a budget of 16 read as 16 nodes verified 17 tokens: one row past the 16
            # that AMX tiles hold)
            # (evidence: docs/experiments.md#the-hybrid-beside-prompt-lookup-on-held-out-prompts--mixed-the-xeons-16-row-cliff-calibration-that-picks-the-same-γ-2026-11-26-bf16-host-code-4539a98--this-sections-commits)  # noqa: E501
            tree_nodes = (
                max(1, int(cal["tree_budget"]) - 1)
                if tree_measured
                else UNCALIBRATED_TREE_NODES["cuda" if self.device.type == "cuda" else "cpu"]
            )
        if entry.spectra and spectra is None:
            spectra = self._spectra(o.spectra_corpus)
        self.gamma, self.nodes = gamma or 4, tree_nodes
        self.options = replace(
            o, gamma=gamma, tree_nodes=tree_nodes, tree_measured=tree_measured, spectra=spectra
        )
        src = self.source = entry.build_source(target, self.bundle, self.options)
        # what the loop needs, as the source declares it (decoder.drafts.types.DraftSource)
        self.tree_capable = src is not None and src.tree_capable
        self.runner.aux_layers = src.aux_layers if src is not None else None
        self.needs_feats = src is not None and src.needs_feats
        # the most tokens one verification may carry: the source's own bound, else the node budget
        self.tree_span = (src.max_nodes if src is not None else None) or self.nodes
        self.max_draft = max(self.tree_span, self.gamma, o.gamma_max, 16) + 2
        self._step_s = 0.0  # running mean of a verification forward, shared with cost-aware sources

    def _calibration(self) -> dict:
        """This device's entry of the bundle's calibration.json (g*, tree budget), or {}."""
        if self.bundle is None:
            return {}
        return load_entry(self.bundle.root, self.device, self.runner.head.weight.dtype) or {}

    def _spectra(self, corpus):
        """SPECTRA's tables; RETRIEVAL indexes ``corpus`` (a synth JSONL or text file) refined by
        the target's perplexity. Default corpus: the self-distilled text of the bundle's run, when
        it is on disk. Refining is cached on disk (``decoder.drafts.spectra.refined_corpus``) and in
        this process."""
        sp = Spectra(self.vocab_size)
        files = [Path(corpus)] if corpus else []
        if not files and self.bundle is not None:
            run = self.bundle.root.resolve().parent.parent
            files = sorted(run.glob("synth/*-distill/data.jsonl"))
        if corpus and not files[0].is_file():
            raise PolyspecError(f"spectra corpus not found: {files[0]}")
        key = (id(self.target), tuple((str(f), f.stat().st_mtime_ns) for f in files if f.is_file()))
        if key not in _REFINED:
            _REFINED[key] = refined_corpus(
                self.target, files, keep=0.5, max_sequences=400, log=self.log
            )
        kept, total = _REFINED[key]
        if kept:
            sp.add_corpus(kept)
            self.log(
                f"spectra: retrieval corpus of {len(kept)} of {total} sequences (lowest "
                "perplexity) "
                f"from {', '.join(str(f) for f in files)}"
            )
        return sp

    def _say_once(self, msg: str) -> None:
        if msg not in self._said:
            self._said.add(msg)
            self.log(msg)

    # -------------------------------------------------------------------------------- generation
    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: list[str] | None = None,
        seed: int = 0,
    ) -> GenerationResult:
        if not prompt_ids:
            raise PolyspecError("empty prompt")
        if max_new_tokens < 1:
            raise PolyspecError("max_new_tokens must be ≥ 1")
        sampling = temperature > 0
        gen = torch.Generator().manual_seed(seed)
        stopper = Stopper(
            self.target.tokenizer,
            self.eos,
            self.default_stop if stop is None else stop,
            max_new_tokens,
        )
        t_start = time.perf_counter()
        self.runner.reset()
        P = len(prompt_ids)
        H = self.target.hidden_size * (3 if self.runner.aux_layers else 1)
        feats = torch.empty(
            (P + max_new_tokens + self.max_draft, H) if self.needs_feats else (0, H),
            device=self.device,
            dtype=self.runner.head.weight.dtype,
        )
        tokens = list(prompt_ids)

        # 1. prefill: features of every prompt position, logits of the last → the first (pending)
        #    token
        h, logits = self.runner.forward(
            tokens, logits_for=slice(-1, None), features=self.needs_feats
        )
        if self.needs_feats:
            feats[:P] = h
        tokens.append(self._pick(logits[-1], temperature, top_p, gen))
        stopper.push(tokens[-1:])
        prefill_s = time.perf_counter() - t_start

        src = self.source
        ctx = DecodeState(tokens, feats, P, temperature=temperature, gen=gen, step_s=self._step_s)
        if src is not None:
            src.begin(ctx)
        steps: list[StepStat] = []
        while not stopper.done:
            pend = len(tokens) - 1  # index of the pending token (not yet in the target cache)
            if src is None:  # 2a. plain autoregressive step
                t0 = time.perf_counter()
                h, logits = self.runner.forward(tokens[pend:], features=False)
                new, v = [self._pick(logits[0], temperature, top_p, gen)], None
                stat = StepStat(0, 0, 0, None, None, "ar", 0.0, time.perf_counter() - t0)
            # 2b. the source proposes a tree (or chain) under the budget left by max_new_tokens
            else:
                ctx.pend, ctx.max_depth = pend, stopper.remaining - 1
                ctx.tree_ok = not sampling and self.runner.tree_fits(self.tree_span + 1)
                if not ctx.tree_ok and self.tree_capable:
                    self._say_once(
                        "tree: sampling, or a context past the target's sliding window, is "
                        "drafted as a chain"
                    )
                t0 = time.perf_counter()
                prop = src.propose(ctx)
                if not prop.is_chain and not ctx.tree_ok:
                    prop = prop.first_chain()
                if sampling and prop.q is None:
                    prop.q = [self._onehot(t) for t in prop.tokens]
                draft_s = time.perf_counter() - t0
                # 3. one target forward verifies it; keep the longest accepted branch + the target's
                #    own token
                verify = self._verify_chain if prop.is_chain else self._verify_tree
                new, v = verify(ctx, prop, temperature, top_p, gen)
                stat = StepStat(
                    0,
                    v.accepted,
                    len(prop.tokens),
                    prop.lang,
                    prop.vocab_size,
                    "chain" if prop.is_chain else "tree",
                    draft_s,
                    v.verify_s,
                    prop.origin[0] if prop.origin else "",
                )
            # 4. stopping rules cut the step's tokens; the source learns from the verification
            kept = stopper.push(new)
            stat.new_tokens = kept
            steps.append(stat)
            tokens.extend(new[:kept])
            if v is not None:
                v.kept = kept
                self._step_s = (
                    v.verify_s if not self._step_s else 0.9 * self._step_s + 0.1 * v.verify_s
                )
                ctx.step_s = self._step_s
                src.update(ctx, v)
                stat.parallel, stat.spec_s, stat.hidden_s = v.parallel, v.spec_s, v.hidden_s
        self._sync()
        return GenerationResult(
            tokens=stopper.tokens,
            text=stopper.text(),
            finish_reason=stopper.reason,
            steps=steps,
            target_forwards=self.runner.forwards,
            prefill_s=prefill_s,
            wall_s=time.perf_counter() - t_start,
        )

    def _pick(self, logits: torch.Tensor, temperature: float, top_p: float, gen) -> int:
        if temperature <= 0:
            return int(argmax(logits))
        return sample(warp(logits, temperature, top_p), gen)

    def _onehot(self, token: int) -> torch.Tensor:
        q = torch.zeros(self.vocab_size, dtype=torch.float32, device=self.device)
        q[token] = 1.0  # a deterministic draft source: q is a point mass (Leviathan still applies)
        return q

    def _verify_chain(
        self, ctx: DecodeState, prop: Proposal, temperature, top_p, gen
    ) -> tuple[list[int], Verified]:
        """One target forward over [pending, drafts…] (no mask: causal); keep the accepted prefix,
        roll back."""
        tokens, pend, drafts = ctx.tokens, ctx.pend, prop.tokens
        self._sync()
        t1 = time.perf_counter()
        h, logits = self.runner.forward([tokens[pend], *drafts], features=self.needs_feats)
        # a source that guesses the target's next token has it judged as one more draft
        if temperature > 0:
            guess = (
                {"guess": self.source.bonus_guess}
                if getattr(self.source, "guesses_bonus", False)
                else {}
            )
            n, nxt = accept_sampled(drafts, prop.q, warp(logits, temperature, top_p), gen, **guess)
        else:
            n, nxt = accept_greedy(drafts, logits)
        self.runner.rollback(len(drafts) - n)
        if self.needs_feats:
            ctx.feats[pend : pend + n + 1] = h[: n + 1]
        self._sync()
        v = Verified(
            [tokens[pend], *drafts],
            list(range(-1, len(drafts))),
            logits,
            list(range(n + 1)),
            prop.origin,
            verify_s=time.perf_counter() - t1,
        )
        return drafts[:n] + [nxt], v

    def _verify_tree(
        self, ctx: DecodeState, prop: Proposal, temperature, top_p, gen
    ) -> tuple[list[int], Verified]:
        """One target forward over [pending, nodes…] with a tree mask and tree positions; keep the
        longest branch whose every node is the target's argmax after its parent (greedy)."""
        tokens, pend, tok = ctx.tokens, ctx.pend, prop.tokens
        parents = [-1] + [p + 1 for p in prop.parents]  # verify input: root at 0, node i at i + 1
        self._sync()
        t1 = time.perf_counter()
        pos = torch.tensor([[pend] + [pend + d for d in prop.depth]], device=self.device)
        h, logits = self.runner.forward(
            [tokens[pend], *tok],
            position_ids=pos,
            attention_mask=self.runner.tree_mask(pend, parents),
            features=self.needs_feats,
        )
        best = argmax(logits).tolist()
        children: dict[int, dict[int, int]] = {}
        for i, p in enumerate(parents):
            if p >= 0:
                children.setdefault(p, {})[tok[i - 1]] = i
        path, cur = [0], 0
        while best[cur] in children.get(cur, {}):
            cur = children[cur][best[cur]]
            path.append(cur)
        self.runner.keep(pend, path)
        if self.needs_feats:
            ctx.feats[pend : pend + len(path)] = h[path]
        self._sync()
        v = Verified(
            [tokens[pend], *tok],
            parents,
            logits,
            path,
            prop.origin,
            verify_s=time.perf_counter() - t1,
        )
        return [tok[i - 1] for i in path[1:]] + [best[cur]], v

    def _sync(self) -> None:
        """Wait for the loop's own CUDA stream (not the device: a source may draft on a stream of
        its own meanwhile)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
