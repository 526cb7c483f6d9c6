"""SPECTRA: training-free guesses from the target's own predictions and a refined corpus.

``Spectra`` proposes a guess *tree* (a trie: guesses sharing a prefix share nodes) rooted at the
pending token and learns from every verification forward; its tables persist across requests.

SPECTRA-CORE (§4.2.1)
- ``fwd`` = S_fwd: token → up to ``pool_width`` continuations (≤ N−1 tokens), most recent last
  (§5.6's W "sequences maintained per key"). Alg. 1 line 7 reads the pending token's list.
- ``bwd`` = S_bwd: n-gram (1…N−1 tokens) → next token, multi-level. Alg. 1 lines 8–14 build the
  guess u token by token: each next token comes from the longest key (k = N−1 … 1) that ends the
  context ⊕ u.
- Candidate pool (lines 26–34), adapted to a batch-1 decoder where extra verified rows are not free:
  the verifier's top-k after *every verified tree node* of the same forward plays the role of the
  pool's predicted tokens — no extra rows, no extra forward. A pool row is the N-token window ending
  at a node's predicted token (the last N−1 tokens of context ⊕ the node's path, then the
  prediction), so line 43's left shift is implicit: each step's rows are rebuilt from the verified
  context. Line 33: the argmax always enters; lines 28–31: with probability 1−τ the highest-ranked
  top-k token that S_fwd has not yet seen after this node's token enters too (coverage; only S_fwd,
  S_bwd keeps the argmax).
- Dictionary update (lines 35–41, with sub-n-grams): a row c_0…c_{L−1} adds S_fwd[c_j] ← c_{j+1:}
  for every j (line 39; a continuation that extends a stored one by a token replaces it) and
  S_bwd[key] ← c_{L−1} for every key length that ends at c_{L−2} (line 40: the paper writes the
  prefixes c_{0:j} and reaches the other key lengths through line 43's shifts; rows rebuilt each
  step write them at once). The real text (the prompt through ``observe``, the emitted tokens
  through ``update``'s ``context``) enters the same way, so CORE also covers what prompt lookup
  finds.
- Guess order (line 15): u first, then S_fwd's continuations, most recent first. The paper appends u
  after S_fwd's list and truncates to G guesses (line 17); with a *node* budget the one high-quality
  chain goes first so that a long forward list cannot crowd it out.

SPECTRA-RETRIEVAL (§4.2.2)
- ``refine_by_perplexity`` keeps the corpus sequences with the lowest per-token NLL under the target
  (``target_nll``); ``corpus_from_file`` reads the default corpus (a run's self-distilled text) or
  text.
- ``add_corpus`` indexes them in a suffix array (pydivsufsort = libdivsufsort) for prefix search:
  the longest context suffix (``retrieval_min_match`` … ``retrieval_max_match`` tokens) that occurs
  in the corpus selects continuations; their prefixes enter by frequency (REST's trie selection).
- Line 16: retrieval's guesses fill whatever node budget CORE left (internal guesses have priority).

Bounded memory: S_fwd keeps at most ``fwd_keys`` keys and S_bwd ``bwd_keys`` entries, least recently
written dropped first; the corpus keeps its newest ``corpus_tokens`` tokens.
"""

from __future__ import annotations

import json
import math
import random
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

from polyspec.errors import PolyspecError
from polyspec.io import read_jsonl


