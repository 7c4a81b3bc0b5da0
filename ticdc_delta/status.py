"""``python -m ticdc_delta status``: what the job has applied, how far behind it is, what it holds.

Reads only the job's state table (no Spark, no Kafka), so it is cheap and safe to run while the job runs.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from .config import JobConfig
from .core.records import ChangeRecord, load_record
from .core.resolved_ts import lowest
from .delta.compaction import table_name
from .delta.state_store import RESET_BATCH_ID, StateStore
from .errors import SinkError, StorageUnavailableError
from .locations import child_location
from .spark.batch_handler import DEAD_LETTER_IDENT

__all__ = ["collect_status", "render_status"]


_LOAD_ATTEMPTS = 3


def _lag_s(ts: int | None, now: float) -> float | None:
    return None if not ts else round(now - (ts >> 18) / 1000.0, 3)


def collect_status(cfg: JobConfig, *, now: float | None = None) -> dict[str, Any]:
    """The job's status as a dict (see :func:`render_status`)."""
    now = time.time() if now is None else now
    store = StateStore(child_location(cfg.checkpoint, "state"), cfg.changefeed,
                       storage_options=cfg.sink.storage_options or None)
    for attempt in range(_LOAD_ATTEMPTS):
        try:
            state = store.load()
            break
        except StorageUnavailableError:
            raise
        except SinkError:
            # the running job's state save vacuums the table now and then: the files of the version this
            # read found may be gone by the time it reads them; a new read finds the next version
            if attempt == _LOAD_ATTEMPTS - 1:
                raise
            time.sleep(0.2)
    if state is None:  # (the same keys as below: a monitor reads one shape whatever the state)
        return {"changefeed": cfg.changefeed, "batch_id": None, "watermark": None, "watermark_lag_s": None,
                "watermarks": {}, "waiting_for": [], "rows_held": 0, "ddl_held": 0, "totals": {}, "tables": {},
                "dead_letter": {"path": cfg.dead_letter_path, "rows": 0, "compactions": 0}, "snapshots": {}}
    held: Counter[str] = Counter()
    ddl_held = 0
    for payload in state.held:
        rec = load_record(payload)
        if not isinstance(rec, ChangeRecord):  # a DDL waiting for its turn: of no table's rows
            ddl_held += 1
            continue
        held[f"{rec.schema}.{rec.table}"] += 1
    held.update(state.meta.get("held_by_table") or {})  # sink.engine: spark keeps held rows in its staging table
    # small-file compactions (ticdc_delta/delta/compaction.py), recorded with the state after the one they follow
    compacted = (state.meta.get("compaction") or {}).get("tables", {})
    tables: dict[str, Any] = {}
    for name, entry in sorted(state.meta.get("tables", {}).items()):
        ts = entry.get("commit_ts")
        tables[name] = {
            "applied_commit_ts": ts,
            "lag_s": _lag_s(ts, now),
            "rows_applied": entry.get("rows_applied", 0),
            "rows_held": held.get(name, 0),
            "compactions": compacted.get(name, {}).get("compactions", 0),
        }
    for name, n in held.items():
        tables.setdefault(name, {"applied_commit_ts": None, "lag_s": None, "rows_applied": 0, "rows_held": n,
                                 "compactions": compacted.get(name, {}).get("compactions", 0)})
    totals = state.meta.get("totals", {})
    # what went to the dead-letter table: undecodable messages, refused values, implausible commit ts
    dead_letter = {"path": cfg.dead_letter_path,
                   "rows": totals.get("dead_letters", 0) + totals.get("implausible_ts", 0),
                   "compactions": compacted.get(table_name(DEAD_LETTER_IDENT), {}).get("compactions", 0)}
    wms = {f"{t}[{p}]": ts for (t, p), ts in sorted(state.watermarks.items())}
    topic_wms = state.meta.get("topic_watermarks", {})
    low = lowest(topic_wms.values())  # (none while a topic has none: the bound rows wait for)
    return {
        "changefeed": cfg.changefeed,
        "batch_id": state.batch_id,
        "watermark": low,
        "watermark_lag_s": _lag_s(low, now),
        "watermarks": wms,
        # the topics without a resolved ts yet: every row waits for them (the watermark is null meanwhile)
        "waiting_for": sorted(t for t, ts in topic_wms.items() if ts is None),
        "rows_held": sum(held.values()) + ddl_held,  # (as the progress line counts them: DDL included)
        "ddl_held": ddl_held,
        "totals": totals,
        "tables": tables,
        "dead_letter": dead_letter,
        # per table loaded by the `snapshot` command: TSO, status (loading/done), export, rows
        "snapshots": {f"{e.get('schema')}.{e.get('table')}": {k: e.get(k) for k in ("tso", "status", "source", "rows")}
                      for e in state.meta.get("snapshots", {}).values()},
    }


def render_status(cfg: JobConfig, *, as_json: bool = False, now: float | None = None) -> str:
    """The status as JSON or as a small table."""
    st = collect_status(cfg, now=now)
    if as_json:
        return json.dumps(st, indent=2, sort_keys=True) + "\n"
    if st["batch_id"] is None:
        return f"changefeed {cfg.changefeed}: no micro-batch committed yet\n"
    # a state written by `reset` or `snapshot`: no micro-batch has run since; the next one is batch 0
    last = "none since reset/snapshot" if st["batch_id"] == RESET_BATCH_ID else st["batch_id"]
    lines = [
        f"changefeed {st['changefeed']}: last batch {last}, watermark {st['watermark']} "
        f"(lag {st['watermark_lag_s']} s), rows held {st['rows_held']}"
        + (f", DDL held {st['ddl_held']}" if st["ddl_held"] else ""),
    ]
    if st["waiting_for"]:
        lines.append(f"waiting for the first resolved ts of topic(s) {', '.join(st['waiting_for'])}: "
                     "every row is held until they have one")
    width = max([len("table")] + [len(n) for n in st["tables"]])
    # "age s": the age of the table's last applied change (an idle table's grows; the watermark's lag
    # above says how far behind the job is)
    lines.append(f"{'table':<{width}}  {'applied commit ts':>20}  {'age s':>12}  {'applied':>10}  {'held':>8}"
                 f"  {'compactions':>11}")
    for name, t in st["tables"].items():
        lines.append(
            f"{name:<{width}}  {str(t['applied_commit_ts']):>20}  {str(t['lag_s']):>12}  "
            f"{t['rows_applied']:>10}  {t['rows_held']:>8}  {t['compactions']:>11}"
        )
    dead = st["dead_letter"]
    if dead["rows"]:
        lines.append(f"dead letters: {dead['rows']} in {dead['path']} (compactions {dead['compactions']})")
    return "\n".join(lines) + "\n"
