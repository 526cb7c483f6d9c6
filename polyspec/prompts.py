"""Prompt layout shared by synth (writing data), train (masking responses) and decoder (prompting):
one function turns messages into text with the target's ``prompt_format``.

Messages are ``{"role": "system"|"user"|"assistant", "content": str}`` dicts.
"""

from __future__ import annotations

from typing import Any

from polyspec.errors import PolyspecError
from polyspec.targets import PromptFormat

Message = dict[str, str]


def render(fmt: PromptFormat, tokenizer: Any, messages: list[Message], add_generation_prompt: bool = True) -> str:
    """Messages -> prompt text. ``add_generation_prompt`` opens an assistant turn at the end."""
    if fmt.kind == "chat-template":
        if not getattr(tokenizer, "chat_template", None):
            raise PolyspecError("prompt_format chat-template, but the tokenizer has no chat template")
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    parts = []
    for m in messages:
        template = {"system": fmt.system, "user": fmt.user, "assistant": fmt.assistant}.get(m["role"])
        if template is None:
            raise PolyspecError(f"unknown message role {m['role']!r}")
        parts.append(template.replace("{content}", m["content"].strip()))
    if add_generation_prompt:
        parts.append(fmt.generation_prompt)
    return "".join(parts)


def render_open_turn(fmt: PromptFormat, tokenizer: Any, messages: list[Message], role: str = "user") -> str:
    """Messages followed by an *opened* turn of ``role`` whose content the model is to write.

    Used by ADASPEC Alg. 1 line 13: after the few-shot turns the target writes the next instruction.
    Works for both kinds by rendering a sentinel turn and cutting at the sentinel.
    """
    sentinel = "\u2063POLYSPEC_OPEN_TURN\u2063"
    text = render(fmt, tokenizer, [*messages, {"role": role, "content": sentinel}], add_generation_prompt=False)
    cut = text.find(sentinel)
    if cut < 0:
        raise PolyspecError(f"the prompt format dropped the content of a {role} turn")
    return text[:cut]


def encode(fmt: PromptFormat, tokenizer: Any, text: str) -> list[int]:
    """Prompt text -> token ids. Completion prompts get the tokenizer's BOS; chat templates carry their own."""
    return tokenizer(text, add_special_tokens=fmt.kind == "completion")["input_ids"]


def truncate_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """Cut ``text`` at the first stop string; returns (text, stopped)."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
