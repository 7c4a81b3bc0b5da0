"""The README's YAML examples stay loadable (the README is kept true to the code)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ticdc_delta.config import load_config

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)


def test_readme_has_a_config_example() -> None:
    assert BLOCKS


@pytest.mark.parametrize("block", BLOCKS)
def test_readme_yaml_loads(block: str, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(block)
    cfg = load_config(path, env={"KAFKA_PASSWORD": "not-a-real-password"})
    assert cfg.changefeed and cfg.source.protocol
    assert "not-a-real-password" not in repr(cfg)
