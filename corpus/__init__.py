"""Stage 0 — an offline general-text corpus (Debian's translated documentation) for the drafters'
pretrain.

Reads: the corpus config (`configs/corpus/default.yaml`: Debian packages or local folders per
language), a target's tokenizer and the language registry (fastText labels). Writes under
`<run>/corpus/<lang>/`: `data.jsonl` (documents with their target-token counts), `manifest.json`
(per source: package, version, licence, paragraphs kept and dropped; the sources that could not be
had) and `parts/` (one finished source each, for resuming); `prefill` writes
`<run>/corpus/<lang>-prefill/` (the target's captured features on the corpus, the layout
distillation uses). See DESIGN.md."""
