"""Stage 2 — per-language token frequencies under the target tokenizer and ranked vocabularies.

Reads: corpora (FineWeb-2 / Wikipedia via `datasets`, wordfreq, local files, or synth output) and
the target tokenizer. Writes under `<run>/vocab/`: `<lang>.safetensors` (`ranked_ids` int32,
`counts` int64) with a JSON sidecar pinning `tokenizer_sha256`, coverage and overlap JSON/PNG, and
the language masks [|L|·|S| × |V|] of ADASPEC Alg. 2 lines 6–18."""
