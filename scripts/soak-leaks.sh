#!/usr/bin/env bash
# Zero leaks: N runs (default 1000), hostile and normal mixed, then counts what remains.
#
#   scripts/soak-leaks.sh [N]
#
# It builds and runs the release binary; FORK_BIN=path runs that binary instead (the CI's
# short round uses the debug build the tests just made).
#
# The mix, by turn (i mod 20): normal evaluations of a no-op task; `fork run` fork bombs
# held by the pids budget (a bounded loop of 200 sleeps), memory hogs (512 MiB under a
# 64 MiB budget), disk fillers (/tmp and /dev/shm under an 8 MiB disk), wall timeouts, the
# host-resource probes (AIO, mlock, 5,000 open files), supervisors killed with SIGKILL (then
# `fork gc` must reclaim exactly that run) and SIGTERM (mid-run), evaluations interrupted at
# a random point, a failing evaluation (NEEDS_REVISION), and proposals through one
# long-running `fork mesh serve` (a loopback nats-server; installed with apt if missing).
# Every probe only touches what it made, bounded in count, size and time.
#
# Afterwards it asserts: no run directory, no mount under its directory, no new cgroup
# named fork-* (others' runs on the machine are waited out), no process of this fork
# binary, and a stable descriptor count of the long-running `fork mesh serve`. Prints the
# figures; exits 1 on any leak or unexpected outcome.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}
# The no-op task has no judge: its self-reported evidence is accepted as for patches
# written by people (the default policy would answer NEEDS_REVISION).
human=$PWD/policies/human-patches.toml

if [ -n "${FORK_BIN:-}" ]; then
  FORK=$(cd "$(dirname "$FORK_BIN")" && pwd -P)/$(basename "$FORK_BIN")
else
  # shellcheck source=scripts/target-dir.sh
  . scripts/target-dir.sh
  cargo build --release --quiet
  FORK=$(cd "${CARGO_TARGET_DIR:-target}" && pwd -P)/release/fork
fi

