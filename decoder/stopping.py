"""One stopping rule for every decoding method: EOS, a stop string (for base models the prompt format's
next-turn marker), or ``max_new_tokens`` — checked token by token on the emitted stream, so methods that
emit several tokens per step stop at exactly the same token as autoregressive decoding."""

from __future__ import annotations

from polyspec.prompts import truncate_at_stop


class Stopper:
    def __init__(self, tokenizer, eos_ids: set[int], stop: list[str], max_new_tokens: int):
        self.tok, self.eos, self.stop, self.max = tokenizer, set(eos_ids), [s for s in stop if s], max_new_tokens
        self.tail = max((len(s) for s in self.stop), default=0) + 2  # tokens decoded to look for a stop string
        self.tokens: list[int] = []
        self.reason: str | None = None

    def push(self, new: list[int]) -> int:
        """Append ``new`` until the stream ends; returns how many of them were kept."""
        for i, t in enumerate(new):
            self.tokens.append(t)
            if t in self.eos:
                self.reason = "eos"
            elif self.stop and any(s in self.tok.decode(self.tokens[-self.tail :]) for s in self.stop):
                self.reason = "stop"
            elif len(self.tokens) >= self.max:
                self.reason = "length"
            if self.reason:
                return i + 1
        return len(new)

    @property
    def done(self) -> bool:
        return self.reason is not None

    @property
    def remaining(self) -> int:
        return self.max - len(self.tokens)

    def text(self) -> str:
        text = self.tok.decode(self.tokens, skip_special_tokens=True)
        return truncate_at_stop(text, self.stop)[0] if self.reason == "stop" else text


def eos_ids(target) -> set[int]:
    """The ids transformers' ``generate`` stops at: the generation config's EOS (can be a list) and the tokenizer's."""
    ids = set()
    gen_eos = getattr(getattr(target.model, "generation_config", None), "eos_token_id", None)
    for x in (gen_eos, target.tokenizer.eos_token_id):
        if isinstance(x, int):
            ids.add(x)
        elif x:
            ids.update(int(i) for i in x)
    return ids
