#!/usr/bin/env bash
# Runs INSIDE the VM that scripts/vm-test.sh boots (as the guest's root, in its root cgroup).
# Not meant to be run on a host: it writes the cgroup root's subtree_control and bind-mounts
# over the fork binary, which only the throwaway guest may do.
set -uo pipefail
fork=$FORK_VM_BIN
# A target directory shared read-only (scripts/vm-test.sh: one the guest's tmpfs overlays
# would hide): its tmp/, the tests' scratch, becomes a tmpfs of the guest's own.
if [ "${FORK_VM_TMP_MOUNT:-no}" = yes ]; then
  mount -t tmpfs -o mode=1777 fork-vm-scratch "$FORK_VM_TMP" ||
    { echo "vm: the tests' scratch tmpfs on $FORK_VM_TMP: FAIL"; echo "vm-result: passed=0 failed=1"; exit 1; }
fi
cg=/sys/fs/cgroup
pass=0
fail=0

step() {
  local name=$1 out rc
  shift
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc = 0 ]; then
    echo "vm: $name: PASS $(echo "$out" | head -n 1 | cut -c1-200)"
    pass=$((pass + 1))
  else
    echo "vm: $name: FAIL (exit $rc): $(echo "$out" | tail -n 4 | tr '\n' ' ')"
    fail=$((fail + 1))
  fi
}

echo "vm: kernel $(uname -r); lsm $(cat /sys/kernel/security/lsm); cgroup root controllers: $(cat $cg/cgroup.controllers)"

# The delegation systemd would do: the root cgroup enables the controllers for its children
# (the root is exempt from the no-internal-processes rule), `fork-vm` is a slice, this
# script's own processes sit in its leaf `harness`, root's runs get `root/` and the user's
# subtree `user/` is chowned to the user as `Delegate=yes` does (the directory and its
# cgroup.procs, cgroup.threads and cgroup.subtree_control).
ctl="+memory +cpu +pids"
echo "$ctl" >$cg/cgroup.subtree_control
mkdir -p $cg/fork-vm/harness $cg/fork-vm/root $cg/fork-vm/user/shell
echo $$ >$cg/fork-vm/harness/cgroup.procs
echo "$ctl" >$cg/fork-vm/cgroup.subtree_control
echo "$ctl" >$cg/fork-vm/root/cgroup.subtree_control
echo "$ctl" >$cg/fork-vm/user/cgroup.subtree_control
# The unprivileged user: a plain uid with its own home (no login needed).
uid=1500
mkdir -p /tmp/fork-vm/home && chown $uid:$uid /tmp/fork-vm/home
# Its subordinate ids (the guest's /etc is a writable overlay): each of its sandboxes then
# runs as a uid of its own from the range, mapped by newuidmap/newgidmap (package uidmap),
# which need a passwd entry to name the user.
getent group $uid >/dev/null || echo "forkvm:x:$uid:" >>/etc/group
getent passwd $uid >/dev/null || echo "forkvm:x:$uid:$uid:fork VM user:/tmp/fork-vm/home:/bin/sh" >>/etc/passwd
user_name=$(getent passwd $uid | cut -d: -f1)
grep -q "^$user_name:" /etc/subuid 2>/dev/null ||
  usermod --add-subuids 300000-365535 --add-subgids 300000-365535 "$user_name"
# The user's evaluations keep their verdicts in the (host's) output directory too.
mkdir -p "$FORK_VM_OUT/eval" && chmod 1777 "$FORK_VM_OUT/eval"
chown $uid:$uid $cg/fork-vm/user $cg/fork-vm/user/cgroup.procs $cg/fork-vm/user/cgroup.threads \
  $cg/fork-vm/user/cgroup.subtree_control
chown -R $uid:$uid $cg/fork-vm/user/shell

