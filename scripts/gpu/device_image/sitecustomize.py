"""The device machine's Python image, as far as imports go: on ``PYTHONPATH``
(scripts/gpu/gpu-check.sh's CPU rehearsal, tests/test_gpu_smoke.py), the packages the GPU image
lacks and scripts/gpu/gpu-wheels.sh does not carry cannot be imported — ``importlib.util.find_spec``
answers None for them, as for any missing package, so optional-import probes (transformers'
``is_*_available``) behave as they do there. A rehearsal that passes here does not fail on the
device for an import (two such imports were found this way before the first GPU run)."""

import sys

# gguf: carried
ABSENT = {"datasets", "wordfreq", "langcodes", "wandb", "deepspeed", "vllm", "speculators"}


class _HideAbsent:
    """Wraps one meta-path finder: None for the absent packages, the finder's own answer
    otherwise."""

    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ABSENT:
            return None
        find = getattr(self.inner, "find_spec", None)
        return find(name, path, target) if find else None

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


sys.meta_path[:] = [_HideAbsent(f) for f in sys.meta_path]
