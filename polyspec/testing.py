"""Tiny random-weight targets for tests and smoke runs: seconds to build, no downloads.

A byte-level BPE tokenizer (so every language encodes without unknown tokens) is trained in-process
on the built-in language seeds, and small Gemma3 and Llama models are initialised from a fixed seed.
Each is saved as an ordinary transformers model folder, so it loads through the same path as any
target:

    path = build_tiny_target(tmp_path / "tiny-llama", family="llama")
    target = load_target(str(path))
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

from polyspec.io import atomic_directory
from polyspec.languages import builtin_codes, get_language

Family = Literal["gemma3", "llama"]
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]  # ids 0..3, as in Gemma
# A minimal ChatML-style template so the chat-template code path has a tokenizer to run on.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% "
    "endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus() -> list[str]:
    """Every system prompt, instruction and response of the built-in languages."""
    texts = []
    for code in builtin_codes():
        lang = get_language(code)
        texts.append(lang.system_prompt)
        for s in lang.seeds:
            texts += [s.instruction, s.response]
    texts += ["### Instruction:\n", "### Response:\n", "<|user|>\n", "<|assistant|>\n", "<|end|>\n"]
    return texts


def build_tokenizer(vocab_size: int = 768, chat: bool = False):
    """Byte-level BPE trained on :func:`corpus`, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    extra = ["<|user|>", "<|assistant|>", "<|system|>", "<|end|>"] if chat else []
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS + extra,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", 2)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    family: Family,
    vocab_size: int,
    seed: int = 0,
    hidden_size: int = 64,
    layers: int = 2,
    layer_types: list[str] | None = None,
):
    """A small causal LM of ``family`` with random weights from ``seed`` (float32, eval mode).
    ``layer_types``: Gemma-3's sliding/full pattern (default: transformers', a full layer every
    6th)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=2048,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=False,
    )
    if family == "gemma3":
        config = Gemma3TextConfig(
            **common,
            sliding_window=64,
            query_pre_attn_scalar=hidden_size // 4,
            **({"layer_types": layer_types} if layer_types else {}),
        )
        model = Gemma3ForCausalLM(config)
    elif family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(f"unknown family {family!r}")
    # The default init (std 0.02) gives near-uniform logits and, with tied weights, a model that
    # repeats one token. Untied unit-scale embedding and head give varied greedy output with well
    # separated top logits, so tests comparing decoders are not decided by float rounding between
    # near-ties.
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, 1.0)
        model.get_output_embeddings().weight.normal_(0.0, 1.0)
    return model.eval()


def build_tiny_target(
    path: str | Path, family: Family = "llama", seed: int = 0, chat: bool | None = None
) -> Path:
    """Write a tiny target folder (model + tokenizer) at ``path`` if it is not there yet; return it.

    ``chat`` (default: True for llama, False for gemma3) adds a chat template to the tokenizer;
    without one the target is treated as a base model with the completion prompt format.
    """
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    chat = (family == "llama") if chat is None else chat
    tok = build_tokenizer(chat=chat)
    model = build_tiny_model(family, vocab_size=len(tok), seed=seed)
    with atomic_directory(path, overwrite=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    return path


def build_engine_target(path: str | Path, seed: int = 0, family: Family = "llama") -> Path:
    """A tiny target that engines' CPU kernels take (4 layers, head_dim 64: vLLM's CPU attention
    has no head_dim 16; a chat Llama, or a Gemma-3 base model with sliding and full-attention
    layers) whose head is its embedding matrix with the ids paired up (``head[j] = embed[π(j)]``, π
    an involution fixing the special ids): its layers add little to the residual stream (init std
    0.02 against unit-scale embeddings), so its greedy next token after x is mostly π(x), and the
    token after that is x again — what :func:`oracle_eagle3` predicts."""
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    tok = build_tokenizer(chat=family == "llama")
    # Gemma-3: two sliding and two full-attention layers (an EAGLE-3 layer joins the full ones' KV
    # cache group in vLLM)
    types = ["sliding_attention", "full_attention"] * 2 if family == "gemma3" else None
    model = build_tiny_model(
        family, vocab_size=len(tok), seed=seed, hidden_size=256, layers=4, layer_types=types
    )
    with torch.no_grad():
        model.get_output_embeddings().weight.copy_(
            model.get_input_embeddings().weight[involution(len(tok), seed)]
        )
    with atomic_directory(path, overwrite=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    return path


def involution(n: int, seed: int = 0) -> torch.Tensor:
    """A permutation π of range(n) with π(π(x)) = x that pairs up the ids after the special ones
    (kept fixed)."""
    rest = torch.randperm(n - len(SPECIALS), generator=torch.Generator().manual_seed(seed)) + len(
        SPECIALS
    )
    pi = torch.arange(n)
    a, b = rest[0::2][: len(rest) // 2], rest[1::2][: len(rest) // 2]
    pi[a], pi[b] = b, a
    return pi


def oracle_eagle3(target, draft_ids: torch.Tensor):
    """An EAGLE-3 drafter for :func:`build_engine_target` whose first draft is mostly right: fed the
    features of position t (and the token after it), it names token t again — the target's greedy
    token two steps on, π(π(x)) = x. fc passes the first aux layer (≈ the token's embedding)
    through, its decoder layer adds nothing, and its head is the target's embedding rows. Later
    drafts read the drafter's own state and are mostly wrong. An engine that reads the drafter
    otherwise than polyspec exports it (aux layer ids, fc layout, the d2t map) accepts almost
    nothing."""
    from polyspec.drafter_models import Eagle3Drafter

    model = Eagle3Drafter.for_target(target, draft_ids)
    H = model.hidden_size
    with torch.no_grad():
        model.fc.weight.zero_()
        model.fc.weight[:, :H] = torch.eye(H)
        model.self_attn.o_proj.weight.zero_()
        model.mlp.down_proj.weight.zero_()
        embed = target.model.get_input_embeddings().weight
        model.lm_head.weight.copy_(embed[draft_ids.to(embed.device)].float().cpu())
    return model.eval()
