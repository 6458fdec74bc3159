#!/usr/bin/env bash
# The Debian packages, installed: cpack makes them from the built tree ($CKPT_BUILD_DIR, nothing is rebuilt), apt
# installs them on this machine, and a private local cluster runs on installed paths only: Slurm finds the plugin
# in its PluginDir by name, ckpt-controller runs as its systemd unit's ExecStartPre/ExecStart lines say (there is
# no systemd here) with the packaged conffile, and the training imports the installed slurm_ckpt module. A node
# crashes mid-training and the job comes back from its checkpoint. Then the packages are upgraded to a re-packed
# version while the controller holds a running job (its database and history survive, the edited conffile is
# kept), a C++ program builds against libslurm-ckpt-dev (find_package and pkg-config), the controller package is
# removed (conffile and state kept) and everything is purged (conffile and state gone, the user's checkpoints
# untouched). Every package lists exactly the files it should.
#
# Its own cluster dir, ports and subnet (CKPT_PACKAGE_CLUSTER_DIR, _PORT, CKPT_PACKAGE_SUBNET), so the main cluster is
# left alone. On any exit the packages are purged and its cluster is stopped: later tests use the build tree.
set -euo pipefail
export CKPT_CLUSTER_DIR=${CKPT_PACKAGE_CLUSTER_DIR:-/tmp/slurm-ckpt-pkg-cluster}
export CKPT_CLUSTER_PORT=${CKPT_PACKAGE_CLUSTER_PORT:-16917} CKPT_CLUSTER_SUBNET=${CKPT_PACKAGE_SUBNET:-76}
export SLURM_CONF=$CKPT_CLUSTER_DIR/etc/slurm.conf
mkdir -p "$CKPT_CLUSTER_DIR/ckpt" && chmod 1777 "$CKPT_CLUSTER_DIR/ckpt"
source "$(dirname "$0")/lib.sh"
unset CKPT_SPANK_PLUGIN PYTHONPATH
PORT=$((CKPT_CLUSTER_PORT + 13))
PACKAGES=(slurm-ckpt slurm-ckpt-controller python3-slurm-ckpt libckpt0 libslurm-ckpt-dev)
MARK=/var/lib/slurm-ckpt-package-test.installed   # our packages are on this machine because of this test
MULTIARCH=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
PLUGIN_DIR=/usr/lib/$MULTIARCH/slurm-wlm
UNIT=/lib/systemd/system/ckpt-controller.service
CONF=/etc/slurm-ckpt/controller.conf
STEPS=${CKPT_PACKAGE_STEPS:-60}
T0=$(date +%s)
step() { printf '\n== [%3ss] %s\n' $(($(date +%s) - T0)) "$*"; }

# ---- what this machine must have: a clear line for each thing missing -----------------------------------------
[ "$(id -u)" -eq 0 ] || fail "must run as root (it installs packages)"
for tool in apt-get dpkg dpkg-deb dpkg-shlibdeps cpack sbatch slurmctld munged pkg-config; do
  command -v "$tool" > /dev/null || fail "needs $tool (scripts/install-deps.sh installs it)"
done
[ -f "$CKPT_BUILD_DIR/CMakeCache.txt" ] || fail "no configured build in $CKPT_BUILD_DIR"
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$CKPT_BUILD_DIR/CMakeCache.txt")
[ "$prefix" = /usr ] || fail "$CKPT_BUILD_DIR is configured with CMAKE_INSTALL_PREFIX=$prefix; packages are made from a /usr build (scripts/build.sh configures one)"
for built in spank/spank_ckpt.so cli/ckpt controller/ckpt-controller ckpt-run/ckpt-run man/ckpt.1.gz; do
  [ -e "$CKPT_BUILD_DIR/$built" ] || fail "$CKPT_BUILD_DIR/$built is not built"
done
ls "$CKPT_BUILD_DIR"/python/slurm_ckpt/_native*.so > /dev/null 2>&1 || fail "the slurm_ckpt module is not built"
/usr/bin/python3 -c 'import torch' 2> /dev/null || fail "needs python3-torch"
installed=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${PACKAGES[@]}" 2> /dev/null | awk '$2 ~ /^[ihrc]/ && $2 != "un" { print $1 }' || true)
if [ -n "$installed" ] && [ ! -f "$MARK" ]; then
  fail "slurm-ckpt packages are already installed here ($(echo $installed)); this test would replace them"
fi

# ---- cleanup on every exit: purge, stop what we started -------------------------------------------------------
purge_all() {
  local left
  left=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${PACKAGES[@]}" 2> /dev/null | awk '$2 != "un" { print $1 }' || true)
  # shellcheck disable=SC2086
  [ -z "$left" ] || DEBIAN_FRONTEND=noninteractive dpkg --purge $left > "$SCRATCH/purge-cleanup.log" 2>&1 || true
  rm -f "$MARK"
}
stop_controller() {  # as systemd would: SIGTERM, wait
  [ -n "${CONTROLLER_PID:-}" ] || return 0
  kill "$CONTROLLER_PID" 2> /dev/null || true
  for _ in $(seq 100); do kill -0 "$CONTROLLER_PID" 2> /dev/null || break; sleep 0.1; done
  kill -KILL "$CONTROLLER_PID" 2> /dev/null || true
  CONTROLLER_PID=""
}
cleanup() {
  local rc=$?
  set +e  # every step below runs, whatever failed
  stop_controller
  [ -n "${victim:-}" ] && "$CLUSTER" revive-node "$victim" > /dev/null 2>&1 || true
  for j in ${job:-} ${holder:-}; do scancel "$j" 2> /dev/null || true; done
  "$CLUSTER" down > /dev/null 2>&1 || true
  purge_all
  [ $rc -eq 0 ] || echo "(controller log: $SCRATCH/controller.log; cluster logs: $CKPT_CLUSTER_DIR/log)" >&2
}
trap cleanup EXIT
[ -z "$installed" ] || purge_all   # left by an earlier run of this test that was killed

# ---- the packages ---------------------------------------------------------------------------------------------
pack() {  # pack DIR [cpack -D args]: the .debs of the built tree, into DIR
  local out=$1
  shift
  (cd "$CKPT_BUILD_DIR" && cpack -G DEB -B "$out" "$@") > "$out.log" 2>&1 || { tail -30 "$out.log" >&2; fail "cpack failed (log: $out.log)"; }
}
step "cpack -G DEB in $CKPT_BUILD_DIR (as built), and once more as version 0.1.0+pkgtest, for the upgrade"
pack "$SCRATCH/v1"
version=$(dpkg-deb -f "$SCRATCH"/v1/slurm-ckpt_*.deb Version)
pack "$SCRATCH/v2" -D CPACK_PACKAGE_VERSION="${version%-*}+pkgtest"
for pkg in "${PACKAGES[@]}"; do
  for v in v1 v2; do
    ls "$SCRATCH/$v/${pkg}"_*.deb > /dev/null 2>&1 || fail "cpack made no $pkg package in $SCRATCH/$v: $(ls "$SCRATCH/$v")"
  done
done
version2=$(dpkg-deb -f "$SCRATCH"/v2/slurm-ckpt_*.deb Version)
echo "packages: $version, and $version2 for the upgrade"
dpkg --compare-versions "$version2" gt "$version" || fail "the re-packed version $version2 is not newer than $version"
for deb in "$SCRATCH"/v1/*.deb; do echo "  $(basename "$deb"): Depends: $(dpkg-deb -f "$deb" Depends)"; done
# dpkg-shlibdeps computed the shared-library dependencies.
dpkg-deb -f "$SCRATCH"/v1/slurm-ckpt-controller_*.deb Depends | grep -q 'libslurm38' || fail "slurm-ckpt-controller does not depend on libslurm38"
dpkg-deb -f "$SCRATCH"/v1/python3-slurm-ckpt_*.deb Depends | grep -q "libckpt0 (= $version)" || fail "python3-slurm-ckpt does not depend on libckpt0 (= $version)"
dpkg-deb -f "$SCRATCH"/v2/python3-slurm-ckpt_*.deb Depends | grep -q "libckpt0 (= $version2)" || fail "the re-packed python3-slurm-ckpt does not depend on libckpt0 (= $version2)"
dpkg-deb --ctrl-tarfile "$SCRATCH"/v1/slurm-ckpt-controller_*.deb | tar -xO ./conffiles | grep -qx "$CONF" || fail "$CONF is not a conffile"

# The RPMs (rpmbuild): the same files as the .debs, the conffile %config(noreplace). They cannot be installed here.
if command -v rpmbuild > /dev/null; then
  (cd "$CKPT_BUILD_DIR" && cpack -G RPM -B "$SCRATCH/rpm") > "$SCRATCH/rpm.log" 2>&1 || { tail -20 "$SCRATCH/rpm.log" >&2; fail "cpack -G RPM failed"; }
  for pair in slurm-ckpt:slurm-ckpt slurm-ckpt-controller:slurm-ckpt-controller python3-slurm-ckpt:python3-slurm-ckpt \
              libckpt0:slurm-ckpt-libs libslurm-ckpt-dev:slurm-ckpt-devel; do
    deb=$(ls "$SCRATCH"/v1/"${pair%%:*}"_*.deb) rpm=$(ls "$SCRATCH"/rpm/"${pair#*:}"-[0-9]*.rpm 2> /dev/null || true)
    [ -n "$rpm" ] || fail "cpack -G RPM made no ${pair#*:} package: $(ls "$SCRATCH/rpm")"
    files_deb=$(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ { print $6 }' | sed 's|^\.||' | sort)
    files_rpm=$(rpm -qp --qf '[%{FILEMODES:perms} %{FILENAMES}\n]' "$rpm" 2> /dev/null | awk '$1 !~ /^d/ { print $2 }' | sort)
    [ "$files_deb" = "$files_rpm" ] || { diff <(echo "$files_deb") <(echo "$files_rpm") >&2 || true; fail "${pair#*:}.rpm and ${pair%%:*}.deb differ in files (above: < deb, > rpm)"; }
  done
  rpm -qp --configfiles "$SCRATCH"/rpm/slurm-ckpt-controller-[0-9]*.rpm 2> /dev/null | grep -qx "$CONF" || fail "$CONF is not %config in the RPM"
  echo "rpm: $(ls "$SCRATCH"/rpm/*.rpm | wc -l) packages with the .debs' files"
else
  fail "needs rpmbuild (Debian's rpm package; scripts/install-deps.sh installs it)"
fi

# lintian: only the tags packaging/README.md explains.
if command -v lintian > /dev/null; then
  lintian "$SCRATCH"/v1/*.deb > "$SCRATCH/lintian.txt" 2>&1 || true
  unexplained=$(grep -E '^[EWX]: ' "$SCRATCH/lintian.txt" | grep -vE ': (bogus-mail-host|bogus-mail-host-in-debian-changelog|initial-upload-closes-no-bugs) ' \
    | grep -vE '^W: libckpt0: maintainer-script-empty \[post(inst|rm)\]' \
    | grep -vE '^W: slurm-ckpt-controller: non-standard-file-perm 0640 != 0644 \[etc/slurm-ckpt/controller.conf\]' || true)
  [ -z "$unexplained" ] || { echo "$unexplained" >&2; fail "lintian reports tags that packaging/README.md does not explain (above)"; }
  echo "lintian: $(grep -cE '^[EW]: ' "$SCRATCH/lintian.txt") tags, all explained in packaging/README.md"
else
  fail "needs lintian (scripts/install-deps.sh installs it)"
fi

# ---- install --------------------------------------------------------------------------------------------------
apt_install() {  # apt_install LOG DEB...: as an admin would, never asking (an edited conffile is kept)
  local log=$1
  shift
  touch "$MARK"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=120 \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@" > "$log" 2>&1 \
    || { tail -30 "$log" >&2; fail "apt-get install failed (log: $log)"; }
}
step "apt-get install ./*.deb ($version)"
apt_install "$SCRATCH/install.log" "$SCRATCH"/v1/*.deb
for pkg in "${PACKAGES[@]}"; do
  [ "$(dpkg-query -W -f='${Version}' "$pkg")" = "$version" ] || fail "$pkg $version is not installed"
done

# Each package holds exactly these files (dpkg -L, directories left out).
files_of() { dpkg -L "$1" | while read -r f; do [ -d "$f" ] || echo "$f"; done | sort; }
expect_files() {  # expect_files PACKAGE FILE...: and its copyright and changelog
  local pkg=$1 want got
  shift
  want=$(printf '%s\n' "$@" "/usr/share/doc/$pkg/copyright" "/usr/share/doc/$pkg/changelog.Debian.gz" | sort)
  got=$(files_of "$pkg")
  if [ "$want" != "$got" ]; then
    diff <(echo "$want") <(echo "$got") | sed 's/^</  missing:/; s/^>/  unexpected:/' | grep -E 'missing|unexpected' >&2 || true
    fail "dpkg -L $pkg does not list exactly its files (above)"
  fi
}
pydir=/usr/lib/python3/dist-packages/slurm_ckpt
native=$(cd "$CKPT_BUILD_DIR/python/slurm_ckpt" && ls _native*.so)
libv=$(basename "$(readlink -f "$CKPT_BUILD_DIR"/hooks/libckpt.so)")
expect_files slurm-ckpt "$PLUGIN_DIR/spank_ckpt.so" /usr/bin/ckpt /usr/share/man/man1/ckpt.1.gz \
  /usr/share/man/man8/spank_ckpt.8.gz /usr/share/doc/slurm-ckpt/examples/plugstack.conf /usr/bin/ckpt-run \
  /usr/share/man/man1/ckpt-run.1.gz
expect_files slurm-ckpt-controller /usr/sbin/ckpt-controller "$UNIT" "$CONF" /usr/share/man/man8/ckpt-controller.8.gz
expect_files python3-slurm-ckpt "$pydir/__init__.py" "$pydir/torch.py" "$pydir/inplace.py" "$pydir/restart.py" \
  "$pydir/$native"
expect_files libckpt0 "/usr/lib/$MULTIARCH/$libv" "/usr/lib/$MULTIARCH/libckpt.so.0"
expect_files libslurm-ckpt-dev "/usr/lib/$MULTIARCH/libckpt.so" /usr/include/ckpt.h /usr/include/ckpt/hooks.hpp \
  /usr/include/ckpt/options.hpp /usr/include/ckpt/result.hpp /usr/include/ckpt/store.hpp \
  /usr/include/ckpt/straggler.hpp \
  "/usr/lib/$MULTIARCH/pkgconfig/slurm-ckpt.pc" "/usr/lib/$MULTIARCH/cmake/slurm_ckpt/slurm_ckptConfig.cmake" \
  "/usr/lib/$MULTIARCH/cmake/slurm_ckpt/slurm_ckptConfigVersion.cmake"
[ "$(stat -c %a /var/lib/slurm-ckpt)" = 700 ] || fail "/var/lib/slurm-ckpt is not mode 0700 after install"
[ "$(stat -c '%a %U %G' "$CONF")" = "640 root root" ] ||
  fail "$CONF is $(stat -c '%a %U %G' "$CONF"), not 640 root root (it may hold a webhook token)"
man -w ckpt-controller > /dev/null 2>&1 || fail "man does not find ckpt-controller(8)"
pass "every package lists exactly its files; $PLUGIN_DIR/spank_ckpt.so, /usr/sbin/ckpt-controller installed"

# ---- the cluster and the controller, from installed paths only ------------------------------------------------
step "local cluster in $CKPT_CLUSTER_DIR (ports $CKPT_CLUSTER_PORT-$((CKPT_CLUSTER_PORT + 4))), plugstack: 'required spank_ckpt.so ...'"
"$CLUSTER" down > /dev/null 2>&1 || true
ADDR=$("$CLUSTER" addr)  # where the nodes reach this host, the controller's
CKPT_CLUSTER_PLUGSTACK_PLUGIN=spank_ckpt.so CKPT_CLUSTER_PLUGIN_ARGS="controller=http://$ADDR:$PORT" \
  "$CLUSTER" up > "$SCRATCH/cluster.log" 2>&1 || { cat "$SCRATCH/cluster.log" >&2; fail "the cluster did not come up"; }
grep -q '^required spank_ckpt.so ' "$CKPT_CLUSTER_DIR/etc/plugstack.conf" || fail "plugstack.conf does not name the installed plugin"

# The site's edits to the packaged conffile: this cluster's port and MUNGE socket, quick settle and reconcile.
sed -i -e "s|^listen = .*|listen = $ADDR:$PORT|" -e 's|^settle = .*|settle = 200ms|' \
  -e 's|^reconcile_interval = .*|reconcile_interval = 1s|' "$CONF"
echo "munge_socket = $CKPT_CLUSTER_DIR/munge/munge.socket" >> "$CONF"
conf_sum=$(md5sum < "$CONF")

unit_line() { sed -n "s/^$1=//p" "$UNIT"; }
start_controller() {  # as systemd would: ExecStartPre, then ExecStart (SLURM_CONF names this cluster's slurm.conf)
  local pre start
  pre=$(unit_line ExecStartPre)
  start=$(unit_line ExecStart)
  [ -n "$pre" ] && [ -n "$start" ] || fail "$UNIT has no ExecStartPre/ExecStart"
  case $start in /usr/sbin/ckpt-controller\ *) ;; *) fail "ExecStart does not run the installed controller: $start" ;; esac
  # shellcheck disable=SC2086
  $pre >> "$SCRATCH/controller.log" 2>&1 || fail "ExecStartPre ($pre) failed: $(tail -3 "$SCRATCH/controller.log")"
  # shellcheck disable=SC2086
  setsid $start >> "$SCRATCH/controller.log" 2>&1 &
  CONTROLLER_PID=$!
  for _ in $(seq 100); do
    curl -sf "http://$ADDR:$PORT/healthz" > /dev/null && return 0
    sleep 0.1
  done
  fail "the controller did not start: $(tail -5 "$SCRATCH/controller.log")"
}
ctl() { /usr/sbin/ckpt-controller -c "$CONF" "$@"; }
for bound in MemoryMax TasksMax NoNewPrivileges ProtectSystem; do
  [ -n "$(unit_line $bound)" ] || fail "$UNIT sets no $bound"
done
step "ckpt-controller as $UNIT starts it: $(unit_line ExecStart)"
start_controller

# ---- crash and recover, training with the installed module ----------------------------------------------------
APP=$SCRATCH/app   # the training script alone: no source tree, no build tree on python's path
mkdir -p "$APP"
cp "$CKPT_SOURCE_DIR/slurm-examples/train_ddp.py" "$APP/"
chmod -R a+rX "$APP"
module=$(cd "$APP" && env -u PYTHONPATH /usr/bin/python3 -c 'import slurm_ckpt, slurm_ckpt.torch; print(slurm_ckpt.__file__)')
[ "$module" = "$pydir/__init__.py" ] || fail "python3 imports slurm_ckpt from $module, not from the package"
USER_CKPT=$(mktemp -d "$CKPT_CLUSTER_DIR/ckpt/pkgtest-user.XXXXXX")   # the user's checkpoints: no package's business
chmod 755 "$USER_CKPT"
cat > "$APP/train.sbatch" <<JOB
#!/bin/bash
#SBATCH -N3 --ntasks-per-node=1 --ckpt-interval=10steps --ckpt-keep=2 --requeue --open-mode=append
unset PYTHONPATH
cd $APP
export MASTER_ADDR=$([ "$ADDR" = 127.0.0.1 ] && echo 127.0.0.1)
export MASTER_PORT=\$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo "run \${SLURM_RESTART_COUNT:-0} on \$SLURM_JOB_NODELIST, resuming from step \${CKPT_RESUME_STEP:-none}"
srun /usr/bin/python3 -c 'import slurm_ckpt; print("module", slurm_ckpt.__file__)' | sort -u
srun /usr/bin/python3 $APP/train_ddp.py --steps $STEPS --log-every 20 --step-sleep 0.15 "\$@"
JOB
step "training job on 3 nodes; a node will crash once checkpoint step 20 is committed"
job=$(cd "$APP" && env -u PYTHONPATH sbatch --parsable -o "$APP/out" --ckpt-dir="$USER_CKPT/job" "$APP/train.sbatch" --out "$APP/final.bin")
latest() { [ -f "$USER_CKPT/job/latest" ] && sed 's/^0*//; s/^$/0/' "$USER_CKPT/job/latest" || echo 0; }
for _ in $(seq 600); do [ "$(latest)" -ge 20 ] && break; sleep 0.2; done
[ "$(latest)" -ge 20 ] || fail "no checkpoint at step 20 in time: $(tail -5 "$APP/out" 2> /dev/null)"
assert_contains "$APP/out" "module $pydir/__init__.py"
victim=$(scontrol show hostnames "$(squeue -h -j "$job" -o %N)" | sed -n 2p)
echo "checkpoint step $(latest) committed; crashing $victim"
t0=$(date +%s.%N)
"$CLUSTER" crash-node "$victim" 2>&1
for _ in $(seq 600); do grep -q "^run 1 " "$APP/out" 2> /dev/null && break; sleep 0.1; done
grep -q "^run 1 " "$APP/out" || fail "the job did not run again: $(ctl history "$job" 2>&1 | tail -5)"
printf 'running again %.1f s after the crash: %s\n' "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" "$(grep '^run 1 ' "$APP/out")"
"$CLUSTER" revive-node "$victim" > /dev/null 2>&1 && victim=""
wait_job_state "$job" '^(COMPLETED|FAILED|CANCELLED)$' 300
wait_job_state "$job" '^COMPLETED$' 1
grep -q "^run 1 .*resuming from step [1-9]" "$APP/out" || fail "run 1 did not resume from a checkpoint: $(grep '^run ' "$APP/out")"
[ -s "$APP/final.bin" ] || fail "the training wrote no final weights"
# The controller records the job's end within a reconcile interval.
for _ in $(seq 100); do
  ctl history "$job" > "$SCRATCH/history-before" 2>&1 || fail "ckpt-controller history $job failed: $(cat "$SCRATCH/history-before")"
  grep -q -- '-> completed' "$SCRATCH/history-before" && break
  sleep 0.1
done
grep -q -- '-> completed' "$SCRATCH/history-before" || { cat "$SCRATCH/history-before" >&2; fail "the controller did not record job $job as completed"; }
grep -qi requeue "$SCRATCH/history-before" || { cat "$SCRATCH/history-before" >&2; fail "the history of job $job shows no requeue"; }
# The same training without a crash ends with the same weights, bit for bit.
(cd "$APP" && env -u PYTHONPATH sbatch -W -o "$APP/ref.out" --ckpt-dir="$USER_CKPT/reference" "$APP/train.sbatch" \
  --out "$APP/reference.bin") > /dev/null || fail "the reference run failed: $(tail -5 "$APP/ref.out")"
cmp -s "$APP/final.bin" "$APP/reference.bin" || fail "the recovered job's final weights differ from the reference run's"
pass "job $job recovered from the crash of its node and ended bit for bit as the reference run, on installed paths only"

# ---- upgrade while the controller holds a running job ---------------------------------------------------------
step "upgrade to $version2 while the controller tracks a running job"
holder=$(sbatch --parsable -N1 -o /dev/null --ckpt-dir="$USER_CKPT/holder" --ckpt-interval=1h --wrap 'sleep 600')
wait_job_state "$holder" '^RUNNING$' 60
for _ in $(seq 100); do ctl jobs 2>&1 | grep -qw "$holder" && break; sleep 0.1; done
ctl jobs > "$SCRATCH/jobs-before" 2>&1
grep -qw "$holder" "$SCRATCH/jobs-before" || { cat "$SCRATCH/jobs-before" >&2; fail "the controller does not track job $holder"; }
db_rows=$(sqlite3 /var/lib/slurm-ckpt/controller.db 'select count(*) from sqlite_master' 2> /dev/null || echo "?")
apt_install "$SCRATCH/upgrade.log" "$SCRATCH"/v2/*.deb
for pkg in "${PACKAGES[@]}"; do
  [ "$(dpkg-query -W -f='${Version}' "$pkg")" = "$version2" ] || fail "$pkg was not upgraded to $version2"
done
[ "$(md5sum < "$CONF")" = "$conf_sum" ] || fail "the upgrade changed the edited conffile $CONF"
[ -s /var/lib/slurm-ckpt/controller.db ] || fail "the upgrade lost the controller's database"
# systemd would restart the unit on the upgrade (postinst's try-restart): do that by hand.
stop_controller
start_controller
ctl history "$job" > "$SCRATCH/history-after" 2>&1 || fail "ckpt-controller history $job failed after the upgrade"
diff "$SCRATCH/history-before" "$SCRATCH/history-after" > /dev/null || { diff "$SCRATCH/history-before" "$SCRATCH/history-after" >&2 || true; fail "job $job's history changed across the upgrade"; }
ctl jobs 2>&1 | grep -qw "$holder" || fail "the upgraded controller forgot running job $holder"
scancel "$holder"
pass "upgraded to $version2: conffile kept as edited, database ($db_rows schema objects) and job $job's history kept, job $holder still tracked"

# ---- libslurm-ckpt-dev: a consumer project ---------------------------------------------------------------------
step "a C++ program built against the installed libckpt: find_package(slurm_ckpt) and pkg-config"
C=$SCRATCH/consumer
mkdir -p "$C"
cat > "$C/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.25)
project(ckpt_consumer LANGUAGES C CXX)
find_package(slurm_ckpt 0.1 REQUIRED)
add_executable(consumer consumer.cpp)
set_target_properties(consumer PROPERTIES CXX_STANDARD 20)
target_link_libraries(consumer PRIVATE slurm_ckpt::ckpt)
EOF
cat > "$C/consumer.cpp" <<'EOF'
// Saves one checkpoint through the C API and reads it back through the C++ header's types.
#include <ckpt.h>
#include <ckpt/hooks.hpp>
#include <cstdio>
#include <string>
int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::string dir = std::string("dir=") + argv[1];
  const char* settings[] = {dir.c_str(), "interval=1steps", "signals=off", "log=warn"};
  ckpt_checkpointer* cp = nullptr;
  if (ckpt_open(settings, 4, &cp) != 0) { std::fprintf(stderr, "%s\n", ckpt_last_error()); return 1; }
  double w[64] = {1.5};
  if (ckpt_register_host(cp, "w", w, sizeof w, 0, nullptr) != 0) return 1;
  uint64_t step = 0;
  if (ckpt_restore(cp, &step) != 0) return 1;
  int stop = 0;
  if (ckpt_before_update(cp) != 0 || ckpt_after_step(cp, 1, &stop) != 0 || ckpt_close(cp) != 0) {
    std::fprintf(stderr, "%s\n", ckpt_last_error());
    return 1;
  }
  ckpt_free(cp);
  ckpt::Interval interval;  // a type of the C++ API, from the installed headers
  std::printf("consumer: saved step 1 (interval kind %d)\n", static_cast<int>(interval.kind));
  return 0;
}
EOF
(cd "$C" && cmake -S . -B build > cmake.log 2>&1 && cmake --build build > build.log 2>&1) \
  || { tail -n 20 "$C"/*.log >&2; fail "the consumer project does not build against libslurm-ckpt-dev"; }
"$C/build/consumer" "$C/ckpt" || fail "the consumer program failed"
[ "$(sed 's/^0*//' "$C/ckpt/latest" 2> /dev/null)" = 1 ] || fail "the consumer wrote no checkpoint of step 1"
printf '#include <ckpt.h>\nint main(void) { return ckpt_rank(0) == -1 ? 0 : 1; }\n' > "$C/c.c"
# shellcheck disable=SC2046
cc -o "$C/c" "$C/c.c" $(pkg-config --cflags --libs slurm-ckpt) || fail "a C program does not build with pkg-config slurm-ckpt"
"$C/c" || fail "the C program linked through pkg-config failed"
pass "find_package(slurm_ckpt) and pkg-config slurm-ckpt build and run against the installed library"

# ---- remove, then purge ---------------------------------------------------------------------------------------
step "apt-get remove slurm-ckpt-controller, then purge everything"
stop_controller   # what prerm's systemd stop does
find "$USER_CKPT" -type f -printf '%P %s\n' | sort > "$SCRATCH/user-files-before"
[ -s "$SCRATCH/user-files-before" ] || fail "no user checkpoint files to watch"
DEBIAN_FRONTEND=noninteractive apt-get remove -y -q -o DPkg::Lock::Timeout=120 slurm-ckpt-controller > "$SCRATCH/remove.log" 2>&1 || fail "apt-get remove failed"
[ -f "$CONF" ] || fail "removing (not purging) slurm-ckpt-controller deleted its conffile"
[ -s /var/lib/slurm-ckpt/controller.db ] || fail "removing (not purging) slurm-ckpt-controller deleted its database"
[ ! -e /usr/sbin/ckpt-controller ] || fail "ckpt-controller is still installed after remove"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -q -o DPkg::Lock::Timeout=120 "${PACKAGES[@]}" > "$SCRATCH/purge.log" 2>&1 || { tail "$SCRATCH/purge.log" >&2; fail "apt-get purge failed"; }
rm -f "$MARK"
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2> /dev/null || echo "un")
  case $status in un*|"") ;; *) fail "$pkg is still known to dpkg after purge ($status)" ;; esac
done
[ ! -e "$CONF" ] && [ ! -e /etc/slurm-ckpt ] || fail "purge left $CONF"
[ ! -e /var/lib/slurm-ckpt ] || fail "purge left /var/lib/slurm-ckpt"
[ ! -e "$PLUGIN_DIR/spank_ckpt.so" ] && [ ! -e /usr/bin/ckpt ] && [ ! -e "$pydir" ] || fail "purge left installed files"
find "$USER_CKPT" -type f -printf '%P %s\n' | sort > "$SCRATCH/user-files-after"
diff "$SCRATCH/user-files-before" "$SCRATCH/user-files-after" > /dev/null || fail "purge changed the user's checkpoint dir $USER_CKPT"
pass "removed: conffile and state kept; purged: conffile and state gone, $(wc -l < "$SCRATCH/user-files-after") user checkpoint files untouched"

step "done"
"$CLUSTER" down > /dev/null 2>&1 || true
rm -rf "$USER_CKPT"
finish
