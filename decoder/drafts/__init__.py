"""Draft sources: everything that proposes tokens for the target to verify, behind one interface
(``types``). Trained drafters (``trained``, run by ``runtimes``; ADASPEC's language choice in
``adaptive``), training-free n-gram sources (``ngram``, over the ``tables``; SPECTRA in
``spectra``), the ``hybrid`` of both and SPIDE's parallel drafting (``spide_parallel``). The
registry ``decoder.methods`` builds them by method name."""
