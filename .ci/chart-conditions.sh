#!/usr/bin/env bash
# The Rust router's chart's conditions, without a container engine: runs INSIDE fresh mount and
# network namespaces (.ci/image-smoke.sh starts it with `unshare --mount --net`), as root there.
#   1. the interpreter the venv uses is made reachable to uid 1000 (a prefix under a private
#      home such as pyenv's is bound into a world-readable tmpfs over that home; the image's
#      Python is in /usr/local, world-readable already),
#   2. /, /tmp and the install tree are made read-only (the chart: readOnlyRootFilesystem, no
#      /tmp volume); loopback comes up in the empty network namespace,
#   3. as uid 1000 (runAsUser 1000, no groups, no new privileges, HOME unset):
#      `stargate-k8s-router demo` (pods, router and calls, all in this process), then the
#      chart's command with its args unchanged (0.0.0.0:50071/50072/8080; no Kubernetes API
#      here): it must start, name its flags without effect, answer /livez 200 and /readyz 503.
# Usage: chart-conditions.sh WORK_DIR CHART_ARGS_FILE (the venv is WORK_DIR/venv).
set -euo pipefail

work="$1"
chart_args_file="$2"
venv="$work/venv"
uid=1000

prefix="$("$venv/bin/python" -c 'import os, sys; print(os.path.realpath(sys.base_prefix))')"
blocked=""
dir="$prefix"
while [[ "$dir" != "/" ]]; do  # the topmost ancestor others cannot enter
  if [[ "$(stat -c %A "$dir" | cut -c10)" != [xt] ]]; then blocked="$dir"; fi  # others' x (t: x + sticky)
  dir="$(dirname "$dir")"
done
if [[ -n "$blocked" ]]; then
  echo "chart-conditions: $prefix is under $blocked (closed to uid $uid): bound into a tmpfs over it"
  mkdir -p "$work/interpreter"
  mount --bind "$prefix" "$work/interpreter"
  mount -t tmpfs -o mode=0755 tmpfs "$blocked"
  mkdir -p "$prefix"
  mount --bind "$work/interpreter" "$prefix"
  mount -o remount,ro,bind "$prefix"
  mount -o remount,ro "$blocked"
fi

chmod 0755 "$work"  # mktemp -d made it 0700; the venv under it must be readable by uid 1000
mkdir -p "$work/scratch"
for dir in /tmp "$venv"; do  # /tmp first: binding it anew hides what is mounted below it
  mount --bind "$dir" "$dir"
  mount -o remount,ro,bind "$dir"
done
mount -o remount,ro,bind /
mount -t tmpfs -o mode=0700 tmpfs "$work/scratch"  # root's own, for the router's log: uid 1000 gets none
ip link set lo up

as_chart_user() {
  (cd / && setpriv --reuid "$uid" --regid "$uid" --clear-groups --no-new-privs \
    env -u HOME PYTHONDONTWRITEBYTECODE=1 timeout 120 "$@")
}

as_chart_user sh -c 'touch /tmp/probe 2>/dev/null' && { echo "chart-conditions: /tmp is writable" >&2; exit 1; }
[[ "$(as_chart_user id -u)" == "$uid" ]]

echo "chart-conditions: stargate-k8s-router demo as uid $uid, /, /tmp and the install read-only"
as_chart_user "$venv/bin/stargate-k8s-router" demo

echo "chart-conditions: the chart's command and args as uid $uid"
mapfile -t args <"$chart_args_file"
log="$work/scratch/chart-router.log"
as_chart_user "$venv/bin/stargate-k8s-router" "${args[@]}" 2>"$log" &
router=$!
probe() {  # GET path on the health port -> its status code
  "$venv/bin/python" - "$1" <<'PY'
import sys, urllib.error, urllib.request
try:
    print(urllib.request.urlopen(f"http://127.0.0.1:8080{sys.argv[1]}", timeout=2).status)
except urllib.error.HTTPError as err:
    print(err.code)
except OSError:
    print(0)
PY
}
for _ in $(seq 100); do
  [[ "$(probe /livez)" == 200 ]] && break
  kill -0 "$router" 2>/dev/null || break
  sleep 0.1
done
status_livez="$(probe /livez)"
status_readyz="$(probe /readyz)"
kill -TERM "$router" 2>/dev/null || true
wait "$router" || true
cat "$log" >&2
if [[ "$status_livez" != 200 || "$status_readyz" != 503 ]]; then
  echo "chart-conditions: FAILED: /livez $status_livez (want 200), /readyz $status_readyz (want 503: no API)" >&2
  exit 1
fi
grep -q "flags with no effect at L4: --tls-cert-path, --tls-key-path, --quic-insecure" "$log" || {
  echo "chart-conditions: FAILED: the start output does not name the chart's flags without effect" >&2
  exit 1
}
echo "chart-conditions: OK"
