"""Target features captured while the target generates (``synth distill capture_features=true``):
the file contract between synth/ (writer) and train/ (reader).

``<run>/synth/<lang>-<name>/features/a<first attempt:07d>.safetensors``, one file per committed
batch, written atomically before the batch's records are committed (so a resumed run rewrites, never
half-reads, a shard). Per record id ``r`` (the ``id`` of its data.jsonl line, which names the file
in ``features_file``):

- ``r.ids``  int32 [n]      prompt + generated token ids exactly as the target saw them (no
                            re-tokenization);
- ``r.start`` int32 [1]     number of prompt tokens (the loss of a finetune covers ids[start:]);
- ``r.f``    bf16 [n, H]    last layer after the final norm (what the LM head reads; EAGLE-1 input
                            and target);
- ``r.aux``  bf16 [n, 3H]   optional: the three ``output_hidden_states`` layers an EAGLE-3 drafter
                            reads.

Header metadata: ``target`` (name), ``tokenizer`` (sha256), ``aux_layers`` (json) — the reader
refuses features of another target.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save

from polyspec.errors import PolyspecError, first_line
from polyspec.io import atomic_write_bytes


def write_shard(
    path: Path, rows: dict[str, dict[str, torch.Tensor]], meta: dict[str, str], dtype=torch.bfloat16
) -> int:
    """rows: record id → {"ids", "start", "f"[, "aux"]}; returns the bytes written."""
    out = {}
    for rid, r in rows.items():
        out[f"{rid}.ids"] = torch.as_tensor(r["ids"], dtype=torch.int32)
        out[f"{rid}.start"] = torch.tensor([int(r["start"])], dtype=torch.int32)
        out[f"{rid}.f"] = r["f"].to(dtype).contiguous()
        if "aux" in r:
            out[f"{rid}.aux"] = r["aux"].to(dtype).contiguous()
    data = save(out, metadata={k: str(v) for k, v in meta.items()})
    atomic_write_bytes(Path(path), data)
    return len(data)


@torch.inference_mode()
def prefill_features(
    target, seqs: list[list[int]], aux_layers: list[int] | None, batch_tokens: int = 4096
) -> list[dict[str, torch.Tensor]]:
    """Token id lists → per list {"f": [n, H], "aux": [n, 3H] (with ``aux_layers``)} on the CPU in
    the model's dtype, from right-padded batches of similar length (at most ``batch_tokens`` padded
    tokens a forward): the base model's output and ``output_hidden_states[aux_layers]``, as
    distillation's capture keeps them."""
    base = target.model.get_decoder()
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    got: dict[int, dict[str, torch.Tensor]] = {}
    pad = target.tokenizer.pad_token_id or 0
    i = 0
    while i < len(order):
        width = len(seqs[order[i]])
        rows = order[i : i + max(1, batch_tokens // width)]
        i += len(rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, k in enumerate(rows):
            ids[r, : len(seqs[k])] = torch.as_tensor(seqs[k])
            mask[r, : len(seqs[k])] = 1
        out = base(
            input_ids=ids.to(target.device),
            attention_mask=mask.to(target.device),
            use_cache=False,
            output_hidden_states=bool(aux_layers),
        )
        for r, k in enumerate(rows):
            n = len(seqs[k])
            got[k] = {"f": out.last_hidden_state[r, :n].cpu()}
            if aux_layers:
                got[k]["aux"] = torch.cat(
                    [out.hidden_states[j][r, :n] for j in aux_layers], -1
                ).cpu()
    return [got[k] for k in range(len(seqs))]


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in Path(root).glob("features/*.safetensors"))


class FeatureReader:
    """Random access to captured features by (file, record id); keeps the last few files open."""

    def __init__(self, target_name: str, tokenizer_sha256: str):
        self.target, self.tokenizer = target_name, tokenizer_sha256
        self._open: dict[str, object] = {}

    def _file(self, path: str):
        if path not in self._open:
            if len(self._open) >= 8:
                self._open.pop(next(iter(self._open)))
            if not Path(path).is_file():
                raise PolyspecError(
                    f"{path}: captured features missing; delete {_distill_dir(path)} and rerun "
                    "synth distill"
                )
            try:
                h = safe_open(path, framework="pt")
            # safetensors raises its own error type on a damaged file
            except Exception as e:  # noqa: BLE001
                raise corrupt_shard(path, e) from None
            meta = h.metadata() or {}
            if meta.get("tokenizer") != self.tokenizer or meta.get("target") != self.target:
                raise PolyspecError(
                    f"{path}: features of target {meta.get('target')!r}, not {self.target!r}"
                )
            self._open[path] = h
        return self._open[path]

    def aux_layers(self, path: str) -> list[int] | None:
        raw = (self._file(path).metadata() or {}).get("aux_layers")
        return json.loads(raw) if raw and raw != "None" else None

    def records(self, path: str) -> list[str]:
        """The record ids the shard holds, sorted."""
        return sorted(k[: -len(".ids")] for k in self._file(path).keys() if k.endswith(".ids"))

    def ids(self, path: str, rid: str) -> tuple[list[int], int]:
        return self.get(path, rid, "ids").tolist(), int(self.get(path, rid, "start")[0])

    def get(self, path: str, rid: str, name: str = "f") -> torch.Tensor:
        h, key = self._file(path), f"{rid}.{name}"
        try:
            return h.get_tensor(key)
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error type
            if key not in h.keys():
                raise PolyspecError(
                    f"feature shard {path} holds no {key}; delete {_distill_dir(path)} and rerun "
                    "synth distill"
                ) from None
            raise corrupt_shard(path, e) from None


def corrupt_shard(path: str | Path, e: BaseException) -> PolyspecError:
    """A captured shard that cannot be read: its records are committed, so a rerun of distill into
    the same folder would not rewrite it — the whole distill output goes."""
    return PolyspecError(
        f"corrupt feature shard {path}: {first_line(e)}; delete {_distill_dir(path)} and rerun "
        "synth distill"
    )


def _distill_dir(path: str | Path) -> Path:
    return Path(path).parent.parent  # <run>/synth/<lang>-<name>/features/<shard>
