"""``python -m ticdc_delta``: see :mod:`ticdc_delta.cli`."""

from .cli import entry

raise SystemExit(entry())