# Each fork invocation starts as the only process of a fresh cgroup of the delegated subtree,
# as `systemd-run [--user] --scope -p Delegate=yes fork ...` starts it (the test suites spawn
# fork directly, so a small shim stands over the binary inside this guest only).
mkdir -p /tmp/fork-vm && chmod 755 /tmp/fork-vm
touch /tmp/fork-vm/fork.real
mount --bind "${FORK_VM_REAL:-$fork}" /tmp/fork-vm/fork.real
# fork finds its sandbox init beside the binary it runs from (/tmp/fork-vm/fork.real here):
# the same build's fork-init goes beside it.
touch /tmp/fork-vm/fork-init
mount --bind "$(dirname "${FORK_VM_REAL:-$fork}")/fork-init" /tmp/fork-vm/fork-init
cat >/tmp/fork-vm/fork <<'EOF'
#!/bin/sh
if [ "$(id -u)" = 0 ]; then base=/sys/fs/cgroup/fork-vm/root; else base=/sys/fs/cgroup/fork-vm/user; fi
# A uid the subtree is not delegated to (the suites' tests as nobody) stays where it is,
# as on a host without delegation.
if mkdir -p "$base/run-$$" 2>/dev/null; then
  echo $$ >"$base/run-$$/cgroup.procs" || exit 70
fi
exec /tmp/fork-vm/fork.real "$@"
EOF
chmod 755 /tmp/fork-vm/fork
mount --bind /tmp/fork-vm/fork "$fork"


leftovers() {
  # No sandbox cgroup of any run remains (the run-* scopes are the shim's, as systemd's are).
  ! find $cg/fork-vm -name 'fork-[0-9a-f]*' -type d | grep -q .
}

# Runs `fork run` (with the given flags), writes its report to $1.
reported_run() {
  local r=$1
  shift
  rm -f "$r"
  "$fork" run "$@" --report "$r" -- /bin/true || return 1
  grep -q '"cgroup":"v2"' $r || grep -q '"cgroup": "v2"' $r || { cat $r; return 1; }
  grep -q '"cgroupns":true' $r || grep -q '"cgroupns": true' $r || { cat $r; return 1; }
  # The capped disk: as root on the host, as a user in fork's own user and mount namespace.
  grep -q '"disk": "tmpfs"' $r || { cat $r; return 1; }
}
memory_budget() {
  local r=$1 rc=0
  shift
  rm -f "$r"
  "$fork" run "$@" --memory 64MiB --report $r -- sh -c 'x=$(head -c 200000000 /dev/zero | tr "\0" a); echo ${#x}' || rc=$?
  [ $rc = 137 ] && grep -q '"budget_exceeded":"memory"\|"budget_exceeded": "memory"' $r || { echo "rc=$rc"; cat $r; return 1; }
}
pids_budget() {
  local r=/tmp/fork-vm/pids-report.json rc=0
  "$fork" run --pids 8 --report $r -- sh -c 'for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 5 & done; wait' || rc=$?
  grep -q '"pids_peak"' $r || { echo "rc=$rc"; cat $r; return 1; }
  # The pids limit refused forks: the shell saw errors and never reached 12 sleeps.
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["usage"]["pids_peak"]<=8, r' $r
}
wall_kill() {
  local r=/tmp/fork-vm/wall-report.json rc=0
  "$fork" run --wall 3s --report $r -- sh -c 'sleep 60 & sleep 60 & wait' || rc=$?
  [ $rc = 137 ] && grep -q 'wall' $r || { echo "rc=$rc"; cat $r; return 1; }
}

