"""Stage 3 — drafter training: one-layer EAGLE-style drafters on target hidden states, or small LM
drafters.

Reads: synth data (`<run>/synth/<lang>/data.jsonl`), ranked vocabularies
(`<run>/vocab/<lang>.safetensors`) and the frozen target. Writes
`<run>/train/<lang>/<stage>/checkpoint-<step>/` (resumable) and `<run>/train/<lang>/final/`
(`config.json` + `model.safetensors`, drafter weights only). Entry point: `accelerate launch
train/drafter.py --config configs/train/<recipe>.yaml`."""
