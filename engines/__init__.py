"""The engine checks: polyspec's exported drafters measured inside the serving engines, not in
polyspec's decoder — each an engine benchmark run on demand (``make check-llamacpp``,
``make check-vllm``, ``make check-speculators``), not a pipeline stage. They read what the export
stage writes (bundles, speculators folders, ``engines.json``) and write ``engines.json``'s
``draft_n`` back.

- ``common.py``: what the llama.cpp and vLLM checks share (held-out prompts, the drafters to check,
  the bench plan, the command lines' common arguments).
- ``draft_length.py``: the draft length an engine should run a drafter at, from the engine's costs
  and the drafter's α (``python -m engines.draft_length`` for the GPU engines).
- ``speculators.py``: speculators' own classes load the exports and their logits are compared with
  polyspec's; it runs in the engines environment ``.venv-vllm`` (``python -m engines.speculators``),
  where polyspec is not installed, so it imports nothing of polyspec — and this ``__init__`` imports
  nothing at all.
- ``llamacpp/``: llama.cpp built, run and reported (its GGUF conversion is the export stage's:
  :mod:`export.gguf`).
- ``vllm/``: vLLM run and reported (the vLLM process itself: :mod:`polyspec.vllm_process`, shared
  with synth).
"""
