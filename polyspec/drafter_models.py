"""Drafter models and their on-disk form, shared by train (builds and saves them), export and
decoder (load them) — ``load_drafter`` is the one public way to rebuild one.

- ``eagle`` (:class:`EagleDrafter`): input [embed(x_{t+1}) ‖ f_t] → fc(2H→H) → one decoder layer of
  the target's own family (``eagle.num_layers``: several; the target's base model cut to that many
  full-attention layers: Gemma3, Llama, Qwen2, …; rotary, masks and KV cache come with it) →
  predicted feature f̂_{t+1}. The frozen target embedding and LM head are *not* part of the drafter;
  at use time the head is restricted to the language's top-s ids.
  ``eagle.lookup_hint``: the fc output also gets hint_fc(embed(h)) + strength(n) — (h, n) the
  prompt-lookup hint of the entry's token prefix (``polyspec.lookup``) — and the output gate(n) ·
  hint_out(embed(h)), so the drafter learns when prompt lookup's next token is right instead of
  learning to copy through attention.
- ``small-lm``: a tiny Llama-family causal LM with the target's tokenizer and exactly its
  ``vocab_size``; tied embeddings initialised from the target's embedding, projected onto its top
  principal directions when the widths differ (PCA keeps the most variance of the target's token
  geometry), rescaled to the usual init scale.

A drafter folder holds ``config.json`` (``drafter_type`` discriminator, architecture, the target pin
and the vocabulary it was trained with) and ``model.safetensors`` (drafter weights only).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    eager_attention_forward,
)

from polyspec.drafter_kind import DrafterKind
from polyspec.errors import PolyspecError, first_line
from polyspec.io import atomic_directory, atomic_write_json
from polyspec.lookup import STRENGTHS
from polyspec.targets import eagle3_layers, text_config

DRAFTER_FORMAT = 1


def eagle_layer_config(target_config, num_layers: int = 1) -> Any:
    """The target's own config cut to ``num_layers`` full-attention decoder layers and a stub
    vocabulary."""
    cfg = copy.deepcopy(text_config(target_config))
    cfg.num_hidden_layers = num_layers
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = ["full_attention"] * num_layers
    cfg.vocab_size = 8  # the drafter never embeds ids itself: the frozen target embedding does
    for attr in ("pad_token_id", "bos_token_id", "eos_token_id"):
        setattr(cfg, attr, None)
    cfg.tie_word_embeddings = False
    cfg.use_cache = True
    for attr in ("quantization_config", "_name_or_path"):
        if hasattr(cfg, attr):
            delattr(cfg, attr)
    return cfg


def attention_bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool (True: may attend) → the additive mask of the same shape (0 or dtype's lowest)
    transformers takes."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )


def gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x [B, L, ·] at rows [B, N] (-1 reads entry 0) → [B, N, ·]."""
    rows = rows.clamp_min(0)
    return x.gather(
        1, rows.view(*rows.shape, *([1] * (x.dim() - 2))).expand(*rows.shape, *x.shape[2:])
    )


