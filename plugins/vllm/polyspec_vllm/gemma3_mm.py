"""The multimodal Gemma-3 sizes (4b and up) with vLLM's EAGLE-3 interface: vLLM's runner asks the
outer model whether it supports EAGLE-3. A module of its own because vLLM's ``gemma3_mm`` imports
transformers' image processor, which needs torchvision (absent from a text-only CPU environment)."""

from __future__ import annotations

from vllm.model_executor.models import gemma3_mm
from vllm.model_executor.models.interfaces import SupportsEagle3


class Gemma3ForConditionalGeneration(gemma3_mm.Gemma3ForConditionalGeneration, SupportsEagle3):
    """The multimodal Gemma-3 sizes: their language model is the registered ``Gemma3ForCausalLM``
    above (built by architecture name), whose decoder vLLM's default
    ``set_aux_hidden_state_layers`` finds through ``get_language_model()``; the outer forward
    passes the (hidden, aux) pair through unchanged."""
