"""Stage 4 — bundles: per-language drafters, ranked vocabularies, language masks and a manifest
pinning the target.

Reads: `<run>/train/<lang>/final/` and `<run>/vocab/`. Writes a bundle directory (`manifest.json`
with checksums, `drafters/<lang>/`, `vocab/<lang>.safetensors`, `language_masks.safetensors`,
`README.md`), atomically; also HF-assistant and vLLM EAGLE-3 interop layouts (interop.py), llama.cpp
GGUFs (gguf.py) and the engines export (engines.py). The engine checks that run these formats live
in `engines/`."""
