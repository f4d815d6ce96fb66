# pileworks: `make demo` sets up and runs the main job; `make test` runs what CI runs.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pileworks-installed
TORCH_SPEC ?= torch==2.13.0
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export DS_ACCELERATOR ?= cpu

.PHONY: setup demo build test test-fast test-slow lint format clean-store

$(STAMP): pyproject.toml $(wildcard pipeline/*.c pipeline/*/*.c)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: the CPU wheel here, so nothing pulls a multi-GB CUDA build
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e '.[dev,dask,monitoring,hf]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup  ## prepare the bundled sample corpus and train the tiny model on 2 CPU ranks
	$(BIN)/pileworks run

build: setup  ## only build the sample corpus into ./pileworks-store
	$(BIN)/pileworks build

test: setup  ## everything CI runs (fast + slow + distributed + s3 + ui)
	$(BIN)/python -m pytest -q

test-fast: setup  ## unit tests, under a minute
	$(BIN)/python -m pytest -q -m "not slow and not distributed and not ui"

test-slow: setup
	$(BIN)/python -m pytest -q -m "slow or distributed or ui"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy pipeline training flows

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean-store:
	rm -rf pileworks-store runs
