"""Stage 5 — runtime: lossless speculative decoding (chain, tree, ADASPEC Alg. 2 adaptive), baselines,
calibration and the evaluation harness.

Reads: a target and a bundle (export stage). Writes: generated text with per-step statistics; under
`eval/`: answers jsonl per method, `report.md`, `report.json` and PNG charts."""
