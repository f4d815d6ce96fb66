# pileworks: `make demo` sets up and runs the main job; `make test` runs what CI runs.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pileworks-installed
TORCH_SPEC ?= torch==2.13.0
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export DS_ACCELERATOR ?= cpu

.PHONY: lowest-venv azurite setup ray demo build test test-fast test-slow test-lowest test-extras lint sanitize format clean-store

$(STAMP): pyproject.toml $(wildcard pipeline/*.c pipeline/*/*.c pipeline/*.h)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: the CPU wheel here, so nothing pulls a multi-GB CUDA build
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e '.[dev,dask,monitoring,hf]'
	touch $(STAMP)

setup: $(STAMP)

# Azure's storage emulator for the az:// tests (tests/fixtures/emulators.py), from npm into .cache/azurite; the
# tests start it on 127.0.0.1 with --disableTelemetry
AZURITE_VERSION ?= 3.37.0
azurite:  ## Azurite (npm) for the az:// store tests
	test -x .cache/azurite/node_modules/.bin/azurite-blob || npm install --silent --no-audit --no-fund \
		--prefix .cache/azurite azurite@$(AZURITE_VERSION)

# The ray extra's requirements as pyproject.toml lists them, into the venv where pileworks is already installed
# (not `pip install -e '.[ray]'`, which would build the kernels in place again).
ray: setup  ## the optional Ray runner (prefect-ray, ~240 MB): its test runs in make test once installed
	$(BIN)/pip install -q $$($(BIN)/python -c 'import tomllib; \
		print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["ray"])')

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

# The lowest-versions job: a venv of its own with every direct dependency (and the test extra) at the floor
# pyproject.toml allows (.ci/floors.py writes the pins), then the tests marked `lowest`, which start every flow and
# every command. torch too: 2.4.0, a CUDA build from PyPI (about 6 GB with its NVIDIA libraries, 1-2 minutes from
# the package mirror), which runs on the CPU. The venv is made anew whenever pyproject.toml or .ci/floors.py changes.
LOWEST_VENV ?= .venv-lowest
LOWEST_BIN := $(LOWEST_VENV)/bin
LOWEST_STAMP := $(LOWEST_VENV)/.pileworks-installed

$(LOWEST_STAMP): pyproject.toml .ci/floors.py $(wildcard pipeline/*.c pipeline/*/*.c pipeline/*.h)
	rm -rf $(LOWEST_VENV)
	$(PY) -m venv $(LOWEST_VENV)
	$(LOWEST_BIN)/pip install -q --upgrade pip
	$(PY) .ci/floors.py --extra test --extra trafilatura --extra justext --extra gcs --extra azure --extra hf > $(LOWEST_VENV)/floors.txt
	# with `pileworks export`'s safetensors (the hf extra's floor); not transformers, which needs a newer
	# tokenizers than the core floor and is tested in make test
	$(LOWEST_BIN)/pip install -q -c $(LOWEST_VENV)/floors.txt -e '.[test]' safetensors
	touch $(LOWEST_STAMP)

lowest-venv: $(LOWEST_STAMP)  ## only the lowest-versions venv (CI installs it while make test runs)

test-lowest: $(LOWEST_STAMP)  ## the `lowest` tests at the floor of every direct dependency (CI runs it)
	@$(LOWEST_BIN)/python -c "import importlib.metadata as m; print('lowest versions:', *(n + ' ' + m.version(n) \
		for n in ('prefect', 'prefect-dask', 'pydantic', 'fastapi', 'numpy', 'pyarrow', 'torch', 'deepspeed', 'dask')))"
	$(LOWEST_BIN)/python -m pytest -q -m lowest

# Each HTML extractor extra installed as a user installs it, `pip install '<a copy of this tree>[justext]'` then
# `[trafilatura]`, into a fresh venv (torch's CPU wheel first), then made to extract a page (.ci/extras.py): the
# extras must install a working set beside pileworks' own dependencies, not only in our .venv. One venv for both,
# in turn: a full install takes about 3 minutes, two fresh ones 6, and trafilatura's requirements hold jusText's,
# so the second install on top of the first resolves what a fresh one would.
test-extras:  ## the extractor extras, installed with pileworks in a fresh venv, extract text (CI runs it)
	$(PY) .ci/extras.py --torch "$(TORCH_SPEC)" justext trafilatura

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy pipeline training flows

# The compiled kernels under AddressSanitizer and UBSan: built into a copy of the tree (the .so files here stay
# as they are), then their tests run there with the ASan runtime preloaded into Python (which is not built
# with it); PYTHONMALLOC=malloc gives every Python object (a str's UTF-8 bytes too) its own block and redzones.
# Python's own allocations leak by design, so leak checks are off; any other report fails the run. Each kernel
# must import from the copy: an optional one that failed to build would fall back to the plain .so here.
SAN_DIR ?= build/sanitize
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all -g
SAN_TESTS := tests/pipeline/test_native.py tests/pipeline/clean/test_langid.py tests/pipeline/clean/test_wordscan.py \
	tests/pipeline/clean/test_quality.py tests/pipeline/clean/test_stopwords.py \
	tests/pipeline/clean/test_boilerplate.py tests/pipeline/clean/test_normalize_once.py \
	tests/pipeline/tokenize/test_bpe_train.py
SAN_ENV := CI=true PYTHONPATH=. PYTHONMALLOC=malloc LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" \
	ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

sanitize: setup  ## the compiled kernels' tests with the kernels built under ASan + UBSan (CI runs it)
	rm -rf $(SAN_DIR) && mkdir -p $(SAN_DIR)
	tar -c --exclude='*.so' --exclude=__pycache__ pyproject.toml README.md LICENSE pipeline training flows tests \
		| tar -x -C $(SAN_DIR)
	cd $(SAN_DIR) && CFLAGS="$(SAN_FLAGS)" $(abspath $(BIN))/python -c "from setuptools import setup; setup()" \
		-q build_ext --inplace
	cd $(SAN_DIR) && $(SAN_ENV) $(abspath $(BIN))/python -c "import pipeline.clean._langid_walk as a, \
		pipeline.clean._lines as b, pipeline.clean._wordscan as c, pipeline.tokenize._bpe as d; \
		files = [m.__file__ for m in (a, b, c, d)]; \
		assert all(f.startswith('$(abspath $(SAN_DIR))/') for f in files), files"
	cd $(SAN_DIR) && $(SAN_ENV) $(abspath $(BIN))/python -m pytest -q -p no:cacheprovider --capture=sys $(SAN_TESTS)

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean-store:
	rm -rf pileworks-store runs
