# Sourced by scripts/test.sh and .ci/run. The tests run binaries built into the target
# directory (fork itself, the hostile probe) INSIDE the sandbox, as its unprivileged uid and
# with a private /tmp: so the target directory must not be under /tmp and every directory
# above it must be searchable by others. When the checkout is somewhere else (say under
# /tmp or /root), build into a shared directory under /var/tmp instead.
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  _repo=$(pwd -P)
  _move=no
  case "$_repo/" in /tmp/*|/dev/shm/*|/run/*) _move=yes ;; esac
  _d=$_repo
  while [ "$_d" != "/" ]; do
    _p=$(stat -c %a "$_d" 2>/dev/null || echo 0)
    if [ $(( ${_p: -1} & 1 )) -eq 0 ]; then _move=yes; fi
    _d=$(dirname "$_d")
  done
  if [ "$_move" = yes ]; then
    CARGO_TARGET_DIR=/var/tmp/fork-target-$(printf '%s' "$_repo" | sha256sum | cut -c1-12)
    export CARGO_TARGET_DIR
    mkdir -p "$CARGO_TARGET_DIR"
    chmod 755 "$CARGO_TARGET_DIR"
    echo "scripts: building in $CARGO_TARGET_DIR (the checkout is not reachable from inside the sandbox)" >&2
  fi
  unset _repo _move _d _p
fi
