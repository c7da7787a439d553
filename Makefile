# torch-fl: `make help` lists the targets.
#
# Two commands matter on a fresh clone:
#   make demo   the main job: build the simulated accelerator and show it working
#   make test   everything CI runs
# Both build what they need themselves and are safe to re-run.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
# Crate downloads retry too (cargo's default is 3).
export CARGO_NET_RETRY ?= 10
PYTHON3 ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A pair known to work together; the C++ shim is built against this torch.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
PY_TOOLS := maturin==1.16.0 pytest==9.2.0 pytest-timeout==2.4.0 ruff==0.17.6 mypy==2.4.1 clang-format==23.1.5 numpy==2.4.6 libcst==1.9.0
# Named after the pins, so changing a pin updates an existing venv.
DEPS_STAMP := $(VENV)/.deps-$(shell echo '$(TORCH_PINS) $(PY_TOOLS)' | md5sum | cut -c1-12)
# Everything the installed package is built from: reinstall when it changes.
# Tracked and new files that exist: a file moved but not yet committed must not stop the build.
PACKAGE_SOURCES := pyproject.toml Cargo.toml Cargo.lock \
	$(wildcard $(shell git ls-files --cached --others --exclude-standard crates cpp_shim python 2>/dev/null))
RELEASE_DIR := target/release
SIM_PLUGIN := $(RELEASE_DIR)/libtorchfl_sim.so
OPENCL_PLUGIN := $(RELEASE_DIR)/libtorchfl_opencl.so
ABI_TOOL := $(RELEASE_DIR)/torchfl-abi
C_EXAMPLE := target/examples/libtorchfl_minimal_c.so
# Built into the package by crates/torchfl-python/build.rs.
BUNDLED_SIM := python/torch_fl/_lib/libtorchfl_sim.so
INCLUDE_DIR := crates/torchfl-ffi/include
CPP_SOURCES = $(wildcard $(shell git ls-files --cached --others --exclude-standard 'cpp_shim/*.cpp' 'cpp_shim/*.h'))

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the Rust workspace in release mode (plugin, tool, core)
	$(CARGO) build --release -p torchfl-sim -p torchfl-abi -p torchfl-opencl

$(C_EXAMPLE): examples/c_plugin/csrc/minimal_c_plugin.c $(INCLUDE_DIR)/torch_fl/plugin.h $(INCLUDE_DIR)/torch_fl/plugin_helpers.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O2 -fPIC -shared -Wall -Wextra -Werror -pedantic -I $(INCLUDE_DIR) $< -o $@ -lpthread

.PHONY: c-example
c-example: $(C_EXAMPLE) ## Build the plain-C example plugin

.PHONY: venv
venv: $(DEPS_STAMP) ## Create .venv with the pinned torch and the build/test tools

# torch's wheel is ~0.5-3 GB: a dropped connection must cost a resume, not the CI run.
# pip resumes a partial download itself (--resume-retries); the outer loop restarts
# pip when even that gives up, keeping what its cache already holds.
PIP_NET := --retries 10 --timeout 60 --resume-retries 40
# $(call PIP_RETRY,<python>,<pip install arguments>): three attempts, 30 s apart.
PIP_RETRY = for attempt in 1 2 3; do $(1) -m pip install --quiet $(2) && break; \
	[ $$attempt -lt 3 ] || exit 1; echo "pip install failed (attempt $$attempt), retrying"; sleep 30; done
$(DEPS_STAMP):
	$(PYTHON3) -m venv $(VENV)
	$(call PIP_RETRY,$(PY),--retries 10 --upgrade pip)
	$(call PIP_RETRY,$(PY),$(PIP_NET) $(TORCH_PINS) $(PY_TOOLS))
	@touch $@

.PHONY: install
install: $(VENV)/.torchfl-installed ## Build and install torch-fl into .venv (against its torch)

