"""Stage 1 — self-synthesized instruction data (ADASPEC Alg. 1) and multi-temperature
self-distillation.

Reads: a target (polyspec.targets) and a language entry (polyspec.languages): system prompt and
few-shot seeds. Writes under `<run>/synth/<lang>/`: `data.jsonl` (kept pairs, ShareGPT-style
conversations with their fastText language-ID label and probability), `rejected.jsonl` (same plus
`reason`) and `stats.json` (attempted = accepted + rejected by reason, tokens, seconds, tokens/s).
See DESIGN.md."""
