"""Stage 5 — runtime: lossless speculative decoding (chain, tree, ADASPEC Alg. 2 adaptive),
baselines, calibration and the evaluation harness.

Layout: ``core`` (``Decoder``, the public API) and ``methods`` (the registry of decoding methods) at
the top; the decoding loop's pieces in ``loop/``, the draft sources in ``drafts/``, benchmarking in
``bench/`` and calibration in ``calibrate/``.

Reads: a target and a bundle (export stage). Writes: generated text with per-step statistics; under
`eval/`: answers jsonl per method, `report.md`, `report.json` and PNG charts."""
