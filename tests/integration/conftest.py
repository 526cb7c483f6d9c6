"""The real default target, loaded once per session (per xdist worker) for every integration test
(its first load prepares the user cache from the PyPI GGUF: about a minute on 2 cores, once,
whichever worker asks first; later loads read the cached safetensors in seconds)."""

import pytest

from polyspec.targets import load_target


@pytest.fixture(scope="session")
def gemma():
    return load_target("gemma3-270m")