# The wheel bundles the release-mode simulator `make build` produces (the
# slowest crate to compile, built once; see crates/torchfl-python/build.rs).
$(VENV)/.torchfl-installed: $(DEPS_STAMP) $(PACKAGE_SOURCES)
	$(CARGO) build --release -p torchfl-sim -p torchfl-abi -p torchfl-opencl
	TORCHFL_BUNDLE_SIM=$(abspath $(SIM_PLUGIN)) PATH="$(abspath $(VENV))/bin:$$PATH" \
		$(PY) -m pip install --quiet --no-build-isolation --no-deps --force-reinstall .
	@touch $@

.PHONY: demo
demo: install c-example ## The main job: PyTorch on the simulated accelerator, then the ABI checks
	$(PY) -m torch_fl.demo
	@echo
	@echo "== torchfl-abi: the simulated accelerator, default and strict mode =="
	$(VENV)/bin/torchfl-abi verify $(BUNDLED_SIM)
	$(VENV)/bin/torchfl-abi verify --options "strict=1" $(BUNDLED_SIM)
	@echo
	@echo "== torchfl-abi: a plugin written in plain C (examples/c_plugin) =="
	$(VENV)/bin/torchfl-abi verify $(C_EXAMPLE)

.PHONY: test
test: ## Everything CI runs: Rust tests, the C example, pytest, lints
	@# The venv's downloads (torch is ~3 GB) overlap the Rust tests' compiling.
	@# (The release build joining them was tried: all three are CPU-bound on
	@# two cores, and the three together took longer than two then one.)
	$(MAKE) --no-print-directory -j2 --output-sync=target test-rust venv
	$(MAKE) --no-print-directory test-abi test-python lint

# Other torch releases of the supported range (python/torch_fl/_versions.py): the
# suite in a venv of their own, with torch-fl installed from the wheel built
# here (its bundled shim is for the pinned torch), so the shim for TORCH is
# compiled at first import exactly as a user's install does it. CI tests the
# pinned torch only; record results in the README's compatibility table.
TORCH ?=
TORCH_VENV := .venv-torch-$(TORCH)
# torchvision releases pair with one torch release each; none pairs with
# 2.15.0 yet, so the vision tests skip there (with their reason).
TORCHVISION_2.13.0 := torchvision==0.28.0
TORCHVISION_2.14.1 := torchvision==0.29.1
TEST_TOOLS := pytest==9.2.0 pytest-timeout==2.4.0 numpy==2.4.6 libcst==1.9.0

.PHONY: wheel
wheel: $(DEPS_STAMP) ## Build the torch-fl wheel into dist/ (bundles the simulator and the shim for the pinned torch)
	$(CARGO) build --release -p torchfl-sim -p torchfl-abi
	rm -f dist/torch_fl-*.whl
	TORCHFL_BUNDLE_SIM=$(abspath $(SIM_PLUGIN)) PATH="$(abspath $(VENV))/bin:$$PATH" \
		$(PY) -m pip wheel --quiet --no-build-isolation --no-deps -w dist .

.PHONY: test-torch
test-torch: wheel c-example ## pytest under another supported torch in its own venv: make test-torch TORCH=<version>
	@[ -n "$(TORCH)" ] || { echo "usage: make test-torch TORCH=<version>, a release of torch $$($(PYTHON3) python/torch_fl/_versions.py)"; exit 2; }
	@$(PYTHON3) python/torch_fl/_versions.py $(TORCH)
	[ -x $(TORCH_VENV)/bin/python ] || $(PYTHON3) -m venv $(TORCH_VENV)
	$(call PIP_RETRY,$(TORCH_VENV)/bin/python,$(PIP_NET) torch==$(TORCH) $(TORCHVISION_$(TORCH)) $(TEST_TOOLS))
	$(TORCH_VENV)/bin/python -m pip install --quiet --no-deps --force-reinstall dist/torch_fl-*.whl
	@# The first import builds the shim for this torch (with a progress message).
	TORCH_FL_CACHE_DIR=$(abspath $(TORCH_VENV))/cache $(TORCH_VENV)/bin/python -m torch_fl info
	TORCH_FL_CACHE_DIR=$(abspath $(TORCH_VENV))/cache $(TORCH_VENV)/bin/python -m pytest -q tests

