# ticdc-delta — every target sets up .venv on first use (Python 3.11+ and Java 17 are the only prerequisites).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: install demo test test-fast bench bench-decode bench-e2e soak lint clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

## the main job on the embedded default: local broker + simulated TiCDC stream + job --once + oracle check
demo: $(STAMP)
	$(BIN)/python -m ticdc_delta demo

## the whole test suite (unit + integration with a real broker, Spark and Delta tables)
test: $(STAMP)
	$(BIN)/python -m pytest -q

## unit tests only (no broker, no Spark)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration"

## figures: decode throughput per protocol and end-to-end Kafka → Delta rates
bench: $(STAMP)
	$(BIN)/python -m ticdc_delta.bench all

bench-decode: $(STAMP)
	$(BIN)/python -m ticdc_delta.bench decode

bench-e2e: $(STAMP)
	$(BIN)/python -m ticdc_delta.bench e2e

## long crash/restart soak (SIGKILL at random moments until done)
soak: $(STAMP)
	TICDC_DELTA_SOAK=1 $(BIN)/python -m pytest -q tests/integration/test_crash_restart.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis demo-out
