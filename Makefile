# sglab — the two set-up commands are `make workbook` and `make test`; each creates .venv when
# missing.
#
# torch: if the Python that creates the venv already has torch (a GPU box with a CUDA build), the
# venv sees it (--system-site-packages) and nothing replaces it. Otherwise the CPU build
# $(TORCH_CPU) is installed from TORCH_INDEX, PyTorch's CPU index (pip --index-url, for torch
# alone), where that index answers within a few seconds (scripts/index_reachable.py). Where it does
# not, or with `make test TORCH_INDEX=`, pip takes $(TORCH_CPU) as its own configuration finds it,
# and says so: on PyPI alone that is the CUDA build, with 15 nvidia-* wheels (several GB).
#
# Each set-up stage says what it does in one line ("set-up: venv: ...", torch, the package and its
# extras, SGLang releases, hunk wheels); pip itself runs quietly.
#
# uv, where it is on PATH (`make test UV=` never uses it): `uv venv --seed` makes the venv (with
# pip in it, for torch and the release installer) and `uv pip install` installs the package and its
# extras, with the venv's torch pinned. torch itself always comes through pip: uv reads neither
# pip's configuration (find-links, constraints) nor a venv's system site packages, so it would not
# see a local CPU build of torch or a GPU box's CUDA torch and would fetch another. For the same
# reason, a venv that sees the system's torch installs the package with pip.

PY        ?= python3
VENV      ?= .venv
BIN       := $(VENV)/bin
TORCH_CPU ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
UV        ?= $(shell command -v uv 2>/dev/null)
comma     := ,
EXTRAS    ?= exec,test
STAMP     := $(VENV)/.sglab-$(subst $(comma),-,$(EXTRAS))
# `make test` also installs the browser test's extra (JupyterLab, Playwright); the browser is the
# system's Chromium
TEST_EXTRAS ?= $(EXTRAS),browser
TEST_STAMP  := $(VENV)/.sglab-$(subst $(comma),-,$(TEST_EXTRAS))

# Real SGLang releases, side by side under .sglang/ (git-ignored); must equal
# sglab.sglang.releases.PINNED
SGLANG_RELEASES := 0.5.10.post1 0.5.11 0.5.12.post1 0.5.13 0.5.14 0.5.23
SGLANG_HOME     ?= .sglang
SGLANG_STAMPS   := $(foreach v,$(SGLANG_RELEASES),$(SGLANG_HOME)/releases/$(v)/.sglab-installed)

.PHONY: workbook test test-gpu lab wheelhouse offline-gpu verify sync env clean sglang-releases
.PHONY: wheelhouse-engine engine-gpu format lint

NEW_VENV = $(if $(UV),$(UV) venv -q --seed --allow-existing --python $(PY),$(PY) -m venv)
$(BIN)/python:
	@echo "set-up: venv: $(VENV) from $(PY) ($(if $(UV),uv venv --seed,python -m venv))"
	@if $(PY) -c "import torch" 2>/dev/null; then \
	  echo "set-up: venv: it sees the torch of $(PY)" \
	    "($$($(PY) -c 'import torch;print(torch.__version__)'))"; \
	  $(NEW_VENV) --system-site-packages $(VENV); \
	else \
	  $(NEW_VENV) $(VENV); \
	fi
	$(if $(UV),,$(BIN)/python -m pip install -q --upgrade pip)

# the package and its extras, with the venv's torch pinned as it is ($(TORCH_PIN)): no extra can
# make pip replace it (where one needs another torch, pip refuses in one line instead)
TORCH_PIN := $(VENV)/torch-pin.txt
TORCH_FROM_INDEX = \
	elif why=$$($(BIN)/python scripts/index_reachable.py "$(TORCH_INDEX)"); then \
	  echo "set-up: torch: $(TORCH_CPU), the CPU build, from $(TORCH_INDEX)"; \
	  $(BIN)/python -m pip install -q --index-url "$(TORCH_INDEX)" "$(TORCH_CPU)";
TORCH_ELSEWHERE = $(if $(TORCH_INDEX),$(TORCH_INDEX) does not answer here ($$why),TORCH_INDEX is \
	empty): $(TORCH_CPU) as pip is configured (on PyPI alone: the CUDA build, several GB)
PACKAGE_STAGE = echo "set-up: sglab[$(subst -,$(comma),$*)]: the package and its extras ($(1))," \
	"with $$(cat $(TORCH_PIN)) kept"