step "root: fork check" "$fork" check
step "root: fork run -- /bin/true (cgroup v2, cgroupns in the report)" reported_run /tmp/fork-vm/root.json
step "root: memory budget kills at 64MiB (v2 memory.max)" memory_budget /tmp/fork-vm/root-mem.json
step "root: pids budget caps the tasks (v2 pids.max)" pids_budget
step "root: wall budget kills the whole tree (v2 kill)" wall_kill
landlock_and_netns() {
  # Landlock as the kernel has it (ABI 2 on Debian 12: filesystem only, partially_enforced),
  # and the network namespace still isolating: a host loopback listener is unreachable.
  local r=/tmp/fork-vm/ll-report.json rc=0
  python3 -c 'import socket,time; s=socket.socket(); s.bind(("127.0.0.1",18765)); s.listen(); time.sleep(60)' &
  local listener=$!
  sleep 1
  "$fork" run --report $r -- python3 -c 'import socket
try:
    socket.create_connection(("127.0.0.1", 18765), 2); print("REACHED")
except OSError as e:
    print("refused", e)' || rc=$?
  kill $listener
  wait $listener 2>/dev/null
  python3 - "$r" "$rc" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
iso = r["isolation"]
print(iso)
assert sys.argv[2] == "0", sys.argv[2]
assert iso["netns"] is True
abi = iso["landlock_abi"]
assert abi >= 1
if abi < 4:
    assert iso["landlock_enforced"] == "partially_enforced", iso
assert r["usage"]["memory_peak_bytes"] > 0 and r["usage"]["pids_peak"] >= 1, r["usage"]
PY
}
# `fork evaluate` of the demo patch here, compared with the verdict the same build gave on
# the host before the guest booted (scripts/vm-test.sh wrote its key to host-KIND.txt): the
# verdict and each plan task's verdict must be the same; the confidence and the metrics'
# classes are printed beside them. KIND: judged (`--task judged`) or plan (no --task: the
# README's main command, the demo's evaluation plan).
evaluate_demo() {
  local name=$1 d=/tmp/fork-vm/home/eval-$1 kind=$2 here there
  shift 2
  rm -rf "$d" && mkdir -p "$d" && chmod 755 "$d"
  XDG_CONFIG_HOME=$d/xdg "$fork" evaluate "$FORK_VM_REPO/fixtures/patches/swap-compressor.diff" \
    --runtime "$FORK_VM_REPO/fixtures/hermes-demo" --no-ledger --out "$d/out" "$@" \
    >"$d/verdict.txt" 2>"$d/stderr.txt" || true
  # Kept for the host (the guest's /tmp goes with it): eval/NAME/ in the output directory.
  mkdir -p "$FORK_VM_OUT/eval/$name" && cp "$d/verdict.txt" "$d/stderr.txt" "$d/out/verdict.json" \
    "$FORK_VM_OUT/eval/$name/" 2>/dev/null
  here=$(python3 "$FORK_VM_REPO/scripts/vm-verdict.py" key "$d/out/verdict.json")
  there=$(cat "$FORK_VM_OUT/host-$kind.txt" 2>/dev/null || echo "NO VERDICT on the host")
  if [ "$here" = "$there" ] && [ "${here#NO VERDICT}" = "$here" ]; then
    echo "$here, as on the host (here: $(python3 "$FORK_VM_REPO/scripts/vm-verdict.py" detail "$d/out/verdict.json"))"
    cat "$d/verdict.txt"
    return 0
  fi
  cat "$d/verdict.txt"
  tail -n 5 "$d/stderr.txt"
  echo "here: $here; on the host: $there"
  return 1
}

