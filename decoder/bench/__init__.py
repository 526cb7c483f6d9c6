"""Benchmarking: ``python -m decoder.bench`` (``make eval``; the harness in ``run``, its questions
in ``questions``, transformers' own loops in ``hf_loops``, report.md/json and charts in ``report``)
and the quick speed check ``python -m decoder.bench.speed``."""
