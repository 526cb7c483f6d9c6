"""The real default target, loaded once for every integration test of the session (its first load prepares the
user cache from the PyPI GGUF: about a minute on 2 cores; later loads read the cached safetensors)."""

import pytest

from polyspec.targets import load_target


@pytest.fixture(scope="session")
def gemma():
    return load_target("gemma3-270m")
