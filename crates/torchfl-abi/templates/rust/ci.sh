#!/usr/bin/env bash
# CI for the {{device}} plugin: build it, check it against the ABI
# (torchfl-abi verify, no PyTorch needed), then against PyTorch's CPU results
# (python -m torch_fl compat). Needs cargo and `pip install torch-fl`.
#   PYTHON, TORCHFL_ABI       override the tools
#   COMPAT_ARGS               extra arguments for compat (e.g. --no-coverage)
#   SKIP_COMPAT=1             stop after verify (no PyTorch in this job)
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
TORCHFL_ABI=${TORCHFL_ABI:-torchfl-abi}
LIB=target/release/libtorchfl_{{device}}.so

# --target-dir: $LIB must not depend on CARGO_TARGET_DIR.
cargo build --release --offline --target-dir target
"$TORCHFL_ABI" verify "$LIB"
if [ "${SKIP_COMPAT:-0}" != 1 ]; then
    # shellcheck disable=SC2086  # COMPAT_ARGS is a list of arguments
    "$PYTHON" -m torch_fl compat --device {{device}} --plugin "$LIB" ${COMPAT_ARGS:-}
fi
