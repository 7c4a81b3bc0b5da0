"""The codec tests compare each decoder's generated code with its plain paths: here a decoder writes code for
a row shape the first time it meets it, not at its :data:`~ticdc_delta.codec.base.COMPILE_AT`-th sighting
(``test_*_compile_at_*`` tests set that threshold on their decoders)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _compile_at_first_sighting(monkeypatch: Any) -> None:
    monkeypatch.setattr("ticdc_delta.codec.base.COMPILE_AT", 1)
