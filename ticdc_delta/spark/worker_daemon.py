"""Spark's Python worker daemon, with the job's heavy imports done once, before it forks workers.

Spark starts ``python -m <spark.python.daemon.module>`` once per executor and forks a worker from it for
every Python task (Kafka reads, decoding). Importing pyarrow, confluent-kafka and the codecs in each
fresh worker costs about a second per task on a small machine; importing them here, in the parent, makes
every forked worker start with them loaded (a worker is forked again whenever Spark drops one, e.g. after
a task that stopped reading early). The daemon itself is pyspark's (``pyspark.daemon``), run
unchanged after the imports.

Every Python task also starts with ``importlib.invalidate_caches()`` (pyspark's ``setup_spark_files``),
which makes each zip importer on ``sys.path`` read its archive's whole directory again — with pyspark's
own ``PYTHONPATH`` that is ``pyspark.zip`` and the spark-core jar, ~6,500 entries: ~0.25 s of every task
here, more than a small micro-batch's decoding. :func:`keep_unchanged_zip_directories` makes that re-read
happen only for an archive that changed on disk.

pyspark's daemon runs a full ``gc.collect()`` in a reused worker after every task. With the imports above
that walked ~110,000 objects each time, ~55–60 ms of CPU per task here (py-spy: ~6 % of the Python
workers' time in a 250k-change run), and wrote to the pages of every one of them, which a forked worker
otherwise shares with the daemon. The daemon freezes what it has loaded before it forks (``gc.freeze()``:
moved to a generation the collector never walks), so a worker's collection only walks what its tasks
made.
"""

import gc
import os
import runpy
import sys
import zipimport
from typing import Any, Callable

import confluent_kafka  # noqa: F401 - preloaded for the forked workers
import orjson  # noqa: F401
import pandas  # noqa: F401 - pyspark's Arrow UDF serializers import it in every new worker
import pyarrow  # noqa: F401
import pyspark.sql.pandas.serializers  # noqa: F401
# what pyspark.daemon imports, loaded before gc.freeze() (see __main__); not pyspark.daemon itself, which
# runpy runs as __main__ below (it warns when the module was imported already)
import pyspark.worker  # noqa: F401

import ticdc_delta.codec.avro  # noqa: F401
import ticdc_delta.codec.canal_json  # noqa: F401
import ticdc_delta.codec.craft  # noqa: F401
import ticdc_delta.codec.open_protocol  # noqa: F401
import ticdc_delta.config  # noqa: F401 - pydantic, yaml: unpickling the engine's per-table job needs them
import ticdc_delta.core.table_rules  # noqa: F401
import ticdc_delta.spark.decode  # noqa: F401

# Not deltalake (nor the modules that import it, e.g. ticdc_delta.spark.engine): it starts a thread at
# import, and its runtime refuses to run in a process forked after that.

__all__ = ["keep_unchanged_zip_directories"]


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def keep_unchanged_zip_directories() -> Callable[[], None]:
    """Make ``zipimporter.invalidate_caches`` re-read an archive's directory only when the archive's
    modification time or size changed since it was last read (a new or replaced archive is still read
    again, as ``importlib.invalidate_caches`` promises). Archives already on ``sys.path`` count as read now.

    Returns:
        A function that puts the original ``invalidate_caches`` back.
    """
    original = zipimport.zipimporter.invalidate_caches
    read: dict[str, tuple[int, int] | None] = {}

    def invalidate_caches(self: Any) -> None:
        stamp = _stamp(self.archive)
        if stamp is not None and read.get(self.archive) == stamp:
            return
        original(self)
        read[self.archive] = stamp

    for importer in list(sys.path_importer_cache.values()):
        if isinstance(importer, zipimport.zipimporter):
            read[importer.archive] = _stamp(importer.archive)
    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]

    def restore() -> None:
        zipimport.zipimporter.invalidate_caches = original  # type: ignore[method-assign]

    return restore


if __name__ == "__main__":
    keep_unchanged_zip_directories()
    gc.collect()  # (no garbage left to freeze forever)
    gc.freeze()  # the loaded modules' objects: never walked again by a worker's collections
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
