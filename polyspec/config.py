"""Config loading shared by every stage: YAML file -> dotted CLI overrides -> typed pydantic model.

Each stage declares its options once as a :class:`StrictModel` subclass whose field descriptions are
the documentation. Unknown keys and bad values are all reported together, in one error, before any
heavy work starts.

    cfg = load_config(SynthConfig, "configs/synth/default.yaml", ["n=64", "engine.batch_size=8"])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from polyspec.errors import PolyspecError, first_line

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every config model: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolyspecError(f"config file not found: {path}") from None
    except OSError as e:
        raise PolyspecError(f"cannot read config file {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PolyspecError(f"invalid YAML in {path}: {first_line(e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PolyspecError(
            f"{path} must contain a mapping at the top level, got {type(data).__name__}"
        )
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML scalars/lists) to a nested dict
    copy."""
    out = _deep_copy(data)
    for item in overrides:
        if "=" not in item:
            raise PolyspecError(f"override {item!r} is not of the form key.path=value")
        key, raw = item.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise PolyspecError(f"override {item!r} has an empty key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = out
        for p in parts[:-1]:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = {}
                node[p] = nxt
            node = nxt
        node[parts[-1]] = value
    return out


def validate(model: type[M], data: dict[str, Any], source: str = "config") -> M:
    """Validate ``data`` against ``model``; every problem is listed in one PolyspecError."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "<root>"
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"{loc}: {msg}")
        raise PolyspecError(f"{source}: " + "; ".join(problems)) from None


def load_config(
    model: type[M], path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> M:
    """YAML (optional) -> overrides -> validated model (defaults fill the rest)."""
    data = read_yaml(path) if path is not None else {}
    data = apply_overrides(data, overrides)
    return validate(model, data, source=str(path) if path else "config")


def _deep_copy(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (_deep_copy(v) if isinstance(v, dict) else v) for k, v in d.items()}
