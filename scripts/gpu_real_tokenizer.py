"""scripts/gpu-real.sh run's tokenizer step: the target cache takes the tokenizer the bundle was built with.

    python scripts/gpu_real_tokenizer.py TARGET STAGE3     (STAGE3: the staged part 3, holding bundle/ and tokenizer/)

A bundle pins its target's tokenizer (sha256). A GGUF target's tokenizer is made by transformers' GGUF conversion, and
another transformers version makes another one: on the H200 image (5.17) SmolLM2's EOS came out as <|im_start|>,
on this project's (5.24) <|im_end|>, so the device refused the bundle (docs/experiments.md, 2026-11-27). Where the
device's cache record pins another tokenizer than the bundle, the packed tokenizer files (``gpu-real.sh pack`` copies
them from the machine that built the bundle) replace the cache's, and the record says where they came from; loading
the target then checks the files against the record as always. Exit 0 either way; nothing changes where they agree.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def adopt_bundle_tokenizer(target: str, staged: Path) -> bool:
    """→ True when the cache took the packed tokenizer, False when its pin already was the bundle's."""
    import transformers

    from polyspec.gguf_cache import CACHE_RECORD, read_record, target_cache_path
    from polyspec.io import atomic_write_json
    from polyspec.target_registry import resolve_target

    cache = target_cache_path(resolve_target(target))
    want = json.loads((staged / "bundle" / "manifest.json").read_text(encoding="utf-8"))["target"]["tokenizer_sha256"]
    record = read_record(cache)
    if record.get("tokenizer_sha256") == want:
        return False
    print(f"transformers {transformers.__version__} made tokenizer {str(record.get('tokenizer_sha256'))[:12]} of the "
          f"GGUF; the bundle pins {want[:12]}: the cache takes the packed tokenizer")
    for f in sorted((staged / "tokenizer").iterdir()):
        shutil.copy(f, cache / f.name)
    atomic_write_json(cache / CACHE_RECORD, record | {"tokenizer_sha256": want,
                                                      "tokenizer_from": "scripts/gpu-real.sh pack (the bundle's machine)"})
    return True


if __name__ == "__main__":
    adopt_bundle_tokenizer(sys.argv[1], Path(sys.argv[2]))
