"""The spark engine's conflict handling (no JVM: the retry loop around a commit attempt) and its MERGE's key range."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.delta.sink import OP_COLUMN
from ticdc_delta.errors import ConcurrentCommitError, TransientError
from ticdc_delta.spark.engine import SparkEngine, is_conflict, staging_path


def _engine(tmp_path: Path, retries: int) -> SparkEngine:
    cfg = config_from_mapping({
        "changefeed": "cf", "source": {"bootstrap_servers": "127.0.0.1:1", "topic": "t", "protocol": "craft"},
        "sink": {"path": str(tmp_path / "lake"), "engine": "spark", "conflict_retries": retries},
        "checkpoint": str(tmp_path / "ckpt"),
    })
    return SparkEngine(types.SimpleNamespace(cfg=cfg))


class _JavaError(Exception):
    """Stands in for the Py4J error text Delta's conflicts arrive as."""


def test_conflicts_are_retried_then_retryable(tmp_path: Path) -> None:
    engine = _engine(tmp_path, 2)
    calls = []

    def lose() -> None:
        calls.append(1)
        raise _JavaError("io.delta.exceptions.ConcurrentAppendException: Files were added to the root of the table")

    with pytest.raises(ConcurrentCommitError, match="kept conflicting \\(3 attempts\\).*ConcurrentAppendException") as info:
        engine._retry("merge into s.t", lose)
    assert len(calls) == 3 and isinstance(info.value, TransientError)


def test_a_conflict_then_success_commits_once_and_other_errors_pass_through(tmp_path: Path) -> None:
    engine = _engine(tmp_path, 3)
    outcomes = [_JavaError("ConcurrentDeleteReadException: a file was removed"), "done"]

    def attempt() -> str:
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out

    assert engine._retry("merge", attempt) == "done" and outcomes == []
    with pytest.raises(ValueError, match="not a conflict"):
        engine._retry("merge", lambda: (_ for _ in ()).throw(ValueError("not a conflict")))
    assert not is_conflict(ValueError("cannot cast string to long"))
    assert is_conflict(_JavaError("[DELTA_CONCURRENT_APPEND] ConcurrentAppendException"))


def test_staging_lives_under_the_checkpoint(tmp_path: Path) -> None:
    assert staging_path(str(tmp_path / "ckpt")) == str(tmp_path / "ckpt" / "staging")


def test_the_merge_source_conversion_picks_columns_by_name_whatever_the_image_layout() -> None:
    """A MERGE source's rows come from final changes whose images list their columns in any order, or only
    the key (a delete): each typed column takes the image's value of that name, null where it has none —
    what the ``delta-rs`` applier's conversion gives."""
    import pickle

    import pyarrow as pa

    from ticdc_delta.core.merge import DELETE, UPSERT
    from ticdc_delta.delta.arrow_types import arrow_type_for, converter_for
    from ticdc_delta.spark.engine import _typed_fn

    long_, text, date_ = 8, 15, 10  # MySQL type codes: BIGINT, VARCHAR, DATE
    fields = [("id", "id", long_, 10, None), ("note", "note", text, 0, None), ("day", "day", date_, 0, None)]
    schema = pa.schema([pa.field(n, arrow_type_for(t, f, p)) for _, n, t, f, p in fields]
                       + [pa.field(OP_COLUMN, pa.string())])
    changes = [
        (UPSERT, (("id", long_, 10, 1), ("note", text, 0, "a"), ("day", date_, 0, "2024-01-02")), 5, "insert"),
        (UPSERT, (("day", date_, 0, "2024-02-03"), ("id", long_, 10, 2), ("note", text, 0, None)), 6, "update"),
        (DELETE, (("id", long_, 10, 3),), 7, "delete"),
        (UPSERT, (("id", long_, 10, 4), ("note", text, 0, "d"), ("day", date_, 0, "2024-01-02")), 8, "insert"),
        (UPSERT, (("id", long_, 10, 5), ("extra", text, 0, "x"), ("note", text, 0, "e")), 9, "insert"),
    ]
    batch = pa.RecordBatch.from_pydict({"payload": [pickle.dumps(c) for c in changes]})
    got = pa.Table.from_batches(list(_typed_fn(fields, None, True, "UTC", schema)(iter([batch])))).to_pylist()

    def expected(change: tuple) -> dict:
        image = {c[0]: c[3] for c in change[1]}
        row = {n: None if image.get(n) is None else converter_for(t, f, p)(image[n]) for _, n, t, f, p in fields}
        return {**row, OP_COLUMN: "d" if change[0] == DELETE else "u"}

    assert got == [expected(c) for c in changes]
    assert got[2] == {"id": 3, "note": None, "day": None, OP_COLUMN: "d"}
    assert got[1]["day"].isoformat() == "2024-02-03"


