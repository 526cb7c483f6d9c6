"""transformers' own ``generate`` loops as bench runners (``hf-generate``, ``hf-pld``,
``hf-assisted``), under the same stopping rule and token accounting as the decoder's methods."""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

from decoder.bench.report import Answer
from decoder.methods import BenchInputs
from polyspec.drafter_models import load_drafter
from polyspec.errors import PolyspecError
from polyspec.generation import Stopper, eos_ids, stop_window, tail_has_stop


class ForwardCounter:
    """Counts the target's forward calls (transformers' own generate loops)."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_hook(lambda *_: self._inc())

    def _inc(self):
        self.n += 1


class StopText(StoppingCriteria):
    """The prompt format's stop strings, checked on the decoded tail. (transformers' own
    ``stop_strings`` cannot be used: assisted generation forwards them to the assistant's
    ``generate`` without the tokenizer and fails.)"""

    def __init__(self, tokenizer, stop: list[str], start: int):
        self.tok, self.stop, self.start = tokenizer, stop, start
        self.window = stop_window(stop)

    # the check Stopper makes, on the answer's last tokens
    def __call__(self, input_ids, scores, **_):
        tail = input_ids[0, max(self.start, input_ids.shape[1] - self.window) :].tolist()
        return torch.tensor([tail_has_stop(self.tok, tail, self.stop)], device=input_ids.device)


def hf_runner(target, counter: ForwardCounter, **generate_kwargs):
    """callable(prompt_ids, max_new_tokens) → Answer: ``target.model.generate`` (greedy) with these
    arguments."""
    fmt, tok = target.spec.prompt_format, target.tokenizer

    def run(ids, n):
        x = torch.tensor([ids], device=target.device)
        counter.n = 0
        stop = StoppingCriteriaList([StopText(tok, list(fmt.stop), len(ids))]) if fmt.stop else None
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = target.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=n,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                stopping_criteria=stop,
                **generate_kwargs,
            )
        dt = time.perf_counter() - t0
        new = out[0, len(ids) :].tolist()
        st = Stopper(tok, eos_ids(target), list(fmt.stop), n)  # the same cut and text as ours
        st.push(new)
        return Answer(st.tokens, st.text(), counter.n, dt)

    return run


def load_assistant(b: BenchInputs):
    """The assistant model of assisted generation: ``--assistant`` (a transformers folder, e.g.
    ``python -m export --format hf-assistant``), else the small-LM bundle's first drafter, loaded as
    the transformers causal LM it is (nothing is exported or written)."""
    if b.assistant is not None:
        model = AutoModelForCausalLM.from_pretrained(b.assistant)
    else:
        lang = b.bundle.languages[0]
        model, _ = load_drafter(b.bundle.drafter_dir(lang))
        if model.config.vocab_size != b.target.vocab_size:
            raise PolyspecError(
                f"drafter {lang}: vocab_size {model.config.vocab_size} ≠ the target's "
                f"{b.target.vocab_size}"
            )
    return model.to(b.target.device).eval()