# A side's source copied into its empty workspace on a filesystem that folds case: two
# names of the runtime's source that fold together (KIND file: `notes.txt` and `NOTES.txt`;
# dir: `lib/` and `Lib/`) are refused, naming the path (exit 65), never one copied over the
# other. This guest's kernel folds case (CONFIG_UNICODE; the host's may not): an ext4 made
# with `-O casefold`, a directory of it flagged `+F` as TMPDIR, and the capped disk off,
# so that the run directory and the workspace in it are made there.
casefold_copy() {
  local kind=$1 d=/tmp/fork-vm/casefold-$1 rc=0 left named
  local mnt=$d/mnt img=$d.img
  rm -rf "$d" "$img" && mkdir -p "$mnt" || return 1
  # Debian builds loop devices and ext4 as modules (the host's /lib/modules has them).
  modprobe -q loop 2>/dev/null
  modprobe -q ext4 2>/dev/null
  truncate -s 64M "$img" && mkfs.ext4 -q -F -O casefold "$img" && mount -o loop "$img" "$mnt" ||
    { echo "no case-folding ext4 here"; rm -f "$img"; return 1; }
  # From here every way out unmounts the filesystem and removes its image.
  casefold_done() { umount "$mnt" && rm -f "$img"; }
  mkdir "$mnt/tmp" && chattr +F "$mnt/tmp" && chmod 1777 "$mnt/tmp" &&
    cp -r "$FORK_VM_REPO/fixtures/hermes-demo" "$d/rt" &&
    case $kind in
      file) named=src/hermes/notes.txt && echo one >"$d/rt/hermes/notes.txt" && echo two >"$d/rt/hermes/NOTES.txt" ;;
      dir) named=src/lib && mkdir "$d/rt/lib" "$d/rt/Lib" && echo one >"$d/rt/lib/a.txt" && echo two >"$d/rt/Lib/b.txt" ;;
    esac &&
    # The default policy (with the seccomp profile it names beside it), the capped disk off.
    cp -r "$FORK_VM_REPO/policies" "$d/policies" &&
    sed -i 's/^disk = "required"/disk = "off"/' "$d/policies/default.toml" &&
    grep -q '^disk = "off"' "$d/policies/default.toml" ||
    { echo "setting up the runtime failed"; casefold_done; return 1; }
  TMPDIR=$mnt/tmp XDG_CONFIG_HOME=$d/xdg "$fork" evaluate "$FORK_VM_REPO/fixtures/patches/swap-compressor.diff" \
    --runtime "$d/rt" --policy "$d/policies/default.toml" --task tests --no-ledger --out "$d/out" >"$d/out.txt" 2>&1 || rc=$?
  # Nothing of the evaluation is left on that filesystem, and nothing holds it.
  left=$(find "$mnt/tmp" -mindepth 1 | head -n 3)
  casefold_done || { echo "the case-folding filesystem could not be unmounted (still in use)"; return 1; }
  # The refusal names the second of the two names the copy met (either may come first).
  grep -qi "$named: another entry of the source was copied to this name (does the workspace's filesystem fold case?)" "$d/out.txt" &&
    [ $rc = 65 ] && [ -z "$left" ] ||
    { echo "exit $rc; left: $left"; tail -n 5 "$d/out.txt"; return 1; }
  echo "exit 65: $(grep -m 1 'fold case' "$d/out.txt" | cut -c1-200)"
}

# scripts/bench-launch-layers.sh's checks on this kernel (cgroup v2, an older Landlock ABI):
# each variant's isolation block is what the variant claims (the timings of an emulated
# guest mean nothing). It runs fork through the shim, a fresh cgroup per run.
launch_layers() {
  local out
  out=$(FORK_BIN=$fork TMPDIR=/tmp/fork-vm "$FORK_VM_REPO/scripts/bench-launch-layers.sh" 1 2>&1) ||
    { echo "$out" | tail -n 5; return 1; }
  echo "$(echo "$out" | grep -c '^isolation ok: ') variants checked; $(echo "$out" | grep '^builtin/bwrap')"
  [ "$(echo "$out" | grep -c '^isolation ok: ')" = 8 ]
}

step "root: no sandbox cgroup left" leftovers
step "root: Landlock degrades to the kernel's ABI, netns isolates, v2 statistics" landlock_and_netns
step "root: the launch-by-layer benchmark's variants have the layers they claim (v2, this ABI)" launch_layers
step "root: fork evaluate of the demo patch (--task judged) gives the host's verdict" evaluate_demo root judged --task judged
step "root: two names that fold together, copied onto a case-folding ext4: refused, naming the path (file)" casefold_copy file
step "root: two names that fold together, copied onto a case-folding ext4: refused, naming the path (directory)" casefold_copy dir

as_user() {
  export -f reported_run memory_budget evaluate_demo
  export fork FORK_VM_REPO FORK_VM_OUT
  (
    echo "$BASHPID" >$cg/fork-vm/user/shell/cgroup.procs
    cd /tmp/fork-vm/home && exec env HOME=/tmp/fork-vm/home \
      setpriv --reuid $uid --regid $uid --clear-groups -- bash -c '"$@"' bash "$@"
  )
}
# The user gets the default policy, every layer required: the capped disk in fork's own
# user and mount namespace, the budgets in the delegated subtree.
step "user: fork check (the default policy, every layer)" as_user "$fork" check
step "user: fork run -- /bin/true (cgroup v2, cgroupns, capped disk in the report)" as_user reported_run /tmp/fork-vm/home/user.json
step "user: memory budget kills at 64MiB in the delegated subtree" as_user memory_budget /tmp/fork-vm/home/user-mem.json
step "user: fork evaluate of the demo patch (--task judged) gives the host's verdict" as_user evaluate_demo user judged --task judged
step "user: no sandbox cgroup left" leftovers