NATS=$(command -v nats-server || true)
[ -z "$NATS" ] && [ -x /usr/sbin/nats-server ] && NATS=/usr/sbin/nats-server
if [ -z "$NATS" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server
  NATS=$(command -v nats-server || echo /usr/sbin/nats-server)
fi

tmp=$(mktemp -d)
chmod 755 "$tmp"   # the sandbox uid must reach the run root
serve_pid="" nats_pid=""
cleanup() {
  local st=$?
  if [ -n "$serve_pid" ]; then kill "$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true; fi
  if [ -n "$nats_pid" ]; then kill "$nats_pid" 2>/dev/null || true; wait "$nats_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
  exit "$st"
}
trap cleanup EXIT
cp -r fixtures/hermes-demo "$tmp/rt"
rm -f "$tmp/rt/state/ESCAPED"
printf '\n[tasks.noop]\ncommand = ["true"]\n' >> "$tmp/rt/fork.toml"
export FORK_RUN_ROOT="$tmp/runs" XDG_CONFIG_HOME="$tmp/xdg" XDG_DATA_HOME="$tmp/data"
mkdir -p "$FORK_RUN_ROOT" "$tmp/out"
"$FORK" keygen >/dev/null 2>&1
unset GITHUB_STEP_SUMMARY

list_cgroups() { find /sys/fs/cgroup -maxdepth 5 -type d -name 'fork-*' 2>/dev/null | sort; }
list_cgroups > "$tmp/cg.before"

fail() { echo "soak-leaks: run $i ($1): $2" >&2; cat "$tmp/err" >&2 2>/dev/null || true; [ -f "$tmp/nats.log" ] && tail -5 "$tmp/nats.log" >&2; exit 1; }
budget_of() { sed -n 's/.*"budget_exceeded": *"\{0,1\}\([a-z_]*\)"\{0,1\},.*/\1/p' "$1" | head -1; }

# One long-running node: fork mesh serve on a loopback nats-server.
mesh=no
if [ -n "$NATS" ] && [ -x "$NATS" ]; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$tmp/js" "$tmp/node/runs" "$tmp/node/xdg" "$tmp/node/data"
  printf 'listen: 127.0.0.1:%s\nmax_payload: 8MB\njetstream {\n  store_dir: "%s"\n}\n' "$port" "$tmp/js" > "$tmp/nats.conf"
  "$NATS" -c "$tmp/nats.conf" >"$tmp/nats.log" 2>&1 &
  nats_pid=$!
  for _ in $(seq 200); do (echo > /dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.05; done
  kill -0 "$nats_pid" 2>/dev/null || { echo "soak-leaks: nats-server did not start:" >&2; cat "$tmp/nats.log" >&2; exit 1; }
  node_env=(env FORK_RUN_ROOT="$tmp/node/runs" XDG_CONFIG_HOME="$tmp/node/xdg" XDG_DATA_HOME="$tmp/node/data")
  node_key=$("${node_env[@]}" "$FORK" keygen 2>/dev/null)
  "${node_env[@]}" "$FORK" mesh serve --nats "nats://127.0.0.1:$port" --runtime "$tmp/rt" --policy "$human" \
      >/dev/null 2>"$tmp/serve.log" &
  serve_pid=$!
  mesh=yes
fi
fds_first="" fds_last=""

declare -A count=()
gc_second=0
start=$(date +%s)
for i in $(seq "$N"); do
  rep="$tmp/r.json"
  rm -f "$rep"
  case $((i % 20)) in
  1|5|9|13)
    kind=evaluate
    "$FORK" evaluate fixtures/patches/noop-comment.diff --runtime "$tmp/rt" --task noop --policy "$human" \
        --no-ledger --out "$tmp/out/$i" >/dev/null 2>"$tmp/err" || fail $kind "exit $?"
    ;;
  2)
    kind=fork-bomb
    rc=0; "$FORK" run --pids 32 --report "$rep" -- sh -c 'for i in $(seq 200); do sleep 5 & done; wait' \
        >/dev/null 2>"$tmp/err" || rc=$?
    [ "$(budget_of "$rep")" = pids ] || fail $kind "exit $rc, budget $(budget_of "$rep")"
    ;;
  3)
    kind=memory-hog
    rc=0; "$FORK" run --memory 64MiB --report "$rep" -- python3 -c 'b = bytearray(512 << 20)' \
        >/dev/null 2>"$tmp/err" || rc=$?
    [ "$(budget_of "$rep")" = memory ] || fail $kind "exit $rc, budget $(budget_of "$rep")"
    ;;
  4)
    kind=disk-filler
    rc=0; "$FORK" run --disk 8MiB --report "$rep" -- sh -c \
        'dd if=/dev/zero of=/tmp/a bs=1M count=6; dd if=/dev/zero of=/dev/shm/b bs=1M count=6' \
        >/dev/null 2>"$tmp/err" || rc=$?
    [ "$(budget_of "$rep")" = disk ] || fail $kind "exit $rc, budget $(budget_of "$rep")"
    ;;
  6)
    kind=timeout
    rc=0; "$FORK" run --wall 300ms --report "$rep" -- sleep 30 >/dev/null 2>"$tmp/err" || rc=$?
    [ "$rc" = 137 ] && [ "$(budget_of "$rep")" = wall ] || fail $kind "exit $rc, budget $(budget_of "$rep")"
    ;;
  7)
    kind=host-probes
    out=$("$FORK" run -- python3 -c '
import ctypes, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
ctx = ctypes.c_ulong(0)
aio = libc.syscall(206, 128, ctypes.byref(ctx))
m = mmap.mmap(-1, 16 << 20); b = ctypes.c_char.from_buffer(m)
ml = libc.mlock(ctypes.addressof(b), ctypes.c_size_t(16 << 20)); del b
fds = []
try:
    for _ in range(5000): fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError: pass
print(aio, ml, len(fds))' 2>"$tmp/err") || fail $kind "exit $?"
    read -r aio ml nfds <<<"$out"
    [ "$aio" = -1 ] && [ "$ml" = -1 ] && [ "$nfds" -lt 1024 ] || fail $kind "aio $aio mlock $ml fds $nfds"
    ;;
  8)
    kind=sigkill-supervisor
    "$FORK" run -- sleep 30 >/dev/null 2>"$tmp/err" &
    sup=$!
    for _ in $(seq 200); do pgrep -P "$sup" >/dev/null && break; sleep 0.01; done
    sleep 0.1
    kill -KILL "$sup"; wait "$sup" 2>/dev/null || true
    gc_json=$("$FORK" gc --json)
    reclaimed=$(python3 -c 'import json,sys; print(len(json.load(sys.stdin)["runs"]))' <<<"$gc_json")
    if [ "$reclaimed" != 1 ]; then
      # The killed supervisor's sandbox may still be dying: a second pass must finish it.
      echo "soak-leaks: run $i: first gc pass: $gc_json" >&2
      gc_second=$((gc_second + 1))
      sleep 0.5
      gc_json=$("$FORK" gc --json)
      reclaimed=$((reclaimed + $(python3 -c 'import json,sys; print(len(json.load(sys.stdin)["runs"]))' <<<"$gc_json")))
    fi
    [ "$reclaimed" = 1 ] || fail $kind "gc reclaimed $reclaimed runs: $gc_json"
    ;;
  10)
    kind=sigterm-supervisor
    "$FORK" run --report "$rep" -- sleep 30 >/dev/null 2>"$tmp/err" &
    sup=$!
    for _ in $(seq 200); do pgrep -P "$sup" >/dev/null && break; sleep 0.01; done
    sleep 0.05
    kill -TERM "$sup"; rc=0; wait "$sup" || rc=$?
    [ "$rc" = 137 ] || fail $kind "exit $rc"
    ;;
  11|15)
    kind=interrupted-evaluate
    "$FORK" evaluate fixtures/patches/noop-comment.diff --runtime "$tmp/rt" --task noop --policy "$human" \
        --no-ledger --out "$tmp/out/$i" >/dev/null 2>"$tmp/err" &
    ev=$!
    sleep "0.$(printf %02d $((RANDOM % 40)))"
    kill -TERM "$ev" 2>/dev/null || true
    rc=0; wait "$ev" || rc=$?
    case $rc in 0|130|143) ;; *) fail $kind "exit $rc" ;; esac
    ;;
  12)
    kind=needs-revision
    if [ $((i % 100)) = 12 ]; then
      rc=0; "$FORK" evaluate fixtures/patches/breaks-test.diff --runtime "$tmp/rt" --no-ledger \
          --out "$tmp/out/$i" >/dev/null 2>"$tmp/err" || rc=$?
      [ "$rc" = 2 ] || fail $kind "exit $rc"
    else
      kind=evaluate
      "$FORK" evaluate fixtures/patches/noop-comment.diff --runtime "$tmp/rt" --task noop --policy "$human" \
          --out "$tmp/out/$i" --no-cache >/dev/null 2>"$tmp/err" || fail $kind "exit $?"
    fi
    ;;
  14)
    if [ "$mesh" = yes ]; then
      kind=mesh-propose
      kill -0 "$nats_pid" 2>/dev/null || fail $kind "nats-server is gone"
      "$FORK" mesh propose fixtures/patches/noop-comment.diff --runtime "$tmp/rt" --task noop \
          --nats "nats://127.0.0.1:$port" --trust "$node_key" --min-nodes 1 --quorum 1/1 \
          --timeout 60s --out "$tmp/out/mesh-$i" >/dev/null 2>"$tmp/err" || fail $kind "exit $?"
      fds=$(ls "/proc/$serve_pid/fd" | wc -l)
      [ -z "$fds_first" ] && fds_first=$fds
      fds_last=$fds
    else
      kind=evaluate
      "$FORK" evaluate fixtures/patches/noop-comment.diff --runtime "$tmp/rt" --task noop --policy "$human" \
          --no-ledger --out "$tmp/out/$i" >/dev/null 2>"$tmp/err" || fail $kind "exit $?"
    fi
    ;;
  *)
    kind=run
    "$FORK" run -- true >/dev/null 2>"$tmp/err" || fail $kind "exit $?"
    ;;
  esac
  count[$kind]=$(( ${count[$kind]:-0} + 1 ))
  rm -rf "$tmp/out/$i" "$tmp/out/mesh-$i"