class EagleDrafter(nn.Module):
    drafter_type = "eagle"
    arch_name: DrafterKind = DrafterKind.EAGLE1  # what DrafterKind.of(model) reads

    def __init__(self, layer_config, lookup_hint: bool = False):
        super().__init__()
        self.layer_config = layer_config
        h = layer_config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.layer = AutoModel.from_config(layer_config)  # one decoder layer of the target's family
        # inputs arrive as embeddings; an unused parameter would also stall DDP
        self.layer.embed_tokens = None
        self.lookup_hint = lookup_hint
        # polyspec.lookup: the token prompt lookup proposes next; its n-gram length, last hit
        if lookup_hint:
            self.hint_fc = nn.Linear(h, h, bias=False)
            self.hint_strength = nn.Embedding(STRENGTHS, h)
            nn.init.zeros_(self.hint_strength.weight)
            # and a copy path past the layer: the output also gets gate(strength) ·
            # hint_out(unit-RMS hint embedding), a direction the head maps onto the hint (identity
            # at the start: a tied head's row of the hint itself)
            self.hint_out = nn.Linear(h, h, bias=False)
            nn.init.eye_(self.hint_out.weight)
            self.hint_gate = nn.Embedding(STRENGTHS, 1)
            nn.init.zeros_(self.hint_gate.weight)

    @property
    def hidden_size(self) -> int:
        return self.fc.out_features

    def forward(
        self,
        input_embeds,
        features,
        position_ids=None,
        attention_mask=None,
        past_key_values=None,
        use_cache=False,
        hints=None,
    ):
        """input_embeds, features: [B, T, H] → predicted next features [B, T, H] (and the KV cache).
        ``hints`` (``lookup_hint`` drafters): (embedded hint ids [B, T, H], zero where there is
        none; strengths [B, T] long), :func:`polyspec.lookup.hint_inputs` of the entries'
        prefixes."""
        x = self.fc(torch.cat([input_embeds, features.to(input_embeds.dtype)], dim=-1))
        if self.lookup_hint:
            if hints is None:
                raise PolyspecError(
                    "this EAGLE drafter reads prompt-lookup hints (eagle.lookup_hint): pass hints="
                )
            x = x + self.hint_fc(hints[0].to(x.dtype)) + self.hint_strength(hints[1]).to(x.dtype)
        out = self.layer(
            inputs_embeds=x,
            position_ids=position_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
        pred = out.last_hidden_state
        if self.lookup_hint:
            e = hints[0].to(pred.dtype)
            # zero where there is no hint
            unit = e * torch.rsqrt(e.pow(2).mean(-1, keepdim=True) + 1e-6)
            pred = pred + self.hint_gate(hints[1]).to(pred.dtype) * self.hint_out(unit)
        return pred, out.past_key_values

    def arch(self) -> dict:
        return {"layer_config": self.layer_config.to_dict(), "lookup_hint": self.lookup_hint}

    @classmethod
    def from_arch(cls, arch: dict) -> EagleDrafter:
        d = dict(arch["layer_config"])
        return cls(
            AutoConfig.for_model(d.pop("model_type"), **d),
            lookup_hint=bool(arch.get("lookup_hint", False)),
        )


def copy_target_layer(drafter: EagleDrafter, target_model) -> int:
    """Start an EAGLE-1 drafter's decoder layer and final norm as the target's last full-attention
    layer and its final norm (same family, same shapes: ``eagle_layer_config``). → the index of the
    layer copied."""
    base = target_model.get_decoder()
    types = getattr(text_config(target_model.config), "layer_types", None) or []
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    idx = full[-1] if full else len(base.layers) - 1
    for dst, src in ((drafter.layer.layers[0], base.layers[idx]), (drafter.layer.norm, base.norm)):
        dst.load_state_dict({k: v.float().cpu() for k, v in src.state_dict().items()}, strict=True)
    return idx


class Eagle3Drafter(nn.Module):
    """EAGLE-3 form, as speculators' ``Eagle3DraftModel`` and vLLM's eagle3 compute it
    (``norm_before_residual`` false; ``export.interop.write_speculators``): g = fc([h_low ‖ h_mid ‖
    h_high]) fuses three distinct target layers (``aux_layers``, indices into
    ``output_hidden_states``); one Llama layer whose attention reads [input_norm(embed(x)) ‖
    hidden_norm(g)] (2H → heads), residual g; ``norm`` → its own ``lm_head`` over the draft
    vocabulary ``draft_ids`` (the language's top-s ids, initialised from the target head's rows, so
    row order = rank order and a size s' < s is the first s' rows). Unrolled steps feed the last
    layer's pre-norm output back as g (training-time test).

    ``num_layers`` > 1 (``eagle.num_layers``): the first layer as above, then ordinary pre-norm
    Llama decoder layers on its hidden state (H → heads, no embedding input), ``layers.1``,
    ``layers.2``, … — the layout and names of speculators' and vLLM's multi-layer eagle3 (their
    ``layers.0`` is the first layer: ``export.interop`` renames it). One layer has no ``layers``
    entries: its parameters, outputs and saved files are those of the one-layer form."""

    drafter_type = "eagle"
    arch_name: DrafterKind = DrafterKind.EAGLE3

    def __init__(
        self,
        layer_config,
        target_hidden_size: int,
        aux_layers: list[int],
        draft_vocab_size: int,
        num_layers: int = 1,
    ):
        super().__init__()
        if num_layers < 1:
            raise PolyspecError(f"an EAGLE-3 drafter has at least one layer, not {num_layers}")
        c = self.layer_config = layer_config
        # a standalone layer: pick the kernel
        c._attn_implementation = c._attn_implementation or "sdpa"
        H, eps = c.hidden_size, c.rms_norm_eps
        self.target_hidden_size, self.aux_layers = target_hidden_size, list(aux_layers)
        self.fc = nn.Linear(3 * target_hidden_size, H, bias=False)
        self.input_layernorm, self.hidden_norm = LlamaRMSNorm(H, eps=eps), LlamaRMSNorm(H, eps=eps)
        self.self_attn = LlamaAttention(c, layer_idx=0)
        hd = self.self_attn.head_dim
        self.self_attn.q_proj = nn.Linear(2 * H, c.num_attention_heads * hd, bias=False)
        self.self_attn.k_proj = nn.Linear(2 * H, c.num_key_value_heads * hd, bias=False)
        self.self_attn.v_proj = nn.Linear(2 * H, c.num_key_value_heads * hd, bias=False)
        self.post_attention_layernorm = LlamaRMSNorm(H, eps=eps)
        self.mlp = LlamaMLP(c)
        self.norm = LlamaRMSNorm(H, eps=eps)
        self.rotary = LlamaRotaryEmbedding(c)
        self.lm_head = nn.Linear(H, draft_vocab_size, bias=False)
        self.register_buffer("draft_ids", torch.zeros(draft_vocab_size, dtype=torch.long))
        # the layers after the first, keyed by their index among the drafter's layers (empty for
        # one layer; built last, so a one-layer drafter draws its init as before)
        self.layers = nn.ModuleDict(
            {str(i): LlamaDecoderLayer(c, layer_idx=i) for i in range(1, num_layers)}
        )

    @property
    def hidden_size(self) -> int:
        return self.fc.out_features

    @property
    def draft_vocab_size(self) -> int:
        return self.lm_head.out_features

    @property
    def num_layers(self) -> int:
        """Decoder layers: the first (2H input) and ``layers``."""
        return 1 + len(self.layers)

    @classmethod
    def for_target(
        cls,
        target,
        draft_ids: torch.Tensor,
        aux_layers: list[int] | None = None,
        num_layers: int = 1,
    ) -> Eagle3Drafter:
        t = text_config(target.model.config)
        n = t.num_hidden_layers
        aux = aux_layers or eagle3_layers(n)  # vLLM's default for EAGLE-3
        cfg = LlamaConfig(
            hidden_size=t.hidden_size,
            intermediate_size=t.intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=t.num_attention_heads,
            num_key_value_heads=t.num_key_value_heads,
            head_dim=getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads,
            rms_norm_eps=t.rms_norm_eps,
            max_position_embeddings=t.max_position_embeddings,
            vocab_size=target.vocab_size,
            tie_word_embeddings=False,
        )
        model = cls(cfg, t.hidden_size, aux, len(draft_ids), num_layers=num_layers)
        with torch.no_grad():
            ids = draft_ids.to(target.model.get_output_embeddings().weight.device)
            model.lm_head.weight.copy_(
                target.model.get_output_embeddings().weight[ids].float().cpu()
            )
            model.draft_ids.copy_(draft_ids.cpu())
        return model

    @torch.no_grad()
    def rehead(self, draft_ids: torch.Tensor, target_head: torch.Tensor) -> int:
        """Another draft vocabulary for this drafter: the head's row of an id both vocabularies hold
        moves to the id's new place, a new id's row is the target head's (``target_head`` [|V|, H]).
        Returns the rows kept."""
        old = {int(t): j for j, t in enumerate(self.draft_ids.tolist())}
        w = target_head[draft_ids.to(target_head.device)].detach().float().cpu().clone()
        src = torch.tensor([old.get(int(t), -1) for t in draft_ids.tolist()], dtype=torch.long)
        hit = src >= 0
        w[hit] = self.lm_head.weight.detach().float().cpu()[src[hit]]
        self.lm_head = nn.Linear(
            self.hidden_size, len(draft_ids), bias=False, dtype=self.lm_head.weight.dtype
        )
        self.lm_head.weight.copy_(w)
        self.draft_ids = draft_ids.detach().cpu().long().clone()
        return int(hit.sum())

    def forward(
        self,
        input_embeds,
        features,
        position_ids=None,
        attention_mask=None,
        past_key_values=None,
        use_cache=False,
        query_rows=None,
    ):
        """features [B, T, 3H] (target layers: fused by fc) or [B, T, H] (own previous outputs) →
        the last layer's pre-norm hidden [B, T, H] (and the KV cache: one entry per layer, every
        layer's keys at the same entries, so ``crop`` and ``get_seq_length`` work as for one).

        ``query_rows`` [B, N] long (training; an empty cache, causal attention): the output only at
        those entries (-1: none, its row is padding) → [B, N, H]. Every entry still gives its keys
        and values, but the last layer's query, attention output, o_proj and MLP run on the N rows
        alone — a finetune's loss reads ~60 % of the rows (the layers before it run every entry:
        the next layer's keys read them)."""
        g = features.to(input_embeds.dtype)
        if g.shape[-1] == 3 * self.target_hidden_size:
            g = self.fc(g)
        if query_rows is not None:
            return self._forward_rows(
                input_embeds, g, position_ids, query_rows, past_key_values if use_cache else None
            )
        B, T, _ = input_embeds.shape
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=g.device).unsqueeze(0)
        # causal over cache + new, plus key padding
        if attention_mask is None or attention_mask.dim() == 2:
            allowed = torch.ones((T, past + T), dtype=torch.bool, device=g.device).tril(
                diagonal=past
            )
            allowed = allowed.view(1, 1, T, past + T).expand(B, 1, T, past + T)
            if attention_mask is not None:
                allowed = allowed & attention_mask.bool()[:, None, None, -(past + T) :]
            attention_mask = attention_bias(allowed, g.dtype)
        cache = past_key_values if use_cache else None
        position_embeddings = self.rotary(g, position_ids)
        x = torch.cat([self.input_layernorm(input_embeds), self.hidden_norm(g)], dim=-1)
        attn, _ = self.self_attn(
            x,
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            past_key_values=cache,
        )
        h = g + attn
        h = h + self.mlp(self.post_attention_layernorm(h))
        for layer in self.layers.values():
            h = _decoder_layer(layer, h, position_embeddings, attention_mask, cache)
        return h, cache

    def _forward_rows(self, input_embeds, g, position_ids, query_rows, cache):
        """:meth:`forward` at ``query_rows`` only: the last layer's attention is LlamaAttention's,
        its query rows gathered (:meth:`_attend_rows`); the layers before it run every entry."""
        if cache is not None and cache.get_seq_length() > 0:
            raise PolyspecError("query_rows: the drafter's first pass only (an empty KV cache)")
        B, T, _ = input_embeds.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=g.device).unsqueeze(0)
        # a padding row, -1, reads entry 0; never used
        take = lambda x: gather_rows(x, query_rows)  # noqa: E731
        x = torch.cat([self.input_layernorm(input_embeds), self.hidden_norm(g)], dim=-1)
        cos, sin = self.rotary(g, position_ids)
        cos, sin = cos.expand(B, -1, -1), sin.expand(B, -1, -1)
        if not self.layers:  # one layer: its query rows alone
            out = self._attend_rows(self.self_attn, x, cos, sin, query_rows, cache)
            h = take(g) + out
            h = h + self.mlp(self.post_attention_layernorm(h))
            return h, cache
        # every entry through the layers before the last (causal over the T entries)
        causal = torch.ones((T, T), dtype=torch.bool, device=g.device).tril()
        mask = attention_bias(causal, g.dtype).view(1, 1, T, T).expand(B, 1, T, T)
        attn, _ = self.self_attn(
            x, position_embeddings=(cos, sin), attention_mask=mask, past_key_values=cache
        )
        h = g + attn
        h = h + self.mlp(self.post_attention_layernorm(h))
        *before, last = self.layers.values()
        for layer in before:
            h = _decoder_layer(layer, h, (cos, sin), mask, cache)
        out = self._attend_rows(
            last.self_attn, last.input_layernorm(h), cos, sin, query_rows, cache
        )
        h = take(h) + out
        return h + last.mlp(last.post_attention_layernorm(h)), cache

    def _attend_rows(self, a, x, cos, sin, query_rows, cache) -> torch.Tensor:
        """Attention ``a`` over the entries of ``x`` [B, T, ·] (its input, normed), queried at
        ``query_rows`` [B, N] only (causal; keys and values of every entry, into ``cache`` at
        ``a.layer_idx``) → o_proj's output [B, N, H]. ``cos``, ``sin`` [B, T, head_dim]."""
        (B, T, _), rows = x.shape, query_rows.clamp_min(0)
        take = lambda t: gather_rows(t, query_rows)  # noqa: E731
        q = a.q_proj(take(x)).view(B, rows.shape[1], -1, a.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(B, T, -1, a.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(B, T, -1, a.head_dim).transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, take(cos), take(sin))
        _, k = apply_rotary_pos_emb(k, k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, a.layer_idx)
        # causal
        mask = attention_bias(
            torch.arange(T, device=x.device).view(1, 1, T) <= rows.unsqueeze(-1), q.dtype
        )
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.layer_config._attn_implementation, eager_attention_forward
        )
        out, _ = attend(a, q, k, v, mask.unsqueeze(1), dropout=0.0, scaling=a.scaling)
        return a.o_proj(out.reshape(B, rows.shape[1], -1).contiguous())

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Pre-norm hidden → logits over the draft vocabulary (row j is target id
        ``draft_ids[j]``)."""
        return self.lm_head(self.norm(h)).float()

    def arch(self) -> dict:
        out = {
            "arch": DrafterKind.EAGLE3.value,
            "layer_config": self.layer_config.to_dict(),
            "aux_layers": self.aux_layers,
            "target_hidden_size": self.target_hidden_size,
            "draft_vocab_size": self.draft_vocab_size,
        }
        # absent for one layer: a one-layer drafter's config.json is the one it always was
        if self.num_layers > 1:
            out["num_layers"] = self.num_layers
        return out

    @classmethod
    def from_arch(cls, arch: dict) -> Eagle3Drafter:
        d = {k: v for k, v in arch["layer_config"].items() if k != "model_type"}
        return cls(
            LlamaConfig(**d),
            arch["target_hidden_size"],
            arch["aux_layers"],
            arch["draft_vocab_size"],
            num_layers=int(arch.get("num_layers", 1)),
        )


def _decoder_layer(layer, h, position_embeddings, attention_mask, cache) -> torch.Tensor:
    """A later EAGLE-3 layer (a pre-norm Llama decoder layer: ``LlamaDecoderLayer``'s modules) on
    the hidden state h [B, T, H], its keys and values into ``cache`` at its ``layer_idx``."""
    attn, _ = layer.self_attn(
        layer.input_layernorm(h),
        position_embeddings=position_embeddings,
        attention_mask=attention_mask,
        past_key_values=cache,
    )
    h = h + attn
    return h + layer.mlp(layer.post_attention_layernorm(h))


def build_small_lm(
    target: Any, hidden_size: int, num_layers: int, num_heads: int, intermediate_size: int
):
    """A Llama-family LM over the target's full vocabulary, embeddings initialised from the
    target's."""
    tok = target.tokenizer
    V = target.vocab_size
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(
            project_embedding(target.model.get_input_embeddings().weight, hidden_size)
        )
    model.tie_weights()
    return model


def project_embedding(weight: torch.Tensor, dim: int, init_std: float = 0.02) -> torch.Tensor:
    """[V, H] → [V, dim]: the top-``dim`` principal directions when dim < H (identity/zero-pad
    otherwise), rescaled to ``init_std``."""
    w = weight.detach().float()
    if dim < w.shape[1]:
        centered = w - w.mean(0, keepdim=True)
        cov = centered.T @ centered / w.shape[0]  # [H, H]: cheap even for a 262K vocabulary
        _, vecs = torch.linalg.eigh(cov)
        w = centered @ vecs[:, -dim:].flip(-1)
    elif dim > w.shape[1]:
        w = torch.cat([w, torch.zeros(w.shape[0], dim - w.shape[1])], dim=1)
    return w * (init_std / w.std().clamp_min(1e-12))


# ------------------------------------------------------------------------------------- save / load


def save_drafter(path: str | Path, model: nn.Module, meta: dict, state: dict | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (drafter weights only), atomically. ``state``:
    the weights when ``model``'s own are not whole (DeepSpeed ZeRO-3 shards:
    ``accelerator.get_state_dict``)."""
    if isinstance(model, (EagleDrafter, Eagle3Drafter)):
        dtype, arch = "eagle", model.arch()
    else:
        dtype, arch = "small-lm", {"config": model.config.to_dict()}
    state = {
        k: v.detach().cpu().contiguous()
        for k, v in (model.state_dict() if state is None else state).items()
    }
    # tied head: store the shared matrix once
    if dtype == "small-lm" and model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    with atomic_directory(path, overwrite=True) as tmp:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        atomic_write_json(
            tmp / "config.json",
            {"format_version": DRAFTER_FORMAT, "drafter_type": dtype, **arch, **meta},
        )
    return Path(path)


def load_drafter(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, dict]:
    """Rebuild a drafter from its folder (safetensors only). Parameters start as NaN, so a tensor
    the file does not provide fails loudly instead of silently keeping a random init."""
    path = Path(path)
    for name in ("config.json", "model.safetensors"):
        if not (path / name).is_file():
            raise PolyspecError(f"drafter folder {path} is missing {name}")
    try:
        meta = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise PolyspecError(
            f"cannot read drafter config {path / 'config.json'}: {first_line(e)}"
        ) from None
    try:
        state = load_file(str(path / "model.safetensors"))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type on a damaged file
        raise PolyspecError(
            f"corrupt drafter weights {path / 'model.safetensors'}: {first_line(e)}; "
            f"rewrite {path} (rerun the stage that wrote it)"
        ) from None
    kind = meta.get("drafter_type")
    if kind == "eagle":
        model = (
            Eagle3Drafter if DrafterKind.of_config(meta) is DrafterKind.EAGLE3 else EagleDrafter
        ).from_arch(meta)
    # Llama as built by build_small_lm; any transformers causal-LM family loads
    elif kind == "small-lm":
        cfg = dict(meta["config"])
        model = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(cfg.pop("model_type", "llama"), **cfg)
        )
    else:
        raise PolyspecError(f"drafter {path}: unknown drafter_type {kind!r}")
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if kind == "small-lm" and model.config.tie_word_embeddings:
        model.tie_weights()
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise PolyspecError(
            f"drafter {path}: weights do not match its config (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]})"
        )
    if any(torch.isnan(p).any() for p in model.parameters()):
        raise PolyspecError(f"drafter {path}: some weights were not loaded")
    return model.to(device).eval(), meta
