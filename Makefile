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
RELEASE_DIR := target/release
SIM_PLUGIN := $(RELEASE_DIR)/libtorchfl_sim.so
ABI_TOOL := $(RELEASE_DIR)/torchfl-abi
C_EXAMPLE := target/examples/libtorchfl_minimal_c.so
INCLUDE_DIR := crates/torchfl-ffi/include

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the Rust workspace in release mode (plugin, tool, core)
	$(CARGO) build --release -p torchfl-sim -p torchfl-abi

$(C_EXAMPLE): examples/c_plugin/minimal_plugin.c $(INCLUDE_DIR)/torch_fl/plugin.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O2 -fPIC -shared -Wall -Wextra -Werror -pedantic -I $(INCLUDE_DIR) $< -o $@ -lpthread

.PHONY: c-example
c-example: $(C_EXAMPLE) ## Build the plain-C example plugin

.PHONY: demo
demo: build c-example ## The main job: inspect and verify the simulated accelerator and the C example
	@echo "== The simulated accelerator (reference plugin) =="
	$(ABI_TOOL) inspect $(SIM_PLUGIN)
	@echo
	$(ABI_TOOL) verify $(SIM_PLUGIN)
	@echo
	@echo "== The same checks in strict mode (device memory not host-addressable) =="
	$(ABI_TOOL) verify --options "strict=1" $(SIM_PLUGIN)
	@echo
	@echo "== A plugin written in plain C (examples/c_plugin) =="
	$(ABI_TOOL) verify $(C_EXAMPLE)

.PHONY: test
test: test-rust test-c-example lint ## Everything CI runs: Rust tests, the C example, lints

.PHONY: test-rust
test-rust: ## Rust unit, integration and doc tests of every crate
	$(CARGO) test --workspace

.PHONY: test-c-example
test-c-example: build c-example ## Build the C example with the system compiler and verify it
	$(ABI_TOOL) verify $(C_EXAMPLE)

.PHONY: lint
lint: ## rustfmt and clippy with warnings as errors
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

.PHONY: bench
bench: ## Criterion benches of the dispatch path (figures in benches/README.md)
	$(CARGO) bench -p torchfl-benches

.PHONY: fmt
fmt: ## Format the Rust code
	$(CARGO) fmt --all

.PHONY: clean
clean: ## Remove build outputs
	$(CARGO) clean
