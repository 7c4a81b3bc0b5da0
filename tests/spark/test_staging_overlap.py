"""The spark engine appends a batch's held rows to the staging table while its MERGEs run (real Spark, real
Delta tables). That is only sound because the held rows it read are pinned to a version: a write to a
Delta table makes Spark recompute the cached frames that read the table without one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.spark import engine as engine_module
from ticdc_delta.spark.engine import pinned_read

integration = pytest.mark.integration


def _loaded(spark: Any, frame: Any) -> bool:
    """Whether ``frame``'s cached data is still there (not dropped to be recomputed)."""
    cached = spark._jsparkSession.sharedState().cacheManager().lookupCachedData(frame._jdf)
    return bool(cached.isDefined() and cached.get().cachedRepresentation().cacheBuilder().isCachedColumnBuffersLoaded())


@integration
def test_a_frame_of_the_pinned_read_keeps_its_cache_through_an_append(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "staging")
    spark.range(5).withColumnRenamed("id", "held_at").write.format("delta").save(path)
    spark.range(5, 8).withColumnRenamed("id", "held_at").write.format("delta").mode("append").save(path)

    staged, pinned = pinned_read(spark, path)
    assert pinned
    plain = spark.read.format("delta").load(path)
    frames = [f.filter(f["held_at"] >= 2).persist() for f in (staged, plain)]
    try:
        assert [f.count() for f in frames] == [6, 6]
        assert all(_loaded(spark, f) for f in frames)

        spark.range(100, 101).withColumnRenamed("id", "held_at").write.format("delta").mode("append").save(path)

        # the control: the frame read without a version is dropped, to be recomputed (from the new version)
        assert not _loaded(spark, frames[1])
        # the pinned one keeps its rows and its cache: what the MERGEs read is not computed again
        assert _loaded(spark, frames[0])
        assert sorted(r["held_at"] for r in frames[0].collect()) == [2, 3, 4, 5, 6, 7]
        assert pinned_read(spark, path)[0].count() == 9  # a new read sees the new version
    finally:
        for f in frames:
            f.unpersist()


@integration
def test_without_the_version_the_read_is_unpinned_and_right(spark: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Delta Lake's log API moved (it is internal): the table is read without a version, and the caller
    is told not to append beside its readers."""
    path = str(tmp_path / "staging")
    spark.range(3).write.format("delta").save(path)

    class _Moved:
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError("no such method: update(boolean, scala.Option, scala.Option)")

    warned: set[str] = set()
    monkeypatch.setattr(engine_module, "_UNPINNED", warned)
    with monkeypatch.context() as m:
        m.setattr(spark, "_jvm", _Moved())
        frame, pinned = pinned_read(spark, path)
    assert not pinned
    assert frame.count() == 3
    assert warned == {path}  # warned once per table
