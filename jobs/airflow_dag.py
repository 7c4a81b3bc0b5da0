"""Airflow DAG example: run the ticdc-delta job ``--once`` every few minutes, with retries.

Copy this file into Airflow's ``dags/`` folder and set (as environment variables of the scheduler and
workers, or edit the constants below):

``TICDC_DELTA_HOME``
    the checkout / install directory holding ``jobs/ticdc_to_delta.py`` (default ``/opt/ticdc-delta``).
``TICDC_DELTA_CONFIG``
    the job's YAML configuration (default ``$TICDC_DELTA_HOME/conf/demo.yaml``); secrets it references
    as ``${VAR}`` must be in the task's environment (Airflow connections/variables → env).
``TICDC_DELTA_EVERY_MINUTES``
    the schedule interval (default 10).
``SPARK_SUBMIT`` / ``SPARK_SUBMIT_ARGS``
    the spark-submit command (default ``spark-submit``) and its options (default ``--master local[2]``;
    spark-submit's settings win over the ``spark:`` section of the YAML).

Each run is ``spark-submit jobs/ticdc_to_delta.py --config FILE --once``: it processes what Kafka holds
now, commits, and exits. The job's exit code says what to do next:

* ``0`` — done.
* ``75`` (``EX_TEMPFAIL``) — *retryable*: the broker was unreachable, another writer won a Delta commit.
  Airflow's retry-on-failure runs it again after ``retry_delay`` (with exponential back-off).
* ``1`` — *terminal*: bad configuration, an undecodable message with ``dead_letter.fail_on_error``, a DDL
  refused by a ``fail`` policy. Retrying cannot fix it; **a human must be paged**. A BashOperator cannot
  tell 1 from 75 (both fail the task), so a terminal failure is retried too — quick, harmless, and
  failing the same way — and once the retries are spent ``on_failure_callback`` fires: wire
  :func:`page_on_call` to your paging tool (PagerDuty, Opsgenie, Slack...). The task log names the error.
* ``143`` — stopped by SIGTERM: Airflow killed the task (``execution_timeout``, marked failed). Its
  process group gets the signal, spark-submit's JVM too, which shuts down at once: the micro-batch in
  flight is done again by the next run (safe; nothing is lost or applied twice).

``max_active_runs=1`` matters: two runs sharing one checkpoint must never overlap. ``catchup=False``:
a missed interval needs no backfill — the next run reads everything that accumulated.

This file imports without Airflow installed (the DAG is then simply not defined), so it can be
checked with ``python -m py_compile`` and imported by tests.
"""

from __future__ import annotations

import logging
import os
import shlex
from datetime import datetime, timedelta
from typing import Any

__all__ = ["DAG_ID", "EXIT_RETRYABLE", "EXIT_TERMINAL", "bash_command", "page_on_call", "dag"]

log = logging.getLogger(__name__)

DAG_ID = "ticdc_to_delta"
EXIT_TERMINAL = 1  # see ticdc_delta.cli: retrying cannot help, page a human
EXIT_RETRYABLE = 75  # EX_TEMPFAIL: Airflow's retry handles it

TICDC_DELTA_HOME = os.environ.get("TICDC_DELTA_HOME", "/opt/ticdc-delta")
CONFIG_PATH = os.environ.get("TICDC_DELTA_CONFIG", f"{TICDC_DELTA_HOME}/conf/demo.yaml")
EVERY_MINUTES = int(os.environ.get("TICDC_DELTA_EVERY_MINUTES", "10"))
SPARK_SUBMIT = os.environ.get("SPARK_SUBMIT", "spark-submit")
SPARK_SUBMIT_ARGS = os.environ.get("SPARK_SUBMIT_ARGS", "--master local[2]")


def bash_command(
    config_path: str = CONFIG_PATH,
    home: str = TICDC_DELTA_HOME,
    spark_submit: str = SPARK_SUBMIT,
    spark_submit_args: str = SPARK_SUBMIT_ARGS,
) -> str:
    """The shell command one run executes; its exit code is the job's (0 done, 1 terminal, 75 retryable).

    ``exec`` makes spark-submit the task's process, so its exit code (the Python driver's, which
    spark-submit passes on) is what Airflow sees.
    """
    args = " ".join(shlex.quote(a) for a in shlex.split(spark_submit_args))
    return (
        f"cd {shlex.quote(home)} && exec {spark_submit} {args} "
        f"jobs/ticdc_to_delta.py --config {shlex.quote(config_path)} --once"
    )


def page_on_call(context: dict[str, Any]) -> None:
    """``on_failure_callback``: the task failed for good (retries spent). Replace the log line with a
    call to your paging tool; the exit code is in the task log (1 = terminal: a human must act)."""
    ti = context.get("task_instance")
    log.error(
        "ticdc-delta run failed after retries: dag=%s task=%s try=%s log=%s — page the on-call engineer",
        getattr(ti, "dag_id", DAG_ID),
        getattr(ti, "task_id", "?"),
        getattr(ti, "try_number", "?"),
        getattr(ti, "log_url", "?"),
    )


try:  # Airflow 3 moved BashOperator to the standard provider; Airflow 2 has it in airflow.operators
    from airflow import DAG

    try:
        from airflow.providers.standard.operators.bash import BashOperator
    except ImportError:
        from airflow.operators.bash import BashOperator
except ImportError:  # no Airflow here: keep the module importable (py_compile, tests, docs)
    DAG = None  # type: ignore[assignment,misc]
    BashOperator = None  # type: ignore[assignment,misc]

dag: Any = None

if DAG is not None:
    with DAG(
        dag_id=DAG_ID,
        description="Land the TiCDC change stream in Delta tables (ticdc-delta run --once)",
        schedule=timedelta(minutes=EVERY_MINUTES),
        start_date=datetime(2025, 1, 1),
        catchup=False,
        max_active_runs=1,  # one checkpoint, one writer: runs must never overlap
        default_args={
            "owner": "data-platform",
            "retries": 3,  # exit 75 (retryable) is what these are for
            "retry_delay": timedelta(minutes=1),
            "retry_exponential_backoff": True,
            "max_retry_delay": timedelta(minutes=15),
            "execution_timeout": timedelta(minutes=max(EVERY_MINUTES * 3, 30)),
            "on_failure_callback": page_on_call,  # retries spent: page a human
        },
        tags=["ticdc", "delta", "cdc"],
    ) as dag:
        BashOperator(
            task_id="ticdc_to_delta_once",
            bash_command=bash_command(),
            env={"PYTHONUNBUFFERED": "1"},
            append_env=True,  # keep the worker's environment: ${VAR} secrets of the YAML config come from it
        )
