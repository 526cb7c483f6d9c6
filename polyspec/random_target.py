"""A target of a real model's shape with random weights: the GPU path exercised at full size without
downloads.

    python -m polyspec.random_target --preset llama-3.1-8b --tokenizer smollm2-135m-instruct
        --out /tmp/rand-8b
    python -m polyspec.random_target --preset tiny --out /tmp/rand-tiny
        (4 layers, H = 64: CPU tests)

Writes an ordinary transformers folder — ``config.json``, the tokenizer (chat template kept) and
safetensors shards (one per decoder layer, with ``model.safetensors.index.json``) — so every stage
loads it as ``TARGET=<folder>``. The vocabulary is the tokenizer's (|V| = ``len(tokenizer)``).
Weights are drawn from ``--seed``, one generator per tensor (its value depends on the seed and the
tensor's name only), written tensor by tensor: an 8B shape needs no more memory than its largest
tensor. Linear and embedding weights ~ N(0, 0.02²) (the Llama/Qwen initializer range), norms 1,
biases 0; the head's std is 0.02·√(4096/H), so logits spread as an H = 4096 model's do at 0.02 (std
≈ 1.3) at every width and greedy picks are not near-ties. ``--device auto`` draws on the GPU when
there is one (seconds for 8B, ~1 minute on one CPU core): the same seed gives the same weights on
the same kind of device.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from polyspec.errors import PolyspecError, cli_entry

RECORD = "polyspec_random_target.json"


@dataclass(frozen=True)
class Shape:
    arch: str  # transformers model_type: llama | qwen2
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool  # input embedding shared with the head (Llama-3.2-1B)
    rope_theta: float = 10000.0


# The published configurations' shapes (vocabulary aside: it is the tokenizer's). ``tiny`` has 4
# layers so that EAGLE-3's three feature layers are distinct hidden states
# (polyspec.targets.eagle3_layers: [1, 2, 3]).
PRESETS = {
    "tiny": Shape("llama", 64, 128, 4, 4, 2, tied=False),
    "llama-3.2-1b": Shape("llama", 2048, 8192, 16, 32, 8, tied=True, rope_theta=500000.0),
    "llama-3.1-8b": Shape("llama", 4096, 14336, 32, 32, 8, tied=False, rope_theta=500000.0),
    "qwen2.5-7b": Shape("qwen2", 3584, 18944, 28, 28, 4, tied=False, rope_theta=1000000.0),
}


def load_tokenizer(name: str) -> Any:
    """A tokenizer folder (tokenizer.json / tokenizer_config.json, e.g. one this module saved), or
    any target name polyspec loads (registry entry, local model folder, hub id): its tokenizer, with
    a pad token (EOS stands in, as the target loader does)."""
    folder = Path(name).expanduser()
    if folder.is_dir() and not (folder / "config.json").is_file():
        if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
            raise PolyspecError(
                f"{folder} holds neither a model (config.json) nor a tokenizer (tokenizer.json)"
            )
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(folder)
    else:
        from polyspec.targets import load_target

        tok = load_target(name, with_model=False).tokenizer
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def make_config(
    shape: Shape, tok: Any, dtype: torch.dtype, std: float = 0.02, arch: str | None = None
) -> Any:
    from transformers import AutoConfig

    return AutoConfig.for_model(
        arch or shape.arch,
        vocab_size=len(tok),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.hidden // shape.heads,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        tie_word_embeddings=shape.tied,
        initializer_range=std,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype=str(dtype).replace("torch.", ""),
    )


def init_tensor(
    name: str, shape: torch.Size, seed: int, std: float, hidden: int, device: torch.device
) -> torch.Tensor:
    """One parameter in float32: norms 1, biases 0, the head at std·√(4096/H), the rest N(0, std²),
    drawn from a generator seeded by (seed, name) alone."""
    if name.endswith("norm.weight"):
        return torch.ones(shape, device=device)
    if name.endswith(".bias"):
        return torch.zeros(shape, device=device)
    scale = std * math.sqrt(4096 / hidden) if name == "lm_head.weight" else std
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.empty(shape, device=device).normal_(0.0, scale, generator=gen)


def _shard_of(name: str) -> str:
    """Shards: the embedding, each decoder layer, the final norm with the head."""
    if name.startswith("model.layers."):
        return f"layer-{int(name.split('.')[2]):04d}"
    return "a-embed" if "embed_tokens" in name else "z-head"


def build_random_target(
    out: str | Path,
    preset: str = "tiny",
    tokenizer: str = "smollm2-135m-instruct",
    arch: str | None = None,
    seed: int = 0,
    dtype: str = "bfloat16",
    std: float = 0.02,
    device: str = "auto",
    log=print,
) -> Path:
    """Write the folder (atomically; an existing one is replaced) and return its path."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, GenerationConfig

    from polyspec.device import resolve_device, resolve_dtype
    from polyspec.io import atomic_directory, atomic_write_json

    if preset not in PRESETS:
        raise PolyspecError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if arch not in (None, "llama", "qwen2"):
        raise PolyspecError(f"unknown arch {arch!r}; choose llama or qwen2")
    shape, dev, t0 = PRESETS[preset], resolve_device(device), time.time()
    dt = resolve_dtype(dtype, dev)
    tok = load_tokenizer(tokenizer)
    config = make_config(shape, tok, dt, std, arch)
    with torch.device("meta"):  # names and shapes only: nothing is allocated
        skeleton = AutoModelForCausalLM.from_config(config)
    # engines (vLLM, speculators' verifier) read it
    config.architectures = [type(skeleton).__name__]
    params = {
        n: p.shape
        for n, p in skeleton.state_dict().items()
        if not (shape.tied and n == "lm_head.weight")
    }
    shards = sorted({_shard_of(n) for n in params})
    files = {s: f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i, s in enumerate(shards)}
    out = Path(out)
    total = 0
    with atomic_directory(out, overwrite=True) as tmp:
        for s in shards:  # one shard in memory at a time
            tensors = {
                n: init_tensor(n, params[n], seed, std, shape.hidden, dev).to(dt).cpu()
                for n in params
                if _shard_of(n) == s
            }
            total += sum(t.numel() * t.element_size() for t in tensors.values())
            save_file(tensors, str(tmp / files[s]), metadata={"format": "pt"})
        atomic_write_json(
            tmp / "model.safetensors.index.json",
            {
                "metadata": {"total_size": total},
                "weight_map": {n: files[_shard_of(n)] for n in params},
            },
        )
        config.save_pretrained(tmp)
        GenerationConfig.from_model_config(config).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        atomic_write_json(
            tmp / RECORD,
            {
                "preset": preset,
                "shape": asdict(shape),
                "arch": config.model_type,
                "tokenizer": tokenizer,
                "vocab_size": len(tok),
                "seed": seed,
                "std": std,
                "dtype": str(dt).replace("torch.", ""),
                "drawn_on": dev.type,
                "parameters": sum(math.prod(p) for p in params.values()),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            },
        )
    log(
        f"random {preset} ({config.model_type}, "
        f"{sum(math.prod(p) for p in params.values()) / 1e6:,.0f}M parameters, "
        f"{total / 2**20:,.0f} MiB {str(dt).replace('torch.', '')}) at {out} in "
        f"{time.time() - t0:.0f}s"
    )
    return out


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m polyspec.random_target", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--preset", default="tiny", choices=list(PRESETS))
    ap.add_argument(
        "--arch", default=None, choices=["llama", "qwen2"], help="default: the preset's"
    )
    ap.add_argument(
        "--tokenizer",
        default="smollm2-135m-instruct",
        help="a target name (registry, local folder, hub id) or a folder holding a tokenizer",
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--dtype", default="bfloat16", help="of the stored weights (auto: bf16 where native)"
    )
    ap.add_argument("--std", type=float, default=0.02)
    ap.add_argument(
        "--device",
        default="auto",
        help="where the weights are drawn (auto: the GPU when there is one)",
    )
    ap.add_argument(
        "--save-tokenizer",
        action="store_true",
        help="only write the tokenizer to --out (a few MB: carried to machines without the "
        "registry's cache)",
    )
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if args.save_tokenizer:
        load_tokenizer(args.tokenizer).save_pretrained(args.out)
        print(f"tokenizer of {args.tokenizer} at {args.out}")
        return 0
    build_random_target(
        args.out,
        args.preset,
        args.tokenizer,
        args.arch,
        args.seed,
        args.dtype,
        args.std,
        args.device,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
