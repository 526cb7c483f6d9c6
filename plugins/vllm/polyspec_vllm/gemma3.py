"""Gemma-3 with vLLM's EAGLE-3 interface (``SupportsEagle3``), which vLLM 0.32 lacks: the decoder
collects the residual stream after the layers an EAGLE-3 drafter reads, as ``LlamaModel.forward``
does (``vllm/model_executor/models/llama.py``), and the causal LM (the text-only sizes, 270m and 1b)
says it supports it (the multimodal sizes: ``polyspec_vllm.gemma3_mm``).

Registered over vLLM's own architecture names (``polyspec_vllm.register``): with no EAGLE-3 drafter
no layer is collected and the forward is vLLM's, operation for operation."""

from __future__ import annotations

from itertools import islice

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models import gemma3
from vllm.model_executor.models.interfaces import EagleModelMixin, SupportsEagle3
from vllm.model_executor.models.utils import maybe_prefix
from vllm.sequence import IntermediateTensors


class Gemma3Model(gemma3.Gemma3Model, EagleModelMixin):
    """vLLM 0.32's ``Gemma3Model`` whose forward also returns the aux hidden states (the residual
    stream entering layer ``i`` for each ``i`` in ``aux_hidden_state_layers``; ``i`` = number of
    layers, the stream before the final norm)."""

    supports_aux_hidden_states_over_pp = True

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor | IntermediateTensors | tuple[torch.Tensor, list[torch.Tensor]]:
        if get_pp_group().is_first_rank:
            if inputs_embeds is not None:
                hidden_states = inputs_embeds
            else:
                hidden_states = self.embed_input_ids(input_ids)
            residual = None
        else:
            assert intermediate_tensors is not None
            hidden_states = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]
        remote_aux = self.collect_remote_aux_hidden_states(intermediate_tensors)
        aux: list[torch.Tensor] = []
        if get_pp_group().is_first_rank:
            self._maybe_add_hidden_state(aux, self.start_layer, hidden_states, residual)
        for idx, layer in enumerate(
            islice(self.layers, self.start_layer, self.end_layer), start=self.start_layer
        ):
            hidden_states, residual = layer(positions, hidden_states, residual, **kwargs)
            self._maybe_add_hidden_state(aux, idx + 1, hidden_states, residual)
        if not get_pp_group().is_last_rank:
            return IntermediateTensors(
                {
                    "hidden_states": hidden_states,
                    "residual": residual,
                    **self.pack_local_aux_hidden_states(aux),
                }
            )
        hidden_states, _ = self.norm(hidden_states, residual)
        aux = remote_aux + aux
        return (hidden_states, aux) if aux else hidden_states


class Gemma3ForCausalLM(gemma3.Gemma3ForCausalLM, SupportsEagle3):
    """vLLM 0.32's ``Gemma3ForCausalLM`` on the decoder above. ``__init__`` is the parent's with the
    decoder class swapped: calling the parent's and then building a second decoder would register
    every attention layer twice."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        nn.Module.__init__(self)
        config = vllm_config.model_config.hf_config
        self.config = config
        self.quant_config = vllm_config.quant_config
        self.model = Gemma3Model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(
            config.vocab_size,
            config.hidden_size,
            quant_config=self.quant_config,
            prefix=maybe_prefix(prefix, "lm_head"),
        )
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(
            config.vocab_size, soft_cap=config.final_logit_softcapping
        )
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors
