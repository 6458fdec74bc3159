#!/usr/bin/env bash
# Installs every Debian package slurm-ckpt needs to build, test and run its local cluster.
# Non-interactive and idempotent; run as root on Debian 12.
set -euo pipefail

packages=(
  # build
  build-essential cmake pkg-config clang libclang-rt-14-dev ccache
  # Slurm, PMIx, munge (the real cluster the tests run on)
  slurm-wlm slurmrestd slurm-wlm-jwt-plugin libslurm-dev munge libmunge-dev libpmix-dev libpmix-bin
  # libraries
  libcurl4-openssl-dev catch2 libsqlite3-dev sqlite3 nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev
  libxxhash-dev liburing-dev pybind11-dev python3-dev libcpp-httplib-dev libssl-dev zlib1g-dev
  # training side
  python3-torch python3-numpy
  # test helpers
  procps psmisc curl
  # operations checks: promtool (the alerting rules), headless Chromium (the status page)
  prometheus chromium
  # packages and man pages: cpack's DEB (dpkg-shlibdeps) and RPM (rpmbuild) output, lintian, groff and man
  dpkg-dev rpm lintian groff man-db
)

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: must run as root" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${packages[@]}"
# Debian enables the system services on install; the test cluster runs its own private daemons instead.
for svc in slurmctld slurmd slurmrestd munge prometheus; do
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl disable --now "$svc" >/dev/null 2>&1 || true
  fi
done
echo "install-deps: done"