def test_picker_takes_values_by_name_as_a_dict_of_the_image_would() -> None:
    from ticdc_delta.spark.engine import _picker

    assert _picker(("id",), ["id"])((5,)) == (5,)
    assert _picker(("a", "b"), ["b", "a"])((1, 2)) == (2, 1)
    assert _picker(("a", "b", "a"), ["a"])((1, 2, 3)) == (3,)  # a repeated name: its last value
    assert _picker(("a",), ["a", "z"])((1,)) == (1, None)
    assert _picker(("a",), ["z"])((1,)) == (None,)
    assert _picker((), [])(()) == ()


@pytest.mark.integration
def test_the_key_range_bounds_each_integer_decimal_or_string_key_column_without_nulls(spark: Any) -> None:
    """``_key_range``: per key column of an integer, decimal or string type without a null in the source,
    the source's least and greatest key as conditions on the target (alias ``t``); a null (which ``<=>``
    matches) or another type leaves its column unbounded, an empty source bounds nothing, nor a range outside
    which the target's files hold fewer than ``least`` rows."""
    import functools
    from decimal import Decimal

    from pyspark.sql import functions as F

    from ticdc_delta.spark.engine import _key_range

    big = 18446744073709551000  # BIGINT UNSIGNED: decimal(20,0)
    source = spark.createDataFrame([(5, "kb", None, 1.5, Decimal(big + 1)), (9, "ka", 1, 2.5, Decimal(big + 3)),
                                    (7, "kc", 2, 0.5, Decimal(big + 2))],
                                   "id long, `a name` string, n int, f double, u decimal(20,0)")
    conds = _key_range(source, ["id", "a name", "n", "f", "u"])
    assert len(conds) == 6  # id, "a name" and u: n holds a null, f is a double
    target = spark.range(0, 12).select("id", F.concat(F.lit("k"), F.expr("char(97 + id % 4)")).alias("a name"),
                                       F.lit(None).cast("int").alias("n"), F.lit(0.0).alias("f"),
                                       (F.lit(Decimal(big)).cast("decimal(20,0)") + F.col("id") % 5).cast("decimal(20,0)").alias("u")).alias("t")
    kept = target.where(functools.reduce(lambda a, b: a & b, conds)).select("id").collect()
    # ids 5-9 whose names lie in ka-kc (7's is kd) and whose u lies in big+1 .. big+3 (5's is big+0)
    assert sorted(r["id"] for r in kept) == [6, 8]
    assert _key_range(source.limit(0), ["id"]) == []
    assert _key_range(source, ["f", "missing"]) == []
    # with the target's files: kept when the files outside the range hold at least `least` rows
    stats = pa.struct([("id", pa.int64())])
    files = pa.table({"num_records": [5, 5, 2], "min": pa.array([{"id": 0}, {"id": 5}, {"id": 10}], stats),
                      "max": pa.array([{"id": 4}, {"id": 9}, {"id": 11}], stats)})  # ids 5-9: 7 rows outside
    assert len(_key_range(source, ["id"], files, 7)) == 2
    assert _key_range(source, ["id"], files, 8) == []