class Spectra:
    """SPECTRA guess generator: CORE (forward + backward multi-level n-gram dictionaries fed by a
    candidate pool) and RETRIEVAL (a perplexity-refined corpus in a prefix index). Tables persist
    across requests."""

    def __init__(
        self,
        vocab_size: int,
        *,
        max_ngram: int = 4,
        pool_width: int = 8,
        guess_len: int = 8,
        topk: int = 8,
        retrieval_min_match: int = 2,
        seed: int = 0,
        refine_threshold: float = 0.1,
        min_prob: float = 0.01,
        retrieval_max_match: int = 8,
        retrieval_samples: int = 16,
        fwd_keys: int = 1 << 15,
        bwd_keys: int = 1 << 17,
        corpus_tokens: int = 1 << 23,
    ):
        if max_ngram < 2 or pool_width < 1 or guess_len < 1 or topk < 1 or retrieval_min_match < 1:
            raise PolyspecError(
                "spectra: max_ngram ≥ 2, pool_width, guess_len, topk and retrieval_min_match ≥ 1"
            )
        if not 0.0 <= refine_threshold <= 1.0:
            raise PolyspecError(
                f"spectra: refine_threshold τ must be in [0, 1], not {refine_threshold}"
            )
        self.vocab_size, self.n1 = vocab_size, max_ngram - 1  # n1 = N−1: the longest S_bwd key
        self.pool_width, self.guess_len, self.topk = pool_width, guess_len, topk
        self.tau, self.min_prob = refine_threshold, min_prob
        self.min_match, self.max_match = (
            retrieval_min_match,
            max(retrieval_min_match, retrieval_max_match),
        )
        self.samples = retrieval_samples
        self.fwd_keys, self.bwd_keys, self.corpus_tokens = fwd_keys, bwd_keys, corpus_tokens
        self.fwd: OrderedDict[int, OrderedDict[tuple[int, ...], None]] = OrderedDict()  # S_fwd
        self.bwd: OrderedDict[tuple[int, ...], int] = OrderedDict()  # S_bwd
        self._rng = random.Random(seed)
        # context tokens not yet fed: the pending token, then the last step's accepted path
        self._fresh = 1
        self._seqs: list[list[int]] = []  # RETRIEVAL corpus (refined), oldest first
        # concatenated corpus, ids + 1, 0 = separator (and padding at the end)
        self._corp = array("i")
        self._sa = array("i")  # suffix array of _corp

    # ------------------------------------------------------------------------------ dictionaries
    def _add_fwd(self, key: int, cont: tuple[int, ...]) -> None:
        """Alg. 1 line 39: S_fwd[key].append(cont); cont replaces its own one-token-shorter
        prefix."""
        d = self.fwd.get(key)
        if d is None:
            d = self.fwd[key] = OrderedDict()
            if len(self.fwd) > self.fwd_keys:
                self.fwd.popitem(last=False)
        else:
            self.fwd.move_to_end(key)
        if len(cont) > 1:
            d.pop(cont[:-1], None)
        d[cont] = None
        d.move_to_end(cont)
        if len(d) > self.pool_width:
            d.popitem(last=False)

    def _add_bwd(self, tail: tuple[int, ...], token: int) -> None:
        """Alg. 1 line 40 at every key length: S_bwd[tail[-k:]] ← token, k = 1 … len(tail)."""
        bwd = self.bwd
        for k in range(1, len(tail) + 1):
            key = tail[-k:]
            bwd[key] = token
            bwd.move_to_end(key)
        while len(bwd) > self.bwd_keys:
            bwd.popitem(last=False)

    def _add_row(self, row: tuple[int, ...], backward: bool = True) -> None:
        """Lines 36–41 for one pool row c_0 … c_{L−1} whose last token is new."""
        for j in range(len(row) - 1):
            self._add_fwd(row[j], row[j + 1 :])
        if backward and len(row) > 1:
            self._add_bwd(row[:-1], row[-1])

    def observe(self, tokens: list[int]) -> None:
        """Feed known text (e.g. the prompt) into the n-gram dictionaries."""
        toks = [int(t) for t in tokens]
        n1 = self.n1
        for j in range(len(toks) - 1):
            self._add_fwd(toks[j], tuple(toks[j + 1 : j + 1 + n1]))
            self._add_bwd(tuple(toks[max(0, j + 1 - n1) : j + 1]), toks[j + 1])
        self._fresh = 1  # a new request: its first update feeds only the pending token

    def update(
        self,
        inputs: list[int],
        parents: list[int],
        top_ids: list[list[int]],
        top_probs: list[list[float]],
        accepted: list[int],
        context: list[int],
    ) -> None:
        """After one verification forward. inputs[0] = the pending token, inputs[1:] = the verified
        tree nodes; parents[i] = index into inputs of input i's parent (-1 for inputs[0]);
        top_ids[i]/top_probs[i] = the verifier's top-k next tokens (and probabilities) after
        inputs[i], from that same forward; accepted = indices into inputs of the accepted path
        (starts with 0); context = the whole token list before this step (ending with the pending
        token). Refreshes the candidate pool from the verifier's own predictions and updates the
        n-gram dictionaries (Alg. 1 lines 26–41)."""
        n1 = self.n1
        # the real text that entered the context since the last update (last step's accepted path +
        # pending)
        for e in range(max(1, len(context) - self._fresh), len(context)):
            self._add_row(tuple(context[max(0, e - n1) : e + 1]))
        self._fresh = len(accepted)
        # each input's window: the last N−1 tokens of context ⊕ its path (parents come before
        # children)
        tails: list[tuple[int, ...]] = [tuple(context[-n1:])]
        for i in range(1, len(inputs)):
            t = tails[max(0, parents[i])] + (int(inputs[i]),)
            tails.append(t[-n1:] if len(t) > n1 else t)
        # pool rows (lines 26–34), the accepted path last so that its n-grams are the most recent
        on_path = set(accepted)
        order = [i for i in range(len(inputs)) if i not in on_path] + [
            i for i in accepted if i < len(inputs)
        ]
        fwd, k = self.fwd, self.topk
        for i in order:
            ids = top_ids[i]
            if not len(ids):
                continue
            tail, best = tails[i], int(ids[0])
            # lines 28–31: an unseen token, for coverage
            if k > 1 and self._rng.random() > self.tau:
                seen = {c[0] for c in fwd.get(tail[-1], ())}
                for r in range(1, min(k, len(ids))):
                    if top_probs[i][r] < self.min_prob:
                        break
                    alt = int(ids[r])
                    if alt not in seen:
                        self._add_row(tail + (alt,), backward=False)
                        break
            self._add_row(tail + (best,))  # line 33: the argmax, then lines 39–40

    # ---------------------------------------------------------------------------------- guesses
    def backward_guess(self, context: list[int], length: int) -> list[int]:
        """Alg. 1 lines 8–14: u_j ← S_bwd[last k tokens of context ⊕ u_{0:j−1}], longest k first."""
        bwd, n1 = self.bwd, self.n1
        window = [int(t) for t in context[-n1:]]
        u: list[int] = []
        for _ in range(length):
            for k in range(min(n1, len(window)), 0, -1):
                nxt = bwd.get(tuple(window[-k:]))
                if nxt is not None:
                    break
            else:
                break  # no key of any length: u ends here
            u.append(nxt)
            window.append(nxt)
        return u

    def propose(
        self, context: list[int], max_nodes: int, max_depth: int
    ) -> tuple[list[int], list[int]]:
        """Guess tree rooted at context[-1] (the pending token: emitted, not yet verified). →
        (tokens, parents): node i's parent is parents[i] (an earlier node index) or -1 (child of the
        root). Guesses sharing a prefix share nodes (a trie). CORE's guesses first (forward
        dictionary keyed by the last token(s), backward dictionary built token by token — SPECTRA
        Alg. 1 lines 7–14), then RETRIEVAL's fill the remaining budget (line 16, internal guesses
        have priority). At most max_nodes nodes, depth ≤ max_depth. Empty lists when nothing is
        known."""
        tokens: list[int] = []
        parents: list[int] = []
        if max_nodes < 1 or max_depth < 1 or not context:
            return tokens, parents
        children: list[dict[int, int]] = [{}]  # children[node + 1]: token → node; [0] is the root

        def insert(seq) -> bool:
            """Add seq (cut at max_depth) below the root; False once the budget is spent."""
            node = -1
            for tok in seq[:max_depth]:
                nxt = children[node + 1].get(tok)
                if nxt is None:
                    if len(tokens) >= max_nodes:
                        return False
                    nxt = len(tokens)
                    tokens.append(tok), parents.append(node), children.append({})
                    children[node + 1][tok] = nxt
                node = nxt
            return True

        # CORE, lines 7–15: the backward guess u, then the forward dictionary's continuations
        # (newest first)
        u = self.backward_guess(context, min(self.guess_len, max_depth))
        if u and not insert(u):
            return tokens, parents
        for cont in reversed(self.fwd.get(int(context[-1]), ())):
            if not insert(cont):
                return tokens, parents
        # RETRIEVAL, line 16: fill the remaining budget
        if len(tokens) < max_nodes and len(self._sa):
            for prefix in self._retrieve(context, min(self.guess_len, max_depth)):
                if not insert(prefix):
                    break
        return tokens, parents

    # --------------------------------------------------------------------------------- retrieval
    def add_corpus(self, sequences: list[list[int]]) -> None:
        """RETRIEVAL: index already-refined token sequences for prefix search."""
        import numpy as np
        from pydivsufsort import divsufsort

        self._seqs.extend([int(t) for t in s] for s in sequences if len(s))
        total, keep = 0, len(self._seqs)
        while keep > 0 and total + len(self._seqs[keep - 1]) + 1 <= self.corpus_tokens:
            keep -= 1
            total += len(self._seqs[keep]) + 1
        self._seqs = self._seqs[keep:]  # the newest sequences that fit the cap
        if not self._seqs:
            self._corp, self._sa = array("i"), array("i")
            return
        parts = []
        for s in self._seqs:
            parts.append(np.asarray(s, dtype=np.int64) + 1)  # ids + 1: 0 separates sequences
            parts.append(np.zeros(1, dtype=np.int64))
        parts.append(np.zeros(self.max_match + 1, dtype=np.int64))  # s + k stays inside the array
        corp = np.concatenate(parts)
        if corp.max() >= 2**31 - 1:
            raise PolyspecError("spectra: corpus token ids must be < 2**31 - 1")
        sa = divsufsort(corp.astype(np.uint32))
        self._corp = array("i", corp.astype(np.int32).tobytes())
        self._sa = array("i", sa.astype(np.int32).tobytes())

    def _range(self, pattern: list[int]) -> tuple[int, int]:
        """Suffix-array rows [lo, hi) whose suffixes start with pattern (ids, not yet + 1)."""
        corp, sa = self._corp, self._sa
        lo, hi = 0, len(sa)
        for k, t in enumerate(pattern):

            def key(s, k=k):
                return corp[s + k]

            lo = bisect_left(sa, t + 1, lo, hi, key=key)
            hi = bisect_right(sa, t + 1, lo, hi, key=key)
            if lo >= hi:
                break
        return lo, hi

    def _retrieve(self, context: list[int], length: int) -> list[tuple[int, ...]]:
        """Continuation prefixes of the longest context suffix found in the corpus, most frequent
        first."""
        ctx = [int(t) for t in context[-self.max_match :]]
        best, lo_m, hi_m = None, self.min_match, min(self.max_match, len(ctx))
        # occurrence is monotone in the suffix length: binary search the longest
        while lo_m <= hi_m:
            m = (lo_m + hi_m) // 2
            lo, hi = self._range(ctx[-m:])
            if lo < hi:
                best, lo_m = (m, lo, hi), m + 1
            else:
                hi_m = m - 1
        if best is None:
            return []
        m, lo, hi = best
        step = max(1, (hi - lo) // self.samples)
        counts: Counter[tuple[int, ...]] = Counter()
        corp, sa = self._corp, self._sa
        for r in range(lo, hi, step)[: self.samples]:
            s = sa[r] + m
            cont = []
            for t in corp[s : s + length]:
                if t == 0:
                    break
                cont.append(t - 1)
            for d in range(1, len(cont) + 1):
                counts[tuple(cont[:d])] += 1
        # a prefix counts at least as often as its extensions: (count ↓, length ↑) puts parents
        # first
        return sorted(counts, key=lambda p: (-counts[p], len(p)))

    # ------------------------------------------------------------------------------------- misc
    def table_sizes(self) -> dict[str, int]:
        return {
            "fwd_keys": len(self.fwd),
            "fwd_entries": sum(len(d) for d in self.fwd.values()),
            "bwd_keys": len(self.bwd),
            "corpus_sequences": len(self._seqs),
            "corpus_tokens": len(self._corp),
        }


def refine_by_perplexity(
    sequences: list[list[int]], nll: list[float], keep: float
) -> list[list[int]]:
    """RETRIEVAL's corpus refinement: keep the `keep` fraction of sequences with the lowest
    per-token NLL."""
    if len(sequences) != len(nll):
        raise PolyspecError(
            f"refine_by_perplexity: {len(sequences)} sequences but {len(nll)} NLL values"
        )
    if not 0.0 < keep <= 1.0:
        raise PolyspecError(f"refine_by_perplexity: keep must be in (0, 1], not {keep}")
    if not sequences:
        return []
    n = max(1, round(keep * len(sequences)))
    order = sorted(range(len(sequences)), key=lambda i: (math.isnan(nll[i]), nll[i]))  # NaN: worst
    chosen = sorted(order[:n])
    return [sequences[i] for i in chosen]  # corpus order kept


def _read_texts(path: Path) -> list[tuple[str, float | None]]:
    """(text, nll) of a JSONL file (synth records: `conversations` gpt turns, or `text`); torn lines
    are skipped and counted (``polyspec.io.read_jsonl``). ``nll``: a gpt turn's recorded NLL
    (``synth distill`` writes the target's own per-token NLL of the answer it generated, given the
    prompt), else None."""
    texts = []
    for rec in read_jsonl(path):
        conv = rec.get("conversations")
        if isinstance(conv, list):
            texts += [
                (t["value"], _finite(t.get("nll")))
                for t in conv
                if isinstance(t, dict)
                and t.get("from") in ("gpt", "assistant")
                and isinstance(t.get("value"), str)
            ]
        elif isinstance(rec.get("text"), str):
            texts.append((rec["text"], None))
    return texts


def _finite(x) -> float | None:
    return (
        float(x)
        if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
        else None
    )


def corpus_from_file(
    path, tokenizer, max_sequences: int
) -> tuple[list[list[int]], list[float | None]]:
    """Default corpus: a run's self-distilled text (synth JSONL records: `conversations` gpt values
    or `text`), or any plain text file (one document per blank-line-separated block) → (sequences,
    per sequence the NLL its record carries, None where none was recorded)."""
    p = Path(path)
    if not p.is_file():
        raise PolyspecError(f"spectra corpus not found: {p}")
    if p.suffix in (".jsonl", ".json"):
        texts = _read_texts(p)
    else:
        blocks = p.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n").split("\n\n")
        texts = [(b.strip(), None) for b in blocks]
    texts = [t for t in texts if t[0].strip()][: max(0, max_sequences)]
    if not texts:
        return [], []
    ids = tokenizer([t for t, _ in texts], add_special_tokens=False)["input_ids"]
    kept = [(list(s), nll) for s, (_, nll) in zip(ids, texts) if len(s)]
    return [s for s, _ in kept], [nll for _, nll in kept]


def target_nll(
    target: Any, sequences: list[list[int]], batch_size: int = 8, max_len: int = 512
) -> list[float]:
    """Per-token mean negative log-likelihood of each sequence under target.model
    (torch.inference_mode). Sequences are scored after the tokenizer's BOS (when it has one) and cut
    at ``max_len`` tokens; an empty sequence scores +inf. Batches (≤ batch_size sequences of similar
    length, and few enough tokens that the [B, T, |V|] logits stay small) are right-padded: causal,
    so padding never changes a real position."""
    import torch
    import torch.nn.functional as F

    model, tok = target.model, target.tokenizer
    bos = getattr(tok, "bos_token_id", None)
    pad = tok.pad_token_id if getattr(tok, "pad_token_id", None) is not None else 0
    device = target.device
    out = [math.inf] * len(sequences)
    rows = [([bos] if bos is not None else []) + [int(t) for t in s[:max_len]] for s in sequences]
    order = sorted(
        (i for i in range(len(rows)) if len(sequences[i]) and len(rows[i]) >= 2),
        key=lambda i: len(rows[i]),
    )
    # tokens per forward: logits stay ≤ ~0.5 GB
    budget = max(1, (1 << 27) // max(1, target.vocab_size))
    batches, cur = [], []
    for i in order:  # ascending length: the last row is the widest
        if cur and (len(cur) >= batch_size or (len(cur) + 1) * len(rows[i]) > budget):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    with torch.inference_mode():
        for idx in batches:
            width = len(rows[idx[-1]])
            ids = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):
                ids[r, : len(rows[i])] = torch.tensor(rows[i])
                mask[r, : len(rows[i])] = 1
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
            for r, i in enumerate(idx):
                n = len(rows[i])
                out[i] = float(
                    F.cross_entropy(logits[r, : n - 1].float(), ids[r, 1:n].to(logits.device))
                )
    return out


def refined_corpus(
    target: Any,
    files: list[Path],
    keep: float = 0.5,
    max_sequences: int = 400,
    log=lambda msg: None,
) -> tuple[list[list[int]], int]:
    """RETRIEVAL's default corpus, refined: the sequences of ``files`` (``max_sequences`` per file)
    whose perplexity under the target is in the lowest ``keep`` fraction → (kept sequences,
    sequences scored).

    When every sequence carries the NLL its distillation recorded (``synth distill``: the target's
    per-token NLL of its own answer, given the prompt, taken from the generating forwards), those
    rank the corpus and no target forward runs; otherwise every sequence is scored here
    (``target_nll``: the text alone after BOS), so one ranking never mixes the two measures. Scoring
    costs one target forward per few sequences (514 s for 400 × 7 files on a 2-core CPU in bf16), so
    the result is cached on disk: ``<polyspec cache>/spectra/<key>.json``, the key a sha256 of the
    target's pin and dtype, the files' contents and the two settings — a changed corpus or target is
    scored afresh; the file is written atomically and a broken one is ignored."""
    import hashlib

    from polyspec.io import atomic_write_json, read_json_or_none, sha256_file
    from polyspec.paths import cache_dir

    files = [Path(f) for f in files if Path(f).is_file()]
    if not files:
        return [], 0
    spec = target.spec
    ident = {
        "v": 1,
        "target": target.pin(),
        "model": [spec.model_id, spec.revision, str(target.path)],
        "dtype": str(target.dtype),
        "keep": keep,
        "max_sequences": max_sequences,
        # the suffix decides how a file is read
        "files": [[sha256_file(f), f.suffix] for f in files],
    }
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]
    path = cache_dir() / "spectra" / f"{key}.json"
    cached = read_json_or_none(path) if path.is_file() else None
    if (
        isinstance(cached, dict)
        and cached.get("ident") == ident
        and isinstance(cached.get("kept"), list)
    ):
        log(f"spectra: refined corpus read from {path}")
        return [[int(t) for t in s] for s in cached["kept"]], int(cached.get("scored", 0))
    seqs, recorded = [], []
    for f in files:
        s, n = corpus_from_file(f, target.tokenizer, max_sequences=max_sequences)
        seqs += s
        recorded += n
    if seqs and all(n is not None for n in recorded):
        log(
            f"spectra: ranking {len(seqs)} sequences by the NLL their distillation recorded (no "
            "scoring pass)"
        )
        nll = recorded
    else:
        nll = target_nll(target, seqs) if seqs else []
    kept = refine_by_perplexity(seqs, nll, keep=keep) if seqs else []
    try:
        atomic_write_json(path, {"ident": ident, "scored": len(seqs), "kept": kept}, indent=None)
    except OSError as e:  # a read-only cache costs time, not correctness
        log(f"spectra: could not cache the refined corpus at {path}: {e}")
    return kept, len(seqs)
