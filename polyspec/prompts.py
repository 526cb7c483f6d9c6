"""Prompt layout shared by synth (writing data), train (masking responses) and decoder (prompting):
:class:`PromptFormat` (a target entry's ``prompt_format``) and the one function that turns messages
into text with it.

Messages are ``{"role": "system"|"user"|"assistant", "content": str}`` dicts.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from polyspec.config import StrictModel
from polyspec.errors import PolyspecError

Message = dict[str, str]


class PromptFormat(StrictModel):
    """How instructions and responses are laid out for this target.

    ``chat-template`` uses the tokenizer's chat template. ``completion`` is for base models: each
    message is rendered with the template of its role (``{content}`` is replaced), and generation
    stops at any of ``stop`` (the next-turn markers), for every decoding method alike.
    """

    kind: Literal["chat-template", "completion"] = "chat-template"
    system: str = Field("{content}\n\n", description="completion: template of the system message")
    user: str = Field(
        "### Instruction:\n{content}\n\n", description="completion: template of a user turn"
    )
    assistant: str = Field(
        "### Response:\n{content}\n\n", description="completion: template of an assistant turn"
    )
    generation_prompt: str = Field(
        "### Response:\n", description="completion: text that opens the answer"
    )
    stop: list[str] = Field(
        default_factory=list, description="strings that end a generated turn (besides EOS)"
    )


# the next-turn markers of the completion layout: where a base model's answer ends
BASE_STOP = ("### Instruction:", "### Response:")


def render(
    fmt: PromptFormat, tokenizer: Any, messages: list[Message], add_generation_prompt: bool = True
) -> str:
    """Messages -> prompt text. ``add_generation_prompt`` opens an assistant turn at the end."""
    if fmt.kind == "chat-template":
        if not getattr(tokenizer, "chat_template", None):
            raise PolyspecError(
                "prompt_format chat-template, but the tokenizer has no chat template"
            )
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    parts = []
    for m in messages:
        template = {"system": fmt.system, "user": fmt.user, "assistant": fmt.assistant}.get(
            m["role"]
        )
        if template is None:
            raise PolyspecError(f"unknown message role {m['role']!r}")
        parts.append(template.replace("{content}", m["content"].strip()))
    if add_generation_prompt:
        parts.append(fmt.generation_prompt)
    return "".join(parts)


def render_open_turn(
    fmt: PromptFormat, tokenizer: Any, messages: list[Message], role: str = "user"
) -> str:
    """Messages followed by an *opened* turn of ``role`` whose content the model is to write.

    Used by ADASPEC Alg. 1 line 13: after the few-shot turns the target writes the next instruction.
    Works for both kinds by rendering a sentinel turn and cutting at the sentinel.
    """
    sentinel = "\u2063POLYSPEC_OPEN_TURN\u2063"
    text = render(
        fmt,
        tokenizer,
        [*messages, {"role": role, "content": sentinel}],
        add_generation_prompt=False,
    )
    cut = text.find(sentinel)
    if cut < 0:
        raise PolyspecError(f"the prompt format dropped the content of a {role} turn")
    return text[:cut]


def encode(fmt: PromptFormat, tokenizer: Any, text: str) -> list[int]:
    """Prompt text -> token ids. Completion prompts get the tokenizer's BOS; chat templates carry
    their own."""
    return tokenizer(text, add_special_tokens=fmt.kind == "completion")["input_ids"]


def truncate_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """Cut ``text`` before the first stop string (empty ones are ignored); returns (text, stopped).
    :class:`polyspec.generation.Stopper` applies it token by token to the stream being generated."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
