#!/usr/bin/env bash
# Configures and builds slurm-ckpt into ./build (or $CKPT_BUILD_DIR). Idempotent. The install prefix is /usr
# (Debian's layout, which the packages need; CKPT_INSTALL_PREFIX changes it).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CKPT_BUILD_DIR:-$PWD/build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=${CKPT_BUILD_TYPE:-RelWithDebInfo} \
  -DCMAKE_INSTALL_PREFIX=${CKPT_INSTALL_PREFIX:-/usr} ${CKPT_CMAKE_ARGS:-} > "$build.configure.log" 2>&1 \
  || { cat "$build.configure.log" >&2; exit 1; }
cmake --build "$build" -j"$(nproc)"
