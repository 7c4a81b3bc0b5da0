# ticdc-delta — every target sets up .venv and .jars on first use (prerequisites: Python 3.11+, Java 17, Maven).
PYTHON ?= python3
MVN    ?= mvn
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
JARS   := .jars
JARS_STAMP := $(JARS)/.fetched-stamp

.PHONY: install demo test test-fast bench bench-decode bench-e2e soak lint clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
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

install: $(STAMP) $(JARS_STAMP)

## the main job on the embedded default: local broker + simulated TiCDC stream + job --once + oracle check
demo: $(STAMP) $(JARS_STAMP)
	$(BIN)/python -m ticdc_delta demo

## the whole test suite (unit + integration with a real broker, Spark and Delta tables)
test: $(STAMP) $(JARS_STAMP)
	$(BIN)/python -m pytest -q

## unit tests only (no broker, no Spark)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration"

## figures: decode throughput per protocol and end-to-end Kafka → Delta rates
bench: $(STAMP) $(JARS_STAMP)
	$(BIN)/python -m ticdc_delta.bench all

bench-decode: $(STAMP)
	$(BIN)/python -m ticdc_delta.bench decode

bench-e2e: $(STAMP) $(JARS_STAMP)
	$(BIN)/python -m ticdc_delta.bench e2e

## long crash/restart soak (SIGKILL at random moments until done)
soak: $(STAMP) $(JARS_STAMP)
	TICDC_DELTA_SOAK=1 $(BIN)/python -m pytest -q tests/integration/test_crash_restart.py

clean:
	rm -rf $(VENV) $(JARS) .pytest_cache .hypothesis demo-out
