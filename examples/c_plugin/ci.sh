#!/usr/bin/env bash
# CI for the minimal_c plugin: build it, check it against the ABI
# (torchfl-abi verify, no PyTorch needed), then against PyTorch's CPU results
# (python -m torch_fl compat). Needs a C compiler and `pip install torch-fl`.
#   CC, PYTHON, TORCHFL_ABI   override the tools
#   COMPAT_ARGS               extra arguments for compat (e.g. --no-coverage)
#   SKIP_COMPAT=1             stop after verify (no PyTorch in this job)
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
TORCHFL_ABI=${TORCHFL_ABI:-torchfl-abi}
LIB=build/libtorchfl_minimal_c.so

mkdir -p build
"${CC:-cc}" -std=c99 -O2 -fPIC -shared -Wall -Wextra -Werror -pedantic -I include \
    csrc/minimal_c_plugin.c -o "$LIB" -lpthread
"$TORCHFL_ABI" verify "$LIB"
if [ "${SKIP_COMPAT:-0}" != 1 ]; then
    # shellcheck disable=SC2086  # COMPAT_ARGS is a list of arguments
    "$PYTHON" -m torch_fl compat --device minimal_c --plugin "$LIB" ${COMPAT_ARGS:-}
fi