done
secs=$(( $(date +%s) - start ))

fds_note="no mesh node (nats-server missing)"
if [ "$mesh" = yes ]; then
  fds_note="fork mesh serve descriptors: $fds_first after its first proposal, $fds_last after its last"
  kill -TERM "$serve_pid"; wait "$serve_pid" 2>/dev/null || true; serve_pid=""
fi
dirs=$(find "$FORK_RUN_ROOT" "$tmp/node/runs" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
mounts=$(grep -c "$tmp" /proc/self/mountinfo || true)
# New fork-* cgroups: others' runs on this machine come and go; ours would stay.
new_cg=0
for _ in $(seq 40); do
  list_cgroups > "$tmp/cg.after"
  new_cg=$(comm -13 "$tmp/cg.before" "$tmp/cg.after" | wc -l)
  [ "$new_cg" = 0 ] && break
  sleep 0.25
done
procs=$(pgrep -f "^$FORK( |$)" | wc -l || true)

echo "---- summary (scripts/soak-leaks.sh $N) ----"
echo "runs: $N in ${secs}s"
for k in "${!count[@]}"; do echo "  $k: ${count[$k]}"; done | sort
echo "$fds_note"
echo "killed supervisors whose run needed a second fork gc pass: $gc_second"
echo "left behind: run dirs $dirs, mounts $mounts, cgroups $new_cg, processes of $FORK $procs"
ok=yes
[ "$dirs" = 0 ] && [ "$mounts" = 0 ] && [ "$new_cg" = 0 ] && [ "$procs" = 0 ] || ok=no
if [ "$mesh" = yes ] && [ -n "$fds_first" ] && [ "$fds_last" -gt $((fds_first + 2)) ]; then ok=no; fi
[ "$ok" = yes ] || { echo "soak-leaks: something was left behind" >&2; exit 1; }
