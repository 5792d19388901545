# The kit's commands. `make demo` and `make test` each work alone on a bare machine:
# they run `setup` (virtual environment + torch + the kit) and `data` (synthetic RTE) first.
#
#   make setup    create .venv (unless a venv/conda env is active) and install torch, then the kit
#                 (in an active env, e.g. Colab or JupyterHub, a torch already there within the supported range is kept)
#   make data     generate the synthetic GLUE RTE into data/glue_data/RTE (offline, deterministic)
#   make demo     Task 1 on MiniLM, then Tasks 2a/2b/3 on 4 local ranks: agreement and time/iteration
#   make test     the test suite
#   make lab      JupyterLab on the notebooks (make notebooks regenerates them from their builder)
#   make report   every task's metrics.json (runs/full) into report/: tables and PNG plots
#   make release  the student release into $(RELEASE_DIR)
#   make grade    grade this checkout (full marks on the solution source); GRADE_FLAGS="--tasks 2a,2b --timeout 30"
#   make gradescope   dist/autograder.zip for Gradescope
#   make cluster-up / cluster-down   an emulated 4-node cluster in network namespaces (Linux, root)
#   make mutation TARGET=timing   mutation testing of one module (cosmic-ray; CPU-heavy, not in CI; no TARGET: all, one by one)
#   make compat   every task, the grader and a test slice on each supported torch/transformers pair (nox, a fresh
#                 venv each, GBs of torch wheels; COMPAT_SESSIONS="compat(colab-floor)" for one): benchmarks/compat/README.md
#
# With internet, a smaller CPU-only torch wheel:  make setup TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu"

SHELL       := /bin/bash
comma       := ,
PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
# the torch range pyproject.toml declares (what `make compat` tests); an active env's torch inside it is kept
TORCH_MIN   := 2.8
TORCH_BELOW := 2.16
COMPAT_SESSIONS ?=
EXTRAS      ?= dev,notebooks
RELEASE_DIR ?= release
RELEASE_FLAGS ?= --force
DATA_DIR    ?= data/glue_data/RTE
PYTEST_ARGS ?=
GRADE_FLAGS ?=
# test workers (pytest-xdist): 2 keeps two cores busy; each test starts its own ranks as well
TEST_JOBS   ?= 2

ACTIVE_ENV := $(or $(VIRTUAL_ENV),$(CONDA_PREFIX))
ifeq ($(ACTIVE_ENV),)
  PY    := $(VENV)/bin/python
  STAMP := $(VENV)/.kit-installed
else
  PY    := python
  STAMP := $(ACTIVE_ENV)/.kit-installed
endif

.PHONY: setup data sandbox-tools browser-tools demo test lab notebooks report release grade gradescope cluster-up cluster-down mutation compat clean help
help:
	@sed -n '1,/^$$/p' Makefile | sed 's/^# \{0,1\}//'

setup: $(STAMP)

$(STAMP): pyproject.toml
ifeq ($(ACTIVE_ENV),)
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
endif
	$(PY) -m pip install --quiet --upgrade pip
ifeq ($(ACTIVE_ENV),)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)" $(TORCH_INDEX)
else
	@if [ "$(origin TORCH_SPEC)" = file ] && $(PY) -c "import sys, torch; v = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]); sys.exit(not ($(subst .,$(comma),$(TORCH_MIN)),) <= v < ($(subst .,$(comma),$(TORCH_BELOW)),))" 2>/dev/null; then \
	  echo "keeping the installed torch $$($(PY) -c 'import torch; print(torch.__version__)') (inside torch>=$(TORCH_MIN),<$(TORCH_BELOW); a TORCH_SPEC on the command line replaces it)"; \
	else echo '$(PY) -m pip install --quiet "$(TORCH_SPEC)" $(TORCH_INDEX)'; $(PY) -m pip install --quiet "$(TORCH_SPEC)" $(TORCH_INDEX); fi
endif
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	@touch $@
	@echo "set-up done: $$($(PY) -c 'import torch, transformers; print("torch", torch.__version__, "| transformers", transformers.__version__)')"

data: $(DATA_DIR)/train.tsv

$(DATA_DIR)/train.tsv: | $(STAMP)
	$(PY) data_scripts/make_synthetic_rte.py --out $(DATA_DIR)

demo: setup data
	$(PY) -m student_src.kit.demo

# The kit's test suite. tests/test_student_walk.py installs the student release (which has its own
# Makefile, from autograder/student/) in a fresh venv and walks the student's path, notebooks 1-4
# included: 5-9 minutes on 2 busy cores (KIT_SKIP_STUDENT_WALK=1 skips it while iterating).
# The grading sandbox uses Debian's bubblewrap (and the tests emulate Docker with capsh): installed
# here when this runs as root with apt-get (CI); elsewhere the sandbox tests say why they skip.
sandbox-tools:
	@if command -v bwrap >/dev/null && command -v capsh >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get install -y -qq bubblewrap libcap2-bin >/dev/null 2>&1 || \
	   (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap libcap2-bin >/dev/null)) && echo "installed bubblewrap"; \
	else echo "note: bubblewrap is not installed; grading falls back (python -m autograder sandbox says how)"; fi

# tests/test_notebook_browser.py runs one notebook in JupyterLab in a headless Chromium (Playwright, the dev
# extra): Debian's chromium, installed here as root with apt-get (CI); elsewhere the test says why it skips.
browser-tools:
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null || [ -n "$$KIT_CHROMIUM" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get install -y -qq chromium >/dev/null 2>&1 || \
	   (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null)) && echo "installed chromium"; \
	else echo "note: chromium is not installed; tests/test_notebook_browser.py skips (make browser-tools as root installs it)"; fi

test: setup data sandbox-tools browser-tools
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile --durations=25 $(PYTEST_ARGS) tests

lab: setup data
	$(PY) -m jupyter lab notebooks

notebooks: setup
	$(PY) -m autograder.course.build_notebooks

report: setup
	$(PY) -m student_src.kit.report runs/full report

release: setup
	$(PY) -m autograder release $(RELEASE_DIR) $(RELEASE_FLAGS)

grade: setup
	$(PY) -m autograder grade . --results results.json $(GRADE_FLAGS)

gradescope: setup
	$(PY) -m autograder gradescope dist/

cluster-up: setup
	$(PY) -m student_src.kit.cluster up --nodes 4 --rate 1gbit

# Mutation testing (benchmarks/mutation/run_mutation.py --list shows the targets); survivors and
# why the ones left alive are harmless: tests/README.md
mutation: setup
	$(PY) -m pip install --quiet "cosmic-ray==8.7.0"
	$(PY) benchmarks/mutation/run_mutation.py $(or $(TARGET),--all)

# nox (noxfile.py): one fresh venv per torch/transformers combination, torch installed first with the machine's pip
# cap replaced by the session's own pins; each session writes benchmarks/compat/results/<id>.json
compat: setup data
	$(PY) -m pip install --quiet "nox>=2024.4"
	$(PY) -m nox $(if $(COMPAT_SESSIONS),-s "$(COMPAT_SESSIONS)")

cluster-down:
	$(PY) -m student_src.kit.cluster down

clean:
	rm -rf runs .pytest_cache
