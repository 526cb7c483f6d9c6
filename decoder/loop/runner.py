"""The frozen target as the decoder drives it: one KV cache, forwards that return both the last
hidden states (EAGLE features) and the full-vocabulary logits, and cache rollback (chain) or gather
(tree).

The cache holds every token except the *pending* one (the last emitted token, not yet run through
the target). A step runs [pending, drafts…] in one forward; afterwards the cache keeps pending plus
the accepted drafts and the bonus token becomes the new pending.
"""

from __future__ import annotations

import torch

from polyspec.packed import PackedLinear


class TargetRunner:
    def __init__(self, target):
        from transformers import DynamicCache

        self.model = target.model
        self.base = target.model.get_decoder()
        self.head = target.model.get_output_embeddings()
        cfg = target.model.config
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        # Gemma3-style local layers: a custom 4D (tree) mask is only right while everything fits the
        # window
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        types = getattr(text_cfg, "layer_types", None) or []
        self.sliding_window = (
            getattr(text_cfg, "sliding_window", None) if "sliding_attention" in types else None
        )
        self._cache_cls = DynamicCache
        self.cache = None
        self.forwards = 0
        # EAGLE-3 drafters read these layers instead of the last
        self.aux_layers: list[int] | None = None
        # MKL's fp32 head GEMM (an unpacked ``nn.Linear``) is pathological at 2–3 rows on CPU: pad
        # those to 8 polyspec.packed: flat from 1 row, nothing to pad
        packed = isinstance(self.head, PackedLinear)
        cpu_fp32 = self.head.weight.device.type == "cpu" and self.head.weight.dtype == torch.float32
        self.pad_rows = 8 if cpu_fp32 and not packed else 0
        self._mask, self._mask_dirty = None, None

    def reset(self) -> None:
        self.cache = self._cache_cls(config=self.model.config)
        self.cache.activate_past_recording()  # sliding layers keep enough past to be cropped back
        self.forwards = 0
        self._mask_dirty = None
        if self._mask is not None:
            self._mask.zero_()

    @property
    def length(self) -> int:
        return self.cache.get_seq_length() if self.cache is not None else 0

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Head logits [n, V] in the head's dtype (argmax reads them as they are; samplers and
        n-gram tables convert the rows they read). An unpacked fp32 head GEMM is pathological at 2–3
        rows on CPU, so there small row counts are zero-padded to ``pad_rows`` (evidence:
        docs/experiments.md#the-fp32-head-gemm-at-2-3-rows)."""
        n = h.shape[0]
        if self.pad_rows and 1 < n < self.pad_rows:
            h = torch.cat([h, h.new_zeros(self.pad_rows - n, h.shape[1])])
        out = self.head(h)[:n]
        if self.softcap:
            out = torch.tanh(out.float() / self.softcap) * self.softcap
        return out

    @torch.inference_mode()
    def forward(
        self,
        ids: list[int] | torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        logits_for: slice | None = None,
        features: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``ids`` after the cache → (features [n, H] — or [n, 3H], the ``aux_layers``
        concatenated —, logits [n or sliced, V]). ``features=False``: nobody reads them (no extra
        hidden states kept)."""
        dev = self.head.weight.device
        x = torch.as_tensor(ids, dtype=torch.long, device=dev).view(1, -1)
        if position_ids is None:
            position_ids = torch.arange(self.length, self.length + x.shape[1], device=dev).view(
                1, -1
            )
        aux = bool(self.aux_layers) and features
        self._trim_sliding()
        out = self.base(
            input_ids=x,
            position_ids=position_ids,
            attention_mask=attention_mask,
            past_key_values=self.cache,
            use_cache=True,
            output_hidden_states=aux,
        )
        self.forwards += 1
        h = out.last_hidden_state[0]
        logits = self.logits(h if logits_for is None else h[logits_for])
        if aux:
            h = torch.cat([out.hidden_states[i][0] for i in self.aux_layers], dim=-1)
        return h, logits

    def _trim_sliding(self) -> None:
        """Sliding layers record their past (so a rejected draft can be cropped even past the
        window) until a crop trims them back to ``sliding_window - 1``; an AR step crops nothing, so
        trim here, before the next forward (a rollback only ever follows the forward it undoes).
        transformers 5.17 returns an untrimmed layer's whole past to attention while its mask covers
        the window (sizes 65 vs 64); later versions slice it themselves."""
        if self.sliding_window is None or self.cache is None:
            return
        for layer in self.cache.layers:
            if (
                getattr(layer, "is_sliding", False)
                and getattr(layer, "is_initialized", False)
                and layer.keys.shape[-2] >= layer.sliding_window
            ):
                layer.keys = layer.keys[:, :, -layer.sliding_window + 1 :]
                layer.values = layer.values[:, :, -layer.sliding_window + 1 :]

    def rollback(self, n: int) -> None:
        """Drop the last ``n`` cached tokens (rejected drafts); also trims sliding layers to their
        window."""
        self.cache.crop(-n)

    def keep(self, prefix: int, indices: list[int]) -> None:
        """Tree: keep the first ``prefix`` cached tokens plus the tree tokens at ``indices`` (in
        order): the kept rows are copied down in place (only tree-sized slices move) and the rest is
        cropped."""
        m = len(indices)
        if indices == list(range(m)):  # a chain-shaped accept: nothing to move
            self.cache.crop(-(self.length - prefix - m))
            return
        idx = torch.tensor(indices, dtype=torch.long, device=self.head.weight.device) + prefix
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            layer.keys[:, :, prefix : prefix + m] = layer.keys.index_select(2, idx)
            layer.values[:, :, prefix : prefix + m] = layer.values.index_select(2, idx)
        self.cache.crop(-(self.length - prefix - m))

    def tree_mask(self, prefix: int, parents: list[int]) -> torch.Tensor:
        """Additive 4D mask [1, 1, n, prefix + n]: node i sees the prefix, its ancestors
        (``tree_block``) and itself; written into a buffer kept across steps: only the n×n tree
        block is written per step (the prefix columns stay zero = visible)."""
        n, dtype, dev = len(parents), self.head.weight.dtype, self.head.weight.device
        need = (n, prefix + n)
        buf = self._mask
        if buf is None or buf.shape[2] < need[0] or buf.shape[3] < need[1]:
            rows, cols = max(need[0], 32), max(need[1] * 2, 1024)
            buf = self._mask = torch.zeros((1, 1, rows, cols), dtype=dtype, device=dev)
        elif self._mask_dirty is not None:  # clear the previous step's tree block
            p0, n0 = self._mask_dirty
            buf[:, :, :n0, p0 : p0 + n0] = 0
        block = tree_block(parents)
        buf[0, 0, :n, prefix : prefix + n] = torch.zeros(
            (n, n), dtype=dtype, device=dev
        ).masked_fill_(~block.to(dev), torch.finfo(dtype).min)
        self._mask_dirty = (prefix, n)
        return buf[:, :, :n, : prefix + n]

    def tree_fits(self, extra: int) -> bool:
        """Whether a tree of ``extra`` tokens can be verified with a custom mask at the current
        length."""
        return self.sliding_window is None or self.length + extra < self.sliding_window - 1


def tree_block(parents: list[int]) -> torch.Tensor:
    """bool [n, n]: node i sees its ancestors and itself (``parents[i]``: index among the n nodes,
    -1 root)."""
    n = len(parents)
    allowed = torch.zeros((n, n), dtype=torch.bool)
    for i, p in enumerate(parents):
        allowed[i, i] = True
        if p >= 0:
            allowed[i] |= allowed[p]
    return allowed


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """bool [q, k] (True = may attend) → the additive 4D mask [1, 1, q, k] transformers takes."""
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.view(1, 1, *allowed.shape).to(device)
