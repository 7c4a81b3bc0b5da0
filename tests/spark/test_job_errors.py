"""How the streaming job types a failure of the ``spark`` engine's MERGE (:func:`ticdc_delta.spark.job._unwrap`):
Delta Lake's real refusals, from a real Spark session and real Delta tables."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ticdc_delta.cli import EXIT_TERMINAL, exit_code_for
from ticdc_delta.delta.sink import OP_COLUMN
from ticdc_delta.errors import SinkError
from ticdc_delta.spark.job import _unwrap

pytestmark = pytest.mark.integration  # a Spark session


def _merge_error(spark: Any, path: str, row: tuple) -> BaseException:
    """What the ``spark`` engine's MERGE of ``row`` (id, note) into the table at ``path`` raises: the engine's
    own MERGE (op column, null-safe key, update/insert on ``'u'``)."""
    from delta.tables import DeltaTable

    source = spark.createDataFrame([(*row, "u")], f"id long, note string, `{OP_COLUMN}` string")
    op = f"s.`{OP_COLUMN}`"
    try:
        (DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.id <=> s.id")
         .whenMatchedUpdate(f"{op} = 'u'", {"note": "s.note"})
         .whenNotMatchedInsert(f"{op} = 'u'", {"id": "s.id", "note": "s.note"})
         .execute())
    except Exception as exc:  # noqa: BLE001 - the refusal under test
        return exc
    raise AssertionError("the MERGE was not refused")


@pytest.mark.parametrize("value", ["503 Service Unavailable", "connection reset by peer", "upstream timed out"])
def test_a_check_constraint_refusing_a_row_is_terminal_whatever_the_row_says(
    spark: Any, tmp_path: Path, value: str
) -> None:
    """Regression: Delta Lake's refusal quotes the row's values, and a value that reads like a storage outage
    made the job exit 75 (retry) for ever."""
    path = str(tmp_path / "t")
    spark.createDataFrame([(1, "ok")], "id long, note string").write.format("delta").save(path)
    spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT note_ok CHECK (note = 'ok')")
    error = _merge_error(spark, path, (2, value))
    assert "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES" in str(error) and value in str(error)

    handler = SimpleNamespace(error=error, cfg=SimpleNamespace(checkpoint=str(tmp_path / "ckpt")))
    typed = _unwrap(RuntimeError(f"[STREAM_FAILED] Query terminated with exception: {error}"), handler)
    assert type(typed) is SinkError and exit_code_for(typed) == EXIT_TERMINAL
    assert ("a write to a Delta table failed: a table constraint (a user's CHECK constraint, NOT NULL column or "
            "generated column) refused a row") in str(typed)
    assert "CHECK constraint note_ok" in str(typed) and "\n" not in str(typed)


def test_a_not_null_column_refusing_a_row_is_terminal(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{path}` (id long, note string NOT NULL) USING delta")
    error = _merge_error(spark, path, (1, None))

    typed = _unwrap(error, SimpleNamespace(error=None, cfg=SimpleNamespace(checkpoint=str(tmp_path / "ckpt"))))
    assert type(typed) is SinkError and exit_code_for(typed) == EXIT_TERMINAL
    assert "refused a row" in str(typed) and "NOT NULL constraint violated for column: note" in str(typed)
