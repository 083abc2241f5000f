# `make lint test` runs what CI runs after its installs; `make bench` the benchmarks.
PY ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)

.PHONY: lint test bench

lint:
	$(PY) -m ruff check .
	$(PY) -m mypy queen workers

test:
	$(PY) -m pytest -q -n 3

bench:
	$(PY) -m bench
