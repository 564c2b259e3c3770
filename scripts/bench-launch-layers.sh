#!/usr/bin/env bash
# What each isolation layer adds to a launch: `fork run -- /bin/true` with every layer (the
# built-in default policy, as in scripts/bench-launch.sh), the same policy read from a file
# (the baseline of the rows below), that file with one layer off at a time (netns, seccomp,
# landlock, the cgroups with the cgroup namespace that needs them, the capped disk), with
# the layers bwrap has no counterpart of all off (seccomp, Landlock, cgroups; the
# namespaces and the capped /tmp, fork's counterpart of bwrap's --tmpfs /tmp, stay), and
# bwrap itself with and without its network namespace, interleaved in one run (N rounds,
# default 100). Each fork variant is first run once with `--report`: its `isolation` block
# must show every namespace, the host root, and exactly the layers the variant claims to
# have on and off (the script stops otherwise, and prints `isolation ok: NAME` for each
# variant that passed), so a row never times a policy that silently kept a layer on or
# dropped another.
#
# Prints a table: each variant's median wall and CPU per launch, what the layer it turns
# off costs (the file baseline's median minus the variant's, and the median per-round
# ratio), and the built-in and bwrap-layers variants against bwrap. Run it as root; set
# FORK_BIN to time another fork binary (fork-init must be beside it). Needs bash 4.4+.
#
#   scripts/bench-launch-layers.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

n=${1:-100}
case $n in '' | *[!0-9]* | 0) echo "usage: $0 [N]   (N >= 1 rounds, default 100)" >&2; exit 64 ;; esac

need=(python3 bwrap:bubblewrap)
# shellcheck source=scripts/bench/common.sh
. "$root/scripts/bench/common.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fork-bench-layers.XXXXXX")
trap 'rm -rf "$tmp" "$installed"' EXIT
# The policies: the built-in one as a file (its seccomp profile beside it), then with layers off.
cp -r "$root/policies/seccomp" "$tmp/seccomp"
off() { # off NAME LAYER... : NAME.toml = the default policy with these layers off
  local name=$1
  shift
  local args=(-e '')
  for l in "$@"; do args+=(-e "s/^$l = \"required\"\$/$l = \"off\"/"); done
  sed "${args[@]}" "$root/policies/default.toml" >"$tmp/$name.toml"
}
off file
off no-netns netns
off no-seccomp seccomp
off no-landlock landlock
off no-cgroup cgroup cgroupns
off no-disk disk
off bwrap-layers seccomp landlock cgroup cgroupns

