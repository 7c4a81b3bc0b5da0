"""The bench CLI parses its arguments and its small pure helpers hold (no broker, no Spark; no timings)."""

from __future__ import annotations

from typing import Any

import pytest

from ticdc_delta import bench
from ticdc_delta.bench_e2e import CanalStream, PeakRss, _core_views, _master_cores, generate_stream
from ticdc_delta.bench_latency import percentile


@pytest.mark.parametrize(
    ("argv", "command", "expected"),
    [
        (["e2e", "--events", "100", "--engines", "spark", "--master", "local[1]", "--no-source"], "e2e",
         {"events": 100, "engines": ["spark"], "master": "local[1]", "no_source": True, "no_baseline": False}),
        (["e2e"], "e2e", {"engines": ["delta-rs", "spark"], "master": None, "runs": 2}),
        (["e2e", "--runs", "3"], "e2e", {"runs": 3}),
        (["cores", "--events", "1000"], "cores", {"events": 1000, "masters": ["local[1]", "local[2]"],
                                                  "engines": ["spark"], "runs": 2}),
        (["cores", "--runs", "1"], "cores", {"runs": 1, "no_pin": False}),
        (["cores", "--no-pin"], "cores", {"no_pin": True}),
        (["e2e", "--cpus", "1"], "e2e", {"cpus": 1}),
        (["latency", "--engine", "delta-rs", "--seconds", "15", "--rate", "500"], "latency",
         {"engines": ["delta-rs"], "seconds": 15.0, "rate": 500, "batches": 10, "warm_batches": 100}),
        (["latency", "--warm-batches", "0"], "latency", {"engines": ["delta-rs", "spark"], "warm_batches": 0}),
        (["tables", "--threads", "1", "3", "--schedulers", "FAIR", "--busy", "500"], "tables",
         {"threads": [1, 3], "schedulers": ["FAIR"], "busy": 500, "tables": 8, "changes": 20, "rounds": 4,
          "summary_json": None}),
        (["heap"], "heap", {"engines": ["delta-rs", "spark"], "tables": 4, "changes": 6000, "per_batch": 60,
                            "every": 20, "summary_json": None}),
        (["heap", "--engines", "spark", "--per-batch", "30", "--every", "10"], "heap",
         {"engines": ["spark"], "per_batch": 30, "every": 10}),
        (["bigtable"], "bigtable", {"rows": 10_000_000, "files": 40, "changes": [1, 2000], "rounds": 3,
                                    "partitions": 1, "layout": "key-order", "key_range_rows": 1}),
        (["bigtable", "--rows", "1000", "--changes", "5", "--layout", "shuffled"], "bigtable",
         {"rows": 1000, "changes": [5], "layout": "shuffled"}),
    ],
)
def test_bench_cli_parses(argv: list[str], command: str, expected: dict[str, Any],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def capture(args: Any) -> int:
        seen.update(vars(args))
        return 0

    monkeypatch.setattr(bench, f"_cmd_{command}", capture)
    # the parser binds the command functions when main() runs, so the patched one is called
    assert bench.main(argv) == 0
    for key, value in expected.items():
        assert seen[key] == value, key


def test_bench_cli_rejects_an_unknown_engine(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["latency", "--engine", "duckdb"])
    assert exc.value.code == 2
    assert "invalid choice: 'duckdb'" in capsys.readouterr().err


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile([3.0], 95) == 3.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_generated_stream_matches_the_incremental_one() -> None:
    per_part, live = generate_stream(5000, 3)
    stream = CanalStream(3)
    again: list[list[bytes]] = [[], [], []]
    for n in range(5000):
        part, msg = stream.change()
        again[part].append(msg)
        if n % 2000 == 1999 or n == 4999:
            for p in range(3):
                again[p].append(stream.watermark())
    assert again == per_part and stream.live == live


def test_peak_rss_sees_growth() -> None:
    with PeakRss(interval=0.01) as rss:
        block = bytearray(64 * 2**20)
        block[::4096] = b"x" * len(block[::4096])
        import time

        time.sleep(0.1)
    assert rss.growth() >= 32 * 2**20


def test_bench_tables_refuses_an_unknown_scheduler_and_empty_rounds() -> None:
    from ticdc_delta.bench_tables import measure_tables

    with pytest.raises(ValueError, match="scheduler must be one of FIFO, FAIR"):
        measure_tables(scheduler="RANDOM", tables=1, busy=1, changes=1, rounds=1, threads=[1], partitions=1)
    with pytest.raises(ValueError, match="must be positive"):
        measure_tables(scheduler="FAIR", tables=1, busy=1, changes=1, rounds=0, threads=[1], partitions=1)


def test_a_named_stream_writes_its_table() -> None:
    _, msg = CanalStream(2, table="t7").change()
    assert b'"table":"t7"' in msg and b'"database":"bench"' in msg


def test_a_stream_starts_its_keys_where_asked() -> None:
    stream = CanalStream(1, first_id=1000)
    _, first = stream.change()
    assert b'"id":"1000"' in first
    for _ in range(150):
        stream.change()
    assert min(stream.live) >= 1000


def test_bench_bigtable_refuses_empty_rounds_and_changes() -> None:
    from ticdc_delta.bench_bigtable import run_bigtable

    for bad in ({"rounds": 0}, {"changes": []}, {"changes": [0]}, {"files": 0}, {"rows": -1}, {"key_range_rows": 0}):
        with pytest.raises(ValueError, match="at least"):
            run_bigtable(**bad)
    with pytest.raises(ValueError, match="layout must be one of key-order, shuffled, not 'random'"):
        run_bigtable(layout="random")


def test_bench_heap_growth_is_per_100_batches_from_the_second_sample() -> None:
    from ticdc_delta.bench_heap import _growth

    samples = [{"batch": 20, "heap": 900}, {"batch": 40, "heap": 100}, {"batch": 60, "heap": 140},
               {"batch": 80, "heap": 180}]
    assert _growth(samples, "heap") == 200.0  # (180 - 100) over 40 batches; the warm-up sample left out
    assert _growth(samples[:2], "heap") is None


def test_core_views_set_the_warm_runs_against_the_warm_baseline() -> None:
    rates = [9_000.0, 14_000.0, 13_000.0]
    assert [(label, base, pick(rates)) for label, base, pick in _core_views(3)] == [
        ("first run, fresh JVM", "baseline_per_s", 9_000.0),
        ("best later run, warm JVM", "baseline_warm_per_s", 14_000.0)]
    assert [base for _, base, _ in _core_views(1)] == ["baseline_per_s"]  # one run: no warm view


@pytest.mark.parametrize(("master", "cores"), [("local[1]", 1), ("local[2]", 2), (" local[4,3] ", 4), ("local[*]", None),
                                               ("local", None), ("spark://host:7077", None)])
def test_master_cores(master: str, cores: int | None) -> None:
    assert _master_cores(master) == cores


def test_e2e_refuses_more_cpus_than_it_may_use() -> None:
    import os

    from ticdc_delta.bench_e2e import run_e2e

    with pytest.raises(ValueError, match="cpus must be between 1 and"):
        run_e2e(events=10, cpus=len(os.sched_getaffinity(0)) + 1)
    with pytest.raises(ValueError, match="cpus must be between 1 and"):
        run_e2e(events=10, cpus=0)


def test_generated_messages_take_their_own_size_in_memory() -> None:
    """``orjson.dumps`` hands back a buffer of 4-8 KiB whatever the JSON's length, never shrunk: the 1M
    messages ``bench e2e`` keeps took ~8 GiB. Each kept message must take about its length."""
    import tracemalloc

    stream = CanalStream(4)
    tracemalloc.start()
    try:
        kept = [stream.change()[1] for _ in range(2000)]
        kept.append(stream.watermark())
        payload = sum(len(m) for m in kept)
        with_them = tracemalloc.get_traced_memory()[0]
        del kept
        held = with_them - tracemalloc.get_traced_memory()[0]  # what the kept messages (and their list) held
    finally:
        tracemalloc.stop()
    assert payload < held < 1.1 * payload + 20_000, (held, payload)


def _progress_line(rows: int, seconds: float, timings: dict[str, float]) -> None:
    """One progress line as the job logs it (``BatchHandler._progress`` itself)."""
    from types import SimpleNamespace

    from ticdc_delta.spark.batch_handler import BatchHandler

    handler = SimpleNamespace(cfg=SimpleNamespace(changefeed="cf"), _unresolved_partitions=lambda: [],
                              _stalled_partitions=lambda offsets: [], _empty_topics=lambda: [])
    plan = SimpleNamespace(topic_watermarks={"t": None}, held=0, replays_dropped=0, rejected=[])
    result = SimpleNamespace(rows=rows, ddl_applied=0)
    BatchHandler._progress(handler, 0, {}, {"row": rows, "resolved": 4}, plan, result, 0, seconds, timings)  # type: ignore[arg-type]


def test_batch_phases_take_the_median_of_the_full_batches(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from ticdc_delta.bench_e2e import BatchPhases, phases_line

    progress = logging.getLogger("ticdc_delta.progress")
    before = (progress.level, progress.propagate)
    with caplog.at_level(logging.INFO), BatchPhases() as phases:
        _progress_line(1000, 9.0, {"read_decode": 4.0, "plan": 3.0, "apply": 2.0})  # the first, slow batch
        _progress_line(990, 5.0, {"read_decode": 2.0, "plan": 2.0, "apply": 1.0})
        _progress_line(1000, 6.0, {"read_decode": 3.0, "plan": 2.0, "apply": 1.0, "compact": 0.001})
        _progress_line(40, 1.0, {"read_decode": 0.5, "plan": 0.2, "apply": 0.3})  # what was left: not full
    assert not [r for r in caplog.records if r.name == "ticdc_delta.progress"]  # kept by the bench, not printed
    assert (progress.level, progress.propagate) == before
    assert [b["rows"] for b in phases.full()] == [1000, 990, 1000]
    assert phases.medians() == {"read_decode": 3.0, "plan": 2.0, "apply": 1.0, "compact": 0.0, "batch": 6.0,
                                "rows": 1000}
    assert phases_line(phases) == ("  phases : a batch of 1,000 row events 6.00 s (median of 3): read+decode 3.00 s, "
                                   "rules 2.00 s, MERGE 1.00 s; the run's first batch 9.00 s "
                                   "(read+decode 4.00, rules 3.00, MERGE 2.00)")
    _progress_line(10, 1.0, {"read_decode": 1.0})  # after the block: not recorded
    assert len(phases.batches) == 4


def test_batch_phases_without_batches() -> None:
    from ticdc_delta.bench_e2e import BatchPhases, phases_line

    with BatchPhases() as phases:
        pass
    assert phases.medians() == {} and phases_line(phases) is None


def test_the_trigger_tap_keeps_its_querys_durations_in_seconds_by_batch() -> None:
    from ticdc_delta.bench_latency import _TriggerTap

    tap = _TriggerTap("ticdc_delta_lat_spark")
    tap._on_progress({"name": "ticdc_delta_lat_spark", "batchId": 7,
                      "durationMs": {"triggerExecution": 1500, "addBatch": 1400, "walCommit": 20}})
    tap._on_progress({"name": "another_query", "batchId": 8, "durationMs": {"triggerExecution": 9000}})
    tap._on_progress({"name": "ticdc_delta_lat_spark", "batchId": 9, "durationMs": {"triggerExecution": 250}})
    assert tap.durations([7, 9]) == [{"triggerExecution": 1.5, "addBatch": 1.4, "walCommit": 0.02},
                                     {"triggerExecution": 0.25}]
    # a batch Spark has not reported (yet) is left out once the wait is over
    assert tap.durations([7, 8], timeout=0.3) == [{"triggerExecution": 1.5, "addBatch": 1.4, "walCommit": 0.02}]
