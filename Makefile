# Two commands on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py src/pipeloom/schedule/search/_accel.c
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[torch,dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m pipeloom.demo --out demo_out

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --timeout=600

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m "not slow and not dist"

bench: $(STAMP)
	$(BIN)/python bench/zb_vs_official.py

clean:
	rm -rf $(VENV) demo_out build *.egg-info src/*.egg-info
