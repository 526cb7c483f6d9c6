from polyspec.prompts import encode, render, truncate_at_stop
from polyspec.targets import load_target, resolve_target

MSGS = [
    {"role": "system", "content": "Bạn là một trợ lý hữu ích."},
    {"role": "user", "content": "Tại sao lá cây có màu xanh?"},
]


def test_completion_format_of_the_default_target():
    fmt = resolve_target("gemma3-270m").prompt_format
    text = render(fmt, None, MSGS)
    assert (
        text == "Bạn là một trợ lý hữu ích.\n\n### Instruction:\nTại sao lá cây có màu xanh?\n\n"
        "### Response:\n"
    )
    history = render(
        fmt,
        None,
        [*MSGS, {"role": "assistant", "content": "Vì diệp lục."}],
        add_generation_prompt=False,
    )
    assert history.endswith("### Response:\nVì diệp lục.\n\n")


def test_completion_prompt_gets_bos_chat_template_does_not_double_it(
    tiny_gemma_dir, tiny_llama_dir
):
    base = load_target(str(tiny_gemma_dir))
    ids = encode(
        base.spec.prompt_format,
        base.tokenizer,
        render(base.spec.prompt_format, base.tokenizer, MSGS),
    )
    assert ids[0] == base.tokenizer.bos_token_id and ids[1] != base.tokenizer.bos_token_id
    chat = load_target(str(tiny_llama_dir))
    text = render(chat.spec.prompt_format, chat.tokenizer, MSGS)
    assert text.startswith("<bos><|system|>") and text.endswith("<|assistant|>\n")
    ids = encode(chat.spec.prompt_format, chat.tokenizer, text)
    assert ids.count(chat.tokenizer.bos_token_id) == 1


def test_truncate_at_stop():
    assert truncate_at_stop(
        "Vì diệp lục.\n\n### Instruction:\nMore", ["### Instruction:", "### Response:"]
    ) == (
        "Vì diệp lục.\n\n",
        True,
    )
    assert truncate_at_stop("no stop here", ["###"]) == ("no stop here", False)
    assert truncate_at_stop("a<|im_end|>b### x", ["###", "<|im_end|>"]) == ("a", True)