def test_the_rules_find_each_integer_key_columns_range_and_buckets_combine_them() -> None:
    """``_span`` / ``_key_ranges``: the least and greatest value of each integer key column (integer text
    too, as its converter reads it); ``None`` for a column with a null or missing from an image; nothing for
    a column of another type (a Spark job finds its range). ``_add_meta`` widens the ranges over buckets."""
    from ticdc_delta.codec.model import TypeCode
    from ticdc_delta.spark.engine import _add_meta, _key_ranges, _span

    spans: dict = {}
    for image in ([("id", TypeCode.BIGINT, 0, 7), ("s", TypeCode.VARCHAR, 0, "b"), ("n", TypeCode.INT, 0, 1),
                   ("gone", TypeCode.INT, 0, 1)],
                  [("id", TypeCode.BIGINT, 0, "3"), ("s", TypeCode.VARCHAR, 0, "a"), ("n", TypeCode.INT, 0, None)],
                  [("id", TypeCode.BIGINT, 0, 12), ("s", TypeCode.VARCHAR, 0, "c"), ("n", TypeCode.INT, 0, 2)]):
        for name, type_code, _, value in image:
            _span(spans, name, type_code, value)
    assert _key_ranges(spans, ["id", "s", "n", "gone", "never"], 3) == {
        "id": (3, 12), "n": None, "gone": None, "never": None}

    metas: dict = {}
    base = {"keys": ["id", "n"], "col_types": [("id", (8, 0))], "rows": 1, "deleted": 0, "last_ts": None}
    _add_meta(metas, (0, "s", "t"), {**base, "ranges": {"id": (5, 9), "n": (1, 1)}})
    _add_meta(metas, (0, "s", "t"), {**base, "ranges": {"id": (-2, 6), "n": None}})
    _add_meta(metas, (0, "s", "t"), {**base, "ranges": {"id": (4, 20)}})  # n: another type there
    assert metas[(0, "s", "t")]["ranges"] == {"id": (-2, 20), "n": None}
    assert metas[(0, "s", "t")]["rows"] == 3


def test_the_key_range_takes_known_integer_ranges_without_a_job(spark: Any) -> None:
    """``_key_range(known=...)``: a key column whose range the rules found is bounded by it, with no Spark
    job over the source (this source fails when read); ``None`` leaves it unbounded; a range its column's
    type cannot hold, or a column not known, is found by the job."""
    from decimal import Decimal

    from pyspark.sql import functions as F

    from ticdc_delta.spark.engine import _key_range

    unreadable = spark.range(1).select(F.expr("CAST(raise_error('read') AS BIGINT)").alias("id"),
                                       F.expr("CAST(raise_error('read') AS DECIMAL(20,0))").alias("u"),
                                       F.expr("CAST(raise_error('read') AS INT)").alias("n"))
    big = 18446744073709551000
    conds = _key_range(unreadable, ["id", "u", "n"], known={"id": (3, 9), "u": (big, big + 5), "n": None})
    target = spark.createDataFrame([(i, Decimal(big + i - 3), 0) for i in range(0, 12)],
                                   "id long, u decimal(20,0), n int").alias("t")
    kept = target.where(conds[0] & conds[1] & conds[2] & conds[3]).select("id").collect()
    assert len(conds) == 4 and sorted(r["id"] for r in kept) == [3, 4, 5, 6, 7, 8]
    with pytest.raises(Exception, match="read"):  # n's range beyond an INT: the job finds it
        _key_range(unreadable, ["n"], known={"n": (0, 1 << 40)})
    readable = spark.createDataFrame([(4, 1), (6, 2)], "id long, n int")
    assert len(_key_range(readable, ["id", "n"], known={"id": (4, 6)})) == 4  # n by the job