# Each variant once, its isolation block checked against what it claims.
check() { # check NAME EXPECT (python dict literal of isolation fields)
  local name=$1 expect=$2 policy=()
  [ "$name" = builtin ] || policy=(--policy "$tmp/$name.toml")
  "$fork" run "${policy[@]}" --report "$tmp/$name.json" -- /bin/true ||
    { echo "$0: '$fork run ${policy[*]} -- /bin/true' failed (run as root; see 'fork check')" >&2; exit 1; }
  python3 - "$tmp/$name.json" "$name" "$expect" <<'PY'
import ast, json, sys
iso = json.load(open(sys.argv[1]))["isolation"]
want = ast.literal_eval(sys.argv[3])
bad = {k: (iso.get(k), v) for k, v in want.items() if iso.get(k) != v}
if not want or bad:
    sys.exit(f"{sys.argv[2]}: the run's isolation is not what the variant claims "
             f"(field: (got, wanted)): {bad}")
print(f"isolation ok: {sys.argv[2]}")
PY
}
cg=v1
[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && cg=v2
# Landlock is fully enforced where the kernel has every right the policy asks for (ABI 6,
# Linux 6.12: the TCP rules and the scoping), partially on an older one; a run with the
# built-in policy tells which ABI this kernel has.
"$fork" run --report "$tmp/abi.json" -- /bin/true
ll=$(python3 -c "import json, sys
a = json.load(open(sys.argv[1]))['isolation']['landlock_abi'] or 0
print('fully_enforced' if a >= 6 else 'partially_enforced')" "$tmp/abi.json")
all="{'userns': True, 'pidns': True, 'mountns': True, 'ipcns': True, 'utsns': True, 'root': 'host', 'netns': True, 'seccomp': 'default', 'landlock_enforced': '$ll', 'cgroup': '$cg', 'cgroupns': True, 'disk': 'tmpfs'}"
with() { python3 -c "d = $all; d.update($1); print(repr(d))"; }
check builtin "$all"
check file "$all"
check no-netns "$(with "{'netns': False}")"
check no-seccomp "$(with "{'seccomp': None}")"
check no-landlock "$(with "{'landlock_enforced': None}")"
check no-cgroup "$(with "{'cgroup': None, 'cgroupns': False}")"
check no-disk "$(with "{'disk': None}")"
check bwrap-layers "$(with "{'seccomp': None, 'landlock_enforced': None, 'cgroup': None, 'cgroupns': False}")"
bwrap_cmd="bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev --tmpfs /tmp /bin/true"
bwrap_net="bwrap --unshare-all --share-net --ro-bind / / --proc /proc --dev /dev --tmpfs /tmp /bin/true"
$bwrap_cmd || { echo "$0: '$bwrap_cmd' failed" >&2; exit 1; }
$bwrap_net || { echo "$0: '$bwrap_net' failed" >&2; exit 1; }

echo "launch by layer: $n interleaved rounds on $(nproc) cores, kernel $(uname -r)"
q_fork=$(printf '%q' "$fork")
args=(builtin "$q_fork run -- /bin/true")
for v in file no-netns no-seccomp no-landlock no-cgroup no-disk bwrap-layers; do
  args+=("$v" "$q_fork run --policy $(printf '%q' "$tmp/$v.toml") -- /bin/true")
done
args+=(bwrap "$bwrap_cmd" bwrap-no-netns "$bwrap_net")
ratios=()
for v in no-netns no-seccomp no-landlock no-cgroup no-disk bwrap-layers; do ratios+=(--ratio "file/$v"); done
for v in builtin bwrap-layers; do ratios+=(--ratio "$v/bwrap"); done
ratios+=(--ratio bwrap/bwrap-no-netns)
python3 "$root/scripts/bench/interleave.py" --runs "$n" --warmup 5 "${ratios[@]}" -- "${args[@]}" |
  tee "$tmp/out"

python3 - "$tmp/out" "$n" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
names = ["builtin", "file", "no-netns", "no-seccomp", "no-landlock", "no-cgroup", "no-disk",
         "bwrap-layers", "bwrap", "bwrap-no-netns"]
# Longest first; a name is followed by blanks or "/" or ":" (bwrap, bwrap-layers, ...).
alt = "|".join(re.escape(x) for x in sorted(names, key=len, reverse=True))
wall = {m[0]: float(m[1]) for m in
        re.findall(rf"^\s+({alt})\s+([\d.]+)\s+[\d.]+\s+[\d.]+", t, re.M)}
cpu = {m[0]: float(m[1]) for m in re.findall(rf"^\s+cpu ({alt})\s+([\d.]+)", t, re.M)}
per_round = {(m[0], m[1]): float(m[2]) for m in re.findall(
    rf"ratio ({alt})/({alt}): [\d.]+ \(of medians\), ([\d.]+)", t)}
what = {"no-netns": "the network namespace", "no-seccomp": "seccomp",
        "no-landlock": "Landlock", "no-cgroup": "the cgroups (and cgroup namespace)",
        "no-disk": "the capped disk", "bwrap-layers": "seccomp + Landlock + cgroups"}
print()
print(f"---- summary (scripts/bench-launch-layers.sh {sys.argv[2]}) ----")
print(f"{'variant':<15} {'wall ms':>8} {'cpu ms':>7}  what the layer off costs a launch")
for k in names:
    line = f"{k:<15} {wall[k]:8.2f} {cpu[k]:7.2f}"
    if k in what:
        line += (f"  {what[k]}: {wall['file'] - wall[k]:+.2f} ms wall, "
                 f"{cpu['file'] - cpu[k]:+.2f} ms CPU ({per_round[('file', k)]:.2f}x per round)")
    elif k == "bwrap-no-netns":
        line += (f"  bwrap's network namespace: {wall['bwrap'] - wall[k]:+.2f} ms wall, "
                 f"{cpu['bwrap'] - cpu[k]:+.2f} ms CPU ({per_round[('bwrap', k)]:.2f}x per round)")
    print(line)
for k in ("builtin", "bwrap-layers"):
    print(f"{k}/bwrap {per_round[(k, 'bwrap')]:.2f}x wall (median per-round ratio)")
PY
