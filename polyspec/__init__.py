"""polyspec's shared package: the one place for target loading, the language registry, config,
prompt formats, atomic file writes and the one-line error convention. Stage packages (synth, vocab,
train, export, decoder, pipelines) import from here and never from each other's internals.

Reads ``configs/targets/*.yaml`` and ``configs/languages/*.yaml``; writes only the target cache
under the user cache directory (see :mod:`polyspec.paths`).
"""

__version__ = "0.1.0"
