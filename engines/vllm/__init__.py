"""The vLLM check (``python -m engines.vllm``, ``make check-vllm``): polyspec's drafters served by
vLLM's offline ``LLM`` (vLLM's own environment, :mod:`polyspec.vllm_process`) — plain vs eagle3 at
each draft length vs vLLM's ngram vs small-LM draft models, at batch 1 and more, outputs compared
with plain, and the draft length per drafter.

- ``run.py``: the engines, the passes over the held-out prompts, vLLM's counters, the bench.
- ``report.py``: the summaries, the draft length, ``<out>/vllm.json`` and ``<out>/vllm.md``,
  ``engines.json``.
- ``__main__.py``: the command line.
"""