# What test-fast leaves to `make test`: the suites that start many processes
# (distributed, multi-host, fork, exit, new projects), run whole models or
# PyTorch's OpInfo samples (compat, vision, language models), or run the
# README and the bench driver end to end.
FAST_SKIP := test_multihost test_distributed test_collectives_native test_fork test_exit test_new_project \
	test_compat test_vision_models test_language_models test_docs test_bench_all test_bench_cli \
	test_opencl_models test_opencl_package

.PHONY: test-fast
test-fast: install ## A few minutes for every change: the torch-free crates' unit tests, most of pytest (not the slow suites), ruff
	$(CARGO) test --workspace --exclude torchfl-python --lib
	$(PY) -m pytest -q -x $(addprefix --ignore=tests/,$(addsuffix .py,$(FAST_SKIP))) tests
	$(VENV)/bin/ruff check python tests benches examples tools

# PoCL runs OpenCL on the CPU, so the OpenCL plugin's tests (crates/torchfl-opencl,
# tests/test_opencl*.py) run on any machine. Installed from Debian's packages
# when no OpenCL driver is present and this runs as root (as CI does);
# elsewhere those tests skip, saying what to install.
OPENCL_PACKAGES := ocl-icd-libopencl1 pocl-opencl-icd
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o Acquire::Retries=5 --no-install-recommends

.PHONY: opencl-driver
opencl-driver: ## Install PoCL (OpenCL on the CPU) when no OpenCL driver is present (root only)
	@if ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1 && /sbin/ldconfig -p | grep -q 'libOpenCL\.so\.1'; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing PoCL ($(OPENCL_PACKAGES)) for the OpenCL plugin's tests"; \
		$(APT_INSTALL) $(OPENCL_PACKAGES) >/dev/null || \
			{ apt-get update -q >/dev/null && $(APT_INSTALL) $(OPENCL_PACKAGES) >/dev/null; }; \
	else \
		echo "no OpenCL driver, and not root: the OpenCL tests skip (apt install $(OPENCL_PACKAGES))"; \
	fi

.PHONY: test-rust
test-rust: opencl-driver ## Rust unit, integration and doc tests of the torch-free crates
	$(CARGO) test --workspace --exclude torchfl-python

# pytest in five passes that run at once, each printing its output when it
# ends: the suite in the simulator's default mode (the device-runtime tests,
# the other tests that start processes, and the rest), and the device-runtime
# tests again in strict and in sync mode. Much of a pass's time is one Python
# thread waiting for the processes it started or for the simulator's queue,
# so on CI's two cores the passes together take about half of what they take
# one after another.
PYTEST_PASSES := pytest-runtime pytest-processes pytest-other pytest-strict pytest-sync
# The strict and sync passes leave out the runtime tests marked
# mode_independent: those drive a fixture plugin (which never reads the
# simulator's settings) or check a refusal at registration or a report's
# format, so a second and third run would repeat the first.
MODE_SENSITIVE := runtime and not mode_independent
# The files whose tests that are not device-runtime tests mostly start
# processes (torchrun, namespaces, crashing plugins, the benchmark driver,
# the OpenCL plugin's kernels, models and package in fresh interpreters):
# their own pass, so that no pass is much longer than the others (the last
# pass to finish runs alone on one of the two cores).
PROCESS_TESTS := $(addprefix tests/,$(addsuffix .py,test_multihost test_distributed test_exit test_load_safety test_fork \
	test_bench_all test_opencl_kernels test_opencl_models test_opencl_package))

.PHONY: test-python
test-python: install opencl-driver ## pytest; the device-runtime tests again with the simulator in strict and sync mode
	$(MAKE) --no-print-directory -j$(words $(PYTEST_PASSES)) --output-sync=target $(PYTEST_PASSES)

