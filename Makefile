# ticdc-delta — every target sets up .venv and .jars on first use (prerequisites: Python 3.11+, Java 17, Maven).
PYTHON ?= python3
MVN    ?= mvn
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
JARS   := .jars
JARS_STAMP := $(JARS)/.fetched-stamp

.PHONY: install mariadb demo test test-spark test-fast bench bench-decode bench-e2e bench-cores bench-latency bench-tables bench-heap bench-bigtable soak clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	@touch $(STAMP)

# Spark's Kafka source + Delta Lake (jvm/spark/pom.xml) and the Kafka broker (jvm/broker/pom.xml), fetched
# from Maven Central into two separate folders: the broker's kafka-clients must not meet Spark's.
$(JARS_STAMP): jvm/spark/pom.xml jvm/broker/pom.xml jvm/settings.xml
	rm -rf $(JARS)/spark $(JARS)/broker
	$(MVN) -q -B -s jvm/settings.xml -f jvm/spark/pom.xml dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(JARS)/spark
	$(MVN) -q -B -s jvm/settings.xml -f jvm/broker/pom.xml dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(JARS)/broker
	@touch $(JARS_STAMP)

# MariaDB (a MySQL-protocol server, Debian's package) for the `snapshot --from tidb` JDBC tests, which start
# their own server. Installed when missing and this is a root shell on Debian; elsewhere those tests skip
# (under CI=true they fail instead).
mariadb:
	@command -v mariadbd >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing mariadb-server (Debian package) for the JDBC snapshot tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server >/dev/null; \
	  else echo "note: mariadb-server is not installed; the JDBC snapshot tests will skip"; fi; }

install: $(STAMP) $(JARS_STAMP)

## the main job on the embedded default: local broker + simulated TiCDC stream + job --once + oracle check
demo: $(STAMP) $(JARS_STAMP)
	$(BIN)/python -m ticdc_delta demo

## the whole test suite (unit + integration with a real broker, Spark and Delta tables)
test: $(STAMP) $(JARS_STAMP) mariadb
	$(BIN)/python -m pytest -q

## every integration test on the spark engine (the job's default engine; `make test` runs the slow
## engine-agnostic ones on delta-rs and the spark engine's own tests) — ~38 min on 2 cores
test-spark: $(STAMP) $(JARS_STAMP) mariadb
	TICDC_DELTA_TEST_ENGINE=spark $(BIN)/python -m pytest -q tests/integration

## unit tests only (no broker, no Spark)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration"

## figures: decode throughput per protocol, end-to-end Kafka → Delta rates of both engines (and the spark
## engine under local[1] vs local[2]), per-batch fixed cost and resolved-ts → visible latency, and many
## tables per batch (MERGE threads × Spark scheduler mode)
bench: $(STAMP) $(JARS_STAMP)
	$(BIN)/python -m ticdc_delta.bench all

bench-decode: $(STAMP)
	$(BIN)/python -m ticdc_delta.bench decode

bench-e2e: $(STAMP) $(JARS_STAMP)
	$(BIN)/python -m ticdc_delta.bench e2e

bench-cores: $(STAMP) $(JARS_STAMP)
	$(BIN)/python -m ticdc_delta.bench cores

bench-latency: $(STAMP) $(JARS_STAMP)
	$(BIN)/python -m ticdc_delta.bench latency

bench-tables: $(STAMP) $(JARS_STAMP)
	$(BIN)/python -m ticdc_delta.bench tables

## the driver's memory (JVM live heap and sessions, Python RSS) over ~100 small micro-batches, per engine
bench-heap: $(STAMP) $(JARS_STAMP)
	$(BIN)/python -m ticdc_delta.bench heap

## MERGEs into a 10M-row table with and without the key range (sink.merge_key_range_rows)
bench-bigtable: $(STAMP) $(JARS_STAMP)
	$(BIN)/python -m ticdc_delta.bench bigtable

## long crash/restart soak (SIGKILL at random moments until done)
soak: $(STAMP) $(JARS_STAMP)
	TICDC_DELTA_SOAK=1 $(BIN)/python -m pytest -q tests/integration/test_crash_restart.py \
		tests/integration/test_spark_engine.py tests/integration/test_spark_engine_guarantees.py \
		tests/integration/test_spark_engine_ddl.py

clean:
	rm -rf $(VENV) $(JARS) .pytest_cache .hypothesis demo-out
