"""SPIDE's parallel half, method ``spide-parallel``: while the target verifies a chain, the drafter
drafts the chain's continuation beside it (SPIDE: Serial and Parallel Intertwined Speculative
Decoding, §3.2 "Parallel Draft Verification Module" and Appendix A, Alg. 1 lines 17–40). The serial
half alone is ``spide`` (``decoder.drafts.trained.SpideSource``).

    serial step   draft d1…dk one by one until Γk ≤ τ           verify d1…dk  ║ draft x1…xs after dk
    hit           (d1…dk kept whole and the target's next        verify x2…xs  ║ draft xs+1…x2s
                  token is x1)                                                  after xs
    drop          (anything else: x1…xs discarded, drafter      serial step again
                  rolled back)

The drafting-termination conflict (SPIDE §1, §3.2: a draft stopped early loses the tokens the target
would have kept, one stopped late wastes drafting on tokens it rejects) is resolved as SPIDE
resolves it:
1. serial dynamic drafting stops at the first k where the chain's reliability Γk = Π α(conf_i) falls
   to τ or below (Eq. 3–4, Alg. 1 lines 4–13); the token that crossed τ ends the chain (Alg. 1
   drafts x_k, line 7, before testing Γ_k, line 11);
2. stopping the serial draft does not stop drafting: every verification is a parallel one (Alg. 1
   line 12 switches to "parallel" whenever serial drafting stops). The drafter continues s = ⌊v_q /
   v_p⌋ tokens (Eq. 6: as many drafter steps as fit in one verification; here verify seconds /
   drafter seconds per token, running means, within [2, gamma_max]) on the assumption that the chain
   is kept whole (§3.2, Fig. 2 II);
3. the first of them is judged as the target's next token (Alg. 1 line 28 verifies [x1…xk, xk+1]):
   greedy, it must be the target's argmax; sampling, it is kept with probability min(1, p/q), else
   replaced by a draw from norm(max(0, p − q)) (``decoder.loop.verify.accept_sampled``, ``guess``):
   the emitted token is the target's either way;
4. kept whole → stay parallel: the pre-drafted x2…xs are the next chain, with no drafting pass and
   no Γ test (Alg. 1 lines 30–34), while s more are drafted after them; any rejection → the
   continuation is dropped and the next step drafts serially again (lines 35–39).
The confidence → acceptance table (``decoder.drafts.tables.SpideTable``) learns after every
verification (Alg. 1 line 29) from the chain verified, serial or pre-drafted, and from x1 where it
was judged.

Concurrency. The speculative drafting runs in a second Python thread while the loop's thread runs
the target's verification forward (torch releases the GIL inside its ops); on CUDA the drafter's
kernels go to its own stream (``torch.cuda.Stream``, serial drafting too), so they overlap the
target's on the loop's stream. The drafter keeps its own KV cache: speculative entries lie past its
verified ones (``rt.done``) and a drop crops them (``rt.rollback()``), an exact rollback; the
target's cache is touched by the loop's thread only. Nothing the drafting thread computes reaches
the output except through the target's verification, so greedy output is the target's own and
sampling keeps its distribution.

Measured per step (``decoder.core.StepStat``): ``spec_s`` (seconds of speculative drafting),
``hidden_s`` (the part of it done before the loop needed its result: hidden behind the verification)
and ``parallel`` ("hit" | "drop"; "" when nothing was drafted beside the verification);
``GenerationResult.parallel_hits`` / ``parallel_drops`` / ``overlap_s`` sum them.

EAGLE drafters draft a continuation from their own predicted features, as the rest of a chain; after
a drop, the next serial step's ``sync`` re-runs the verified positions with the target's features.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from decoder.drafts.trained import DrafterSource
from decoder.drafts.types import DecodeState, Proposal, Verified
from decoder.loop.verify import sample


@dataclass
class _Chain:
    """Drafted tokens with the drafter's top-1 confidence and (sampling) the full-vocabulary q each
    was drawn from."""

    tokens: list[int] = field(default_factory=list)
    confs: list[float] = field(default_factory=list)
    qs: list[torch.Tensor] = field(default_factory=list)


class _Front:
    """Where drafting stands: ``hidden`` [H] proposes the next token; ``todo``, the last token
    drafted, is not yet an entry of the drafter's cache (it is run, at position ``pos``, only if
    drafting goes on); ``prefix``: the tokens up to the last drafted one (hinted EAGLE drafters read
    each entry's prefix)."""

    def __init__(self, hidden: torch.Tensor, pos: int, prefix: list[int]):
        self.hidden, self.pos, self.prefix, self.todo = hidden, pos, prefix, None


class _Spec:
    """One speculative continuation, drafted by a second thread while the target verifies."""

    def __init__(self, n: int):
        self.n, self.chain = n, _Chain()
        self.first = threading.Event()  # x1 (the guess of the target's next token) is ready
        self.error: BaseException | None = None
        self.t0 = self.t1 = 0.0
        self.thread: threading.Thread | None = None


class SpideParallelSource(DrafterSource):
    """SPIDE, serial dynamic drafting intertwined with parallel draft verification (module
    docstring)."""

    # the loop judges x1 as the target's next token (decoder.drafts.types.DraftSource)
    guesses_bonus = True

    def __init__(self, target, bundle, **kw):
        super().__init__(target, bundle, mode="chain", **kw)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.draft_tok_s = 0.0  # running mean of one drafter step (s): 1 / v_q of Eq. 6
        # the continuation being drafted beside this step's verification
        self.spec: _Spec | None = None
        self.next: _Chain | None = None  # a hit's pre-drafted chain: the next step's proposal
        self.front: _Front | None = None
        self.chain = _Chain()  # this step's proposal
        self.spec_gen: torch.Generator | None = None

    def begin(self, ctx: DecodeState) -> None:
        # a request that ended abnormally may have left a drafting thread behind
        self._join(reraise=False)
        super().begin(ctx)
        self.next = self.front = None
        # the drafting thread samples with its own generator: the loop's draws (ctx.gen) stay in
        # their order
        self.spec_gen = (
            torch.Generator().manual_seed(ctx.gen.initial_seed() + 1)
            if ctx.gen is not None
            else None
        )

    # ------------------------------------------------------------------------------------- drafting
    def propose(self, ctx: DecodeState) -> Proposal:
        with self._drafter_stream(after_loop=True):
            # (s was sized to fit: defensive)
            if self.next is not None and len(self.next.tokens) > ctx.max_depth:
                self.next = self.front = None
                self.runtimes[self.lang].rollback()
            # parallel mode (Alg. 1 lines 30–34): the pre-drafted chain, no drafting pass
            if self.next is not None:
                chain = self.next
            else:  # serial dynamic drafting (lines 4–13)
                chain = self._serial(ctx)
        self.next, self.chain = None, chain
        self._hand_over(chain.qs)
        # the continuation must fit max_new_tokens too
        s = min(self._s(ctx), ctx.max_depth - len(chain.tokens))
        # x1 guesses the target's next token, x2… are the next chain: ≥ 2 to be of use
        if chain.tokens and s >= 2:
            self._launch(s, ctx.temperature)
        return Proposal.chain(
            chain.tokens, self.name, chain.qs if ctx.temperature > 0 else None, self.lang, self.size
        )

    def _serial(self, ctx: DecodeState) -> _Chain:
        """Draft until Γk = Π α(conf_i) ≤ τ (Eq. 3–4) or gamma_max; the drafter first catches up on
        verified tokens."""
        rt, head = self.runtimes[self.lang], self.head()
        self.front = _Front(
            rt.sync(ctx.tokens, ctx.feats, ctx.pend), ctx.pend + 1, ctx.tokens[: ctx.pend + 1]
        )
        t0 = time.perf_counter()
        chain = self._draft(
            rt,
            head,
            self.front,
            min(self.gamma_max, ctx.max_depth),
            ctx.temperature,
            ctx.gen,
            threshold=self.spide_threshold,
        )
        # Eq. 6 needs v_q before the first parallel draft measured it
        if not self.draft_tok_s and chain.tokens:
            self.draft_tok_s = (time.perf_counter() - t0) / len(chain.tokens)
        return chain

    def _draft(
        self,
        rt,
        head,
        front: _Front,
        n: int,
        temperature: float,
        gen,
        threshold: float | None = None,
        out: _Chain | None = None,
        after=None,
    ) -> _Chain:
        """Up to n tokens after ``front`` (advanced in place), into ``out``; with a threshold, stop
        after the token that brings Γ to it or below (Alg. 1 lines 6–13). ``after()`` is called
        after each token."""
        out = _Chain() if out is None else out
        gamma_k = 1.0  # Γ_0 = 1 (line 4)
        for _ in range(n):
            # run the last drafted token: its entry's hidden state proposes the next
            if front.todo is not None:
                front.hidden = rt.extend(
                    torch.tensor([front.todo], device=self.device),
                    front.hidden.view(1, -1),
                    torch.tensor([front.pos], device=self.device),
                    prefixes=[front.prefix],
                )[-1]
                front.pos += 1
            lg = head.logits(front.hidden)  # [s] over the head's rows
            # Eq. 2: the drafter's top-1 probability
            conf = float(torch.softmax(lg.float(), -1).max())
            tok, q = self._pick(lg, head, temperature, gen)
            front.todo = tok
            front.prefix.append(tok)
            out.confs.append(conf)
            if q is not None:
                out.qs.append(q)
            out.tokens.append(tok)
            if after is not None:
                after()
            if threshold is not None:
                gamma_k *= self.spide.rate(conf)  # line 10: Γ_k = α_{b_k} Γ_{k−1}
                if gamma_k <= threshold:  # line 11: x_k stays in the chain, serial drafting stops
                    break
        return out

    def _pick(
        self, lg: torch.Tensor, head, temperature: float, gen
    ) -> tuple[int, torch.Tensor | None]:
        """The drafter's token from its logits [s]: argmax, or a draw from q = softmax(lg / T) →
        (full-vocabulary id, q over the full vocabulary [V] (zero outside the head's rows) or
        None)."""
        if temperature <= 0:
            return int(head.to_full(lg.argmax())), None
        q = torch.softmax(lg.float() / temperature, dim=-1)
        j = sample(q, gen)
        q_full = torch.zeros(self.vocab_size, dtype=torch.float32, device=q.device)
        q_full[head.ids if head.ids is not None else slice(None)] = q
        return int(head.to_full(torch.tensor(j, device=lg.device))), q_full

    def _s(self, ctx: DecodeState) -> int:
        """Eq. 6, s = ⌊v_q / v_p⌋: drafter steps per verification (running means), within [2,
        gamma_max]."""
        s = int(ctx.step_s / self.draft_tok_s) if ctx.step_s and self.draft_tok_s else 2
        return max(2, min(self.gamma_max, s))

    # -------------------------------------------------------------------------- the drafting thread
    def _launch(self, n: int, temperature: float) -> None:
        """Draft n tokens after the chain in a second thread (CUDA: on the drafter's stream), from
        ``self.front``."""
        spec = self.spec = _Spec(n)
        rt, head, front, gen = self.runtimes[self.lang], self.head(), self.front, self.spec_gen

        def work():
            spec.t0 = time.perf_counter()
            try:
                # both are per thread
                with torch.inference_mode(), self._drafter_stream(after_loop=False):
                    self._draft(
                        rt, head, front, n, temperature, gen, out=spec.chain, after=spec.first.set
                    )
                    if self.stream is not None:
                        self.stream.synchronize()  # its end is when its kernels ended
            except BaseException as e:  # noqa: BLE001 - re-raised in the loop's thread (_join)
                spec.error = e
            finally:
                spec.t1 = time.perf_counter()
                spec.first.set()

        # queued after everything the loop's stream holds now (serial drafting's reads)
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        spec.thread = threading.Thread(target=work, name="spide-parallel-draft", daemon=True)
        spec.thread.start()

    def bonus_guess(self) -> tuple[int, torch.Tensor] | None:
        """(x1, q1): the drafter's guess of the target's token after this step's chain, which the
        loop judges as one more draft (Alg. 1 line 28) when it kept the whole chain (sampling);
        waits for the drafting thread to draft x1. None without a continuation."""
        spec = self.spec
        if spec is None:
            return None
        spec.first.wait()
        if not spec.chain.qs:
            return None  # the thread failed before x1; _join re-raises its error
        self._hand_over(spec.chain.qs[:1])
        return spec.chain.tokens[0], spec.chain.qs[0]

    def _join(self, reraise: bool = True) -> _Spec | None:
        spec, self.spec = self.spec, None
        if spec is None:
            return None
        spec.thread.join()
        if spec.error is not None and reraise:
            raise spec.error
        return spec

    @contextmanager
    def _drafter_stream(self, after_loop: bool):
        """CUDA: the drafter's work goes to its own stream (``after_loop``: queued after the loop's
        stream, whose verification wrote the target features serial drafting reads). The current
        stream is per thread."""
        if self.stream is None:
            yield
            return
        if after_loop:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            yield

    def _hand_over(self, qs: list[torch.Tensor]) -> None:
        """CUDA: the loop's stream reads q's the drafter's stream computed: wait for them, and keep
        their memory from being reused by the drafter's stream while the loop's kernels may still
        read it."""
        if self.stream is None or not qs:
            return
        main = torch.cuda.current_stream(self.device)
        main.wait_stream(self.stream)
        for q in qs:
            q.record_stream(main)

    # ------------------------------------------------------------------------------------- learning
    def update(self, ctx: DecodeState, v: Verified) -> None:
        # the verification is over: from here the loop waits for the drafting
        needed = time.perf_counter()
        spec = self._join()
        chain, k = self.chain, len(self.chain.tokens)
        # every draft kept, and the target's own next token emitted
        whole = v.accepted == k and v.kept == k + 1
        hit = spec is not None and whole and ctx.tokens[ctx.pend + k + 1] == spec.chain.tokens[0]
        # Alg. 1 line 29: the chain's drafts up to the first rejection, and x1 where it was judged
        judged = chain.confs + spec.chain.confs[:1] if spec is not None and whole else chain.confs
        self.spide.update(judged, v.accepted + hit)
        if spec is not None:
            v.parallel = "hit" if hit else "drop"
            v.spec_s = spec.t1 - spec.t0
            v.hidden_s = max(0.0, min(spec.t1, needed) - spec.t0)
            if spec.chain.tokens:
                per = v.spec_s / len(spec.chain.tokens)
                self.draft_tok_s = 0.8 * self.draft_tok_s + 0.2 * per if self.draft_tok_s else per
        if hit:  # lines 30–34: stay parallel; x2…xs are the next chain, drafting goes on after xs
            self.next = _Chain(spec.chain.tokens[1:], spec.chain.confs[1:], spec.chain.qs[1:])
        # lines 35–39: drop the continuation; the drafter's cache back to its verified entries;
        # serial next
        else:
            self.next = self.front = None
            with self._drafter_stream(after_loop=False):
                self.runtimes[self.lang].rollback()
        super().update(ctx, v)