.PHONY: $(PYTEST_PASSES)
pytest-runtime: install ## pytest: the device-runtime tests (simulator in its default mode)
	$(PY) -m pytest -q -m runtime tests
pytest-processes: install ## pytest: the other tests of the suites that start processes
	$(PY) -m pytest -q -m "not runtime" $(PROCESS_TESTS)
pytest-other: install ## pytest: every other test that is not a device-runtime test
	$(PY) -m pytest -q -m "not runtime" $(addprefix --ignore=,$(PROCESS_TESTS)) tests
pytest-strict: install ## pytest: the device-runtime tests with the simulator in strict mode
	TORCH_FL_SIM_STRICT=1 $(PY) -m pytest -q -m "$(MODE_SENSITIVE)" tests
pytest-sync: install ## pytest: the device-runtime tests with the simulator in sync mode
	TORCH_FL_SIM_MODE=sync $(PY) -m pytest -q -m "$(MODE_SENSITIVE)" tests

.PHONY: test-abi
test-abi: build c-example opencl-driver ## torchfl-abi verify on the C example (built with the system compiler), the sim and the OpenCL plugin
	$(ABI_TOOL) verify $(C_EXAMPLE)
	$(ABI_TOOL) verify $(SIM_PLUGIN)
	@if ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1; then $(ABI_TOOL) verify $(OPENCL_PLUGIN); \
	else echo "torchfl-abi verify $(OPENCL_PLUGIN): skipped, no OpenCL driver (apt install $(OPENCL_PACKAGES))"; fi

.PHONY: lint
lint: install ## rustfmt, clippy (missing docs included), ruff, mypy, the _native stub check, clang-format, import cycles; warnings as errors
	$(CARGO) fmt --all --check
	PYO3_PYTHON=$(abspath $(PY)) $(CARGO) clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check python tests benches examples tools
	$(VENV)/bin/ruff format --check python tests benches examples tools
	$(VENV)/bin/mypy
	@# The stubs in the source tree against the modules the install built (the Rust core, the C++ shim).
	MYPYPATH=python $(PY) -m mypy.stubtest torch_fl._native torch_fl._C --mypy-config-file pyproject.toml
	$(VENV)/bin/clang-format --dry-run -Werror $(CPP_SOURCES)
	@# No import cycle between Python modules or between a crate's Rust modules (beyond the listed ones).
	$(PY) tools/import_cycles.py

FUZZ_CASES ?= 200000

.PHONY: fuzz
fuzz: ## Longer fuzzing of plugin validation and call frames (FUZZ_CASES=200000 per property; CI runs a bounded few)
	TORCHFL_FUZZ_CASES=$(FUZZ_CASES) cargo test --release -p torchfl-core --test fuzz_tables --test fuzz_frames

.PHONY: bench
bench: bench-rust bench-python ## All benchmarks (figures in benches/README.md)

.PHONY: bench-rust
bench-rust: ## Criterion benches of the dispatch path and the simulated plugin
	$(CARGO) bench -p torchfl-benches -p torchfl-sim

.PHONY: bench-python
bench-python: install ## Python benches: torch.add ratio, registration time, ResNet-18 step ratio, GPT tokens/s, all_reduce and DDP
	$(PY) benches/python/bench_dispatch.py
	$(PY) benches/python/bench_training.py
	$(PY) benches/python/bench_attention.py --threads 1
	$(PY) benches/python/bench_distributed.py

.PHONY: bench-all
bench-all: install ## Every Python bench in subprocesses; the last line is one JSON summary (BENCH_ALL_ARGS=--quick for CI size)
	$(PY) benches/python/bench_all.py --json $(BENCH_ALL_ARGS)

.PHONY: fmt
fmt: $(DEPS_STAMP) ## Format the Rust, Python and C++ code
	$(CARGO) fmt --all
	$(VENV)/bin/ruff format python tests benches examples tools
	$(VENV)/bin/clang-format -i $(CPP_SOURCES)

.PHONY: clean
clean: ## Remove build outputs
	$(CARGO) clean
