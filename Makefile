# Two commands on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench docs clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py src/pipeloom/sim/_accel.c
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[torch,dev,docs,hf,arrow,megatron]"
	$(BIN)/pip install -q --no-deps $$($(BIN)/python -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["titan"]))')
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m pipeloom.demo --out demo_out

# the docs site first (quiet when it passes), so that pytest's summary stays the last line
test: $(STAMP)
	$(MAKE) --no-print-directory docs MKDOCS_FLAGS=--quiet
	$(BIN)/python -m pytest -q -n 2 --timeout=600 --durations=15

# compiled sources and pytest's rewritten test modules are cached between runs even where the environment
# turns bytecode off (PYTHONDONTWRITEBYTECODE): without it every CLI subprocess a test starts and each
# worker's collection compile everything again
test-fast: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n 2 -m "not slow and not dist"

# pictures by pipeloom itself (docs/gen/), then the site into site/; --strict: a broken link or
# anchor, a missing picture or an API page naming a module that is gone fails the build
docs: $(STAMP)
	$(BIN)/python docs/gen_pictures.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict $(MKDOCS_FLAGS)

bench: $(STAMP)
	$(BIN)/python bench/zb_vs_official.py

clean:
	rm -rf $(VENV) demo_out build site docs/gen *.egg-info src/*.egg-info
