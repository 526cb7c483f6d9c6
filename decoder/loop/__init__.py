"""The decoding loop's pieces that ``decoder.core.Decoder`` drives: the target's KV cache and
forwards (``runner``: rollback, tree gather and masks) and the verification rules that decide what
the target keeps of a draft (``verify``: greedy, rejection sampling, top-p warp)."""
