from pathlib import Path

import pytest
import yaml

from polyspec.config import StrictModel, apply_overrides, load_config
from polyspec.errors import PolyspecError
from polyspec.languages import Language
from polyspec.paths import configs_dir
from polyspec.targets import TargetSpec


class Inner(StrictModel):
    batch_size: int = 4
    temps: list[float] = [0.0, 1.0]


class Demo(StrictModel):
    n: int = 8
    name: str = "x"
    inner: Inner = Inner()


def test_yaml_then_overrides_then_defaults(tmp_path: Path):
    f = tmp_path / "c.yaml"
    f.write_text("# python -m something --config c.yaml\nn: 16\ninner:\n  batch_size: 2\n")
    cfg = load_config(Demo, f, ["inner.temps=[0.3, 0.7]", "name=hello"])
    assert cfg.n == 16 and cfg.name == "hello"
    assert cfg.inner.batch_size == 2 and cfg.inner.temps == [0.3, 0.7]


def test_all_problems_reported_together(tmp_path: Path):
    f = tmp_path / "c.yaml"
    f.write_text("n: many\ntypo_key: 1\ninner:\n  batchsize: 3\n")
    with pytest.raises(PolyspecError) as e:
        load_config(Demo, f)
    msg = str(e.value)
    assert "\n" not in msg
    for part in ("n:", "typo_key: unknown key", "inner.batchsize: unknown key"):
        assert part in msg


def test_bad_override_and_missing_file(tmp_path: Path):
    with pytest.raises(PolyspecError, match="key.path=value"):
        apply_overrides({}, ["novalue"])
    with pytest.raises(PolyspecError, match="not found"):
        load_config(Demo, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("n: [1,\n")
    with pytest.raises(PolyspecError, match="invalid YAML"):
        load_config(Demo, bad)


def test_overrides_do_not_mutate_input():
    data = {"inner": {"batch_size": 1}}
    apply_overrides(data, ["inner.batch_size=5"])
    assert data == {"inner": {"batch_size": 1}}


@pytest.mark.parametrize(
    "path", sorted(configs_dir().rglob("*.yaml")), ids=lambda p: str(p.relative_to(configs_dir()))
)
def test_every_shipped_yaml_parses_and_validates(path: Path):
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    assert path.read_text(encoding="utf-8").startswith("#"), (
        "each YAML starts with a comment naming its command"
    )
    schema = {"targets": TargetSpec, "languages": Language}.get(path.parent.name)
    if schema is not None:
        schema.model_validate(data)