PIP_PACKAGE = $(BIN)/python -m pip install -q -c $(TORCH_PIN) -e ".[$(subst -,$(comma),$*)]"
UV_PACKAGE = \
	if grep -q "^include-system-site-packages = true" $(VENV)/pyvenv.cfg; then \
	  $(call PACKAGE_STAGE,pip: uv does not see the system's torch); \
	  $(PIP_PACKAGE); \
	else \
	  $(call PACKAGE_STAGE,uv pip); \
	  $(UV) pip install -q --python $(BIN)/python -c $(TORCH_PIN) -e ".[$(subst -,$(comma),$*)]"; \
	fi
$(VENV)/.sglab-%: $(BIN)/python pyproject.toml
	@if v=$$($(BIN)/python -c "import torch; print(torch.__version__)" 2>/dev/null); then \
	  echo "set-up: torch: $$v, already in the venv"; \
	$(if $(TORCH_INDEX),$(TORCH_FROM_INDEX)) \
	else \
	  echo "set-up: torch: $(TORCH_ELSEWHERE)"; \
	  $(BIN)/python -m pip install -q "$(TORCH_CPU)"; \
	fi
	@$(BIN)/python -c "import importlib.metadata as m; print('torch==' + m.version('torch'))" \
	  > $(TORCH_PIN)
	$(if $(UV),@$(UV_PACKAGE),@$(call PACKAGE_STAGE,pip))
	$(if $(UV),,$(PIP_PACKAGE))
	@touch $@

# Installs only what is missing (one stamp per release). A release that cannot be installed is
# reported in one line and left out: the workbook and the tests report it as "not run" (and the
# tests fail in CI).
$(SGLANG_STAMPS) &: $(STAMP) lib/sglab/sglang/releases.py constraints/cpu.txt
	@echo "set-up: SGLang releases: those of $(SGLANG_RELEASES) missing from $(SGLANG_HOME)/"
	@$(BIN)/python -m sglab.sglang.install --releases $(SGLANG_RELEASES) || \
	  echo "warning: some SGLang releases are not installed (see above)" >&2
	@for s in $(SGLANG_STAMPS); do if [ -f $$s ]; then touch $$s; fi; done

sglang-releases: $(SGLANG_STAMPS)

# the released wheels of every committed PR hunk's window (.sglang/wheels/, about 8 MB each): the
# hunk test rebuilds each hunk from them. Without the package index, one line and the test skips
# (fails in CI).
HUNK_WHEELS := $(SGLANG_HOME)/wheels/.sglab-hunk-windows
$(HUNK_WHEELS): $(STAMP) $(wildcard data/upstream/*/pr*.json)
	@echo "set-up: hunk wheels: the released wheels of each committed hunk's window" \
	  "($(SGLANG_HOME)/wheels/)"
	@$(BIN)/python -m tests.sglang_answers && touch $@ || \
	  echo "warning: the hunk windows' wheels are not all cached (see above)" >&2

workbook: $(STAMP) $(SGLANG_STAMPS)
	$(BIN)/sglab run

# in parallel (pytest-xdist, see pyproject.toml); the browser test skips without Chromium, except in
# CI, where the slowest phases are listed too (a stall names its test and phase)
test: $(TEST_STAMP) $(SGLANG_STAMPS) $(HUNK_WHEELS)
	$(BIN)/python -m pytest -q $(if $(CI),--durations=12)

# one layout for every Python file ([tool.yapf] in pyproject.toml): string literals split across
# lines are rejoined where that saves a line, then yapf lays the code out; `lint` only checks (the
# tests check it too)
LAYOUT := lib tests scripts notebooks jupyter_server_config.py
format: $(TEST_STAMP)
	$(BIN)/python scripts/join_strings.py $(LAYOUT)
	$(BIN)/python -m yapf -i -r -p $(LAYOUT)
	$(BIN)/sglab sync

lint: $(TEST_STAMP)
	$(BIN)/python scripts/join_strings.py --check $(LAYOUT)
	$(BIN)/python -m yapf --diff -r -p $(LAYOUT)

# every claim on the committed runs; where GPUs are present, also run what they can run and compare
# it with the recorded reference of the same GPU model
verify: $(STAMP)
	@if $(BIN)/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
	  $(BIN)/sglab verify --all --live --against; else $(BIN)/sglab verify --all; fi

# the GPU tests only (skipped where there is no CUDA)
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu

# JupyterLab on the notebooks: bound to 127.0.0.1, token authentication on, each notebook listed
# once, and a session leaves git status clean (jupyter_server_config.py, sglab.tools.lab). Extra
# flags through LAB_ARGS, e.g.
#   make lab LAB_ARGS="--port=8890 --no-browser"
# As root (containers), --allow-root is added.
LAB_ARGS ?=
LAB_AS_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

lab:
	$(MAKE) EXTRAS=lab,test,gpu $(VENV)/.sglab-lab-test-gpu
	$(BIN)/jupyter lab --config=$(CURDIR)/jupyter_server_config.py \
	  --ip=127.0.0.1 $(LAB_AS_ROOT) $(LAB_ARGS) notebooks/

sync: $(STAMP)
	$(BIN)/sglab sync

env: $(STAMP)
	$(BIN)/sglab env

# Python 3.12 manylinux x86_64 wheels of what a torch-only CUDA image lacks, into .whl/ (for offline
# GPU boxes)
wheelhouse:
	bash scripts/wheelhouse.sh .whl

# per-release bundles of a whole real engine (sglang without .so, slim sglang-kernel, FlashInfer's
# JIT sources, pinned transformers, light dependencies) as tar.xz layers in .whl-engine/; fails when
# a release's layers exceed LIMIT_MIB (40, scripts/engine_bundle.py; docs/operating.md, real SGLang
# engines)
wheelhouse-engine:
	bash scripts/wheelhouse-engine.sh .whl-engine

# on a GPU box with .whl-engine/: real engines per scenario, e.g. `make engine-gpu ARGS="--plan 01"`
engine-gpu:
	bash scripts/engine_gpu.sh $(ARGS)

# on an offline GPU box, from the wheelhouse: GPU tests, every notebook live, a tarball of the
# results
offline-gpu:
	bash scripts/offline_gpu.sh

clean:
	rm -rf reports .pytest_cache