if [ "${FORK_VM_MODE:-smoke}" = full ]; then
  # The README's main command: the demo's evaluation plan (contract, then bench against the
  # baseline), as root and as the user, against the host's verdict.
  step "root: fork evaluate of the demo patch (the plan) gives the host's verdict" evaluate_demo root-plan plan
  step "user: fork evaluate of the demo patch (the plan) gives the host's verdict" as_user evaluate_demo user-plan plan
  step "root and user: no sandbox cgroup left" leftovers
  # The unprivileged pass: the sandbox and evaluate suites as uid 1500, each fork in a
  # fresh cgroup of the user's delegated subtree. Tests that need root say so with
  # `fork-test-skip:` (cargo counts them as passed): they are counted as skipped here.
  # The tests' scratch directory (a writable overlay in this guest) is the user's too.
  chmod 1777 "$FORK_VM_TMP"
  skipped_total=0
  for t in $FORK_VM_TESTS; do
    [ "${FORK_VM_SUITES:-both}" = root ] && break
    name=${t%%=*}
    bin=${t#*=}
    case $name in sandbox | evaluate) ;; *) continue ;; esac
    log=$FORK_VM_OUT/user-$name.log
    # shellcheck disable=SC2086
    as_user sh -c 'cd "$1" && shift && exec "$@"' sh "$FORK_VM_REPO" "$bin" --test-threads=1 --nocapture ${FORK_VM_USER_ARGS-${FORK_VM_ARGS:-}} >"$log" 2>&1
    rc=$?
    summary=$(grep -E '^test result' "$log" | tail -n 1)
    ran=$(echo "$summary" | sed -nE 's/.* ([0-9]+) passed.*/\1/p')
    # (the line may follow cargo's `test NAME ... ` on the same line)
    skipped=$(grep -c 'fork-test-skip:' "$log")
    skipped_total=$((skipped_total + skipped))
    failed_tests=$(sed -n '/^failures:$/,/^test result/p' "$log" | grep -E '^    ' | tr -d ' ' | tr '\n' ' ')
    what="$((${ran:-0} - skipped)) passed, $skipped skipped (they need root), cargo: $summary"
    if [ $rc = 0 ]; then
      echo "vm: user: cargo test --test $name: PASS ($what)"
      pass=$((pass + 1))
    else
      echo "vm: user: cargo test --test $name: FAIL ($what) failed: $failed_tests"
      fail=$((fail + 1))
    fi
  done
  echo "vm: user: $skipped_total test(s) skipped because they need root (not counted as passes)"
  for t in $FORK_VM_TESTS; do
    [ "${FORK_VM_SUITES:-both}" = user ] && break
    name=${t%%=*}
    bin=${t#*=}
    # The whole output goes back to the host (FORK_VM_OUT is a host directory); the
    # summary line and the failing tests' names are printed here.
    # With --nocapture, so that a test which skips itself (`fork-test-skip:`, printed
    # where this guest cannot run it) is counted as skipped, not as a pass.
    # shellcheck disable=SC2086
    (cd "$FORK_VM_REPO" && "$bin" --test-threads=1 --nocapture ${FORK_VM_ARGS:-}) >"$FORK_VM_OUT/$name.log" 2>&1
    rc=$?
    summary=$(grep -E '^test result' "$FORK_VM_OUT/$name.log" | tail -n 1)
    ran=$(echo "$summary" | sed -nE 's/.* ([0-9]+) passed.*/\1/p')
    skipped=$(grep -c 'fork-test-skip:' "$FORK_VM_OUT/$name.log")
    failed_tests=$(sed -n '/^failures:$/,/^test result/p' "$FORK_VM_OUT/$name.log" | grep -E '^    ' | tr -d ' ' | tr '\n' ' ')
    what="$((${ran:-0} - skipped)) passed, $skipped skipped, cargo: $summary"
    if [ $rc = 0 ]; then
      echo "vm: root: cargo test --test $name: PASS ($what)"
      pass=$((pass + 1))
    else
      echo "vm: root: cargo test --test $name: FAIL ($what) failed: $failed_tests"
      fail=$((fail + 1))
    fi
  done
fi

echo "vm-result: passed=$pass failed=$fail"
