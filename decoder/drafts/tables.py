"""The tables behind the training-free draft sources (``decoder.drafts.ngram``) and SPIDE's
acceptance table.

- ``prompt_lookup``: PLD — the longest recent n-gram (n = max..min) that occurred earlier in the
  context proposes the tokens that followed it (as transformers' ``prompt_lookup_num_tokens``).
- ``RecyclingTable``: Token Recycling / UNISPEC (papers: UNISPEC, SPECTRA): an adjacency matrix
  [|V|, k] of the verifier's top-k next tokens after each token, with their probabilities as
  confidences, refreshed from every verification forward and kept across requests. A draft tree
  grows best-first from the pending token by cumulative confidence: the first level is broadened
  (``first_width`` children), deeper nodes get ``width`` children, nodes under ``threshold`` are
  pruned, at most ``nodes`` are kept.
- ``SpideTable``: SPIDE: the drafter's top-1 confidence c in 20 intervals → measured
  acceptance rate, updated online from verification; chain drafting stops once the estimated
  probability that the next draft survives falls under a threshold (serial dynamic draft length).
"""

from __future__ import annotations

import torch

from polyspec.lookup import earlier_occurrence


def prompt_lookup(
    tokens: list[int], gamma: int, max_ngram: int = 3, min_ngram: int = 1, extend: bool = False
) -> list[int]:
    """``extend``: the copy may run past the end of the context into its own proposal (a loop of
    period p shorter than γ keeps repeating: context ``A B C A B`` proposes ``C A B C …``) instead
    of stopping there."""
    return copy_after(tokens, earlier_occurrence(tokens, max_ngram, min_ngram), gamma, extend)


def copy_after(
    tokens: list[int], found: tuple[int, int] | None, gamma: int, extend: bool = False
) -> list[int]:
    """What follows the earlier occurrence ``found`` = (start, n) of the suffix n-gram, ``gamma``
    tokens (``prompt_lookup``'s proposal; None: no occurrence, nothing)."""
    if found is None:
        return []
    start, n = found
    # never empty: the occurrence ends before the last token
    follow = tokens[start + n : start + n + gamma]
    period = len(tokens) - start - n  # proposal i copies context position len(tokens) + i - period
    while extend and len(follow) < gamma:  # past the context it copies itself
        follow.append(follow[len(follow) - period])
    return follow


class RecyclingTable:
    def __init__(self, vocab_size: int, k: int = 8):
        self.k = k
        self.adj = torch.full((vocab_size, k), -1, dtype=torch.int32)
        self.conf = torch.zeros((vocab_size, k), dtype=torch.float32)

    def update(self, inputs: list[int], logits: torch.Tensor) -> None:
        """Row ``inputs[i]`` ← top-k of the verifier's distribution after it (logits [n, V])."""
        p, j = torch.softmax(logits.float(), dim=-1).topk(self.k, dim=-1)
        self.set_rows(inputs, j, p)

    def set_rows(self, inputs: list[int], ids: torch.Tensor, probs: torch.Tensor) -> None:
        """Row ``inputs[i]`` ← (ids [n, k], probabilities [n, k]) of the verifier's top-k after
        it."""
        idx = torch.as_tensor(inputs, dtype=torch.long)
        self.adj[idx] = ids.to(torch.int32).cpu()
        self.conf[idx] = probs.float().cpu()

    def tree(
        self, root: int, nodes: int, first_width: int, width: int, depth: int, threshold: float
    ) -> tuple[list[int], list[int], list[int]]:
        """→ (tokens, parent index or -1 for the root's children, depth) of the kept nodes, parents
        first."""
        tok, parent, dep, score = [], [], [], []
        frontier = [(-1, root, 1.0, 0)]  # (node index, token, cumulative confidence, depth)
        while frontier and len(tok) < nodes:
            frontier.sort(key=lambda f: -f[2])
            node, t, s, d = frontier.pop(0)
            if d >= depth:
                continue
            w = first_width if node < 0 else width
            for c, conf in zip(self.adj[t, :w].tolist(), self.conf[t, :w].tolist()):
                cs = s * conf
                if c < 0 or cs < threshold or len(tok) >= nodes:
                    break
                tok.append(c), parent.append(node), dep.append(d + 1), score.append(cs)
                frontier.append((len(tok) - 1, c, cs, d + 1))
        return tok, parent, dep


class SpideTable:
    """Acceptance rate per confidence interval; prior = the interval's mid-point, weight one
    draft."""

    def __init__(self, bins: int = 20):
        self.bins = bins
        mid = (torch.arange(bins, dtype=torch.float64) + 0.5) / bins
        self.accepted, self.total = mid.clone(), torch.ones(bins, dtype=torch.float64)

    def _bin(self, conf: float) -> int:
        return min(int(conf * self.bins), self.bins - 1)

    def rate(self, conf: float) -> float:
        b = self._bin(conf)
        return float(self.accepted[b] / self.total[b])

    def update(self, confs: list[float], accepted: int) -> None:
        """Drafts 0..accepted-1 were kept, draft ``accepted`` (if any) was rejected; later ones were
        not judged."""
        for i, c in enumerate(confs[: accepted + 1]):
            b = self._bin(c)
            self.total[b] += 1
            self.accepted[b] += i < accepted
