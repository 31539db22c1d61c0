#!/usr/bin/env bash
# Proves the Dockerfile's install path without a container engine:
#   1. copy only what .dockerignore admits into a temp build context,
#   2. `pip wheel -w wheels` there (our wheel plus every dependency's, like stage 1),
#   3. install into a fresh venv from those wheels only (--no-index, like stage 2),
#   4. run `stargate-router --help` (and `stargate-router demo` when router/demo/command.py exists)
#      from outside the source tree, with PYTHONDONTWRITEBYTECODE=1 and HOME unset, and
#      check that nothing was written into the install,
#   5. under the Rust router's chart's conditions (.ci/chart-conditions.sh, in fresh mount and
#      network namespaces): uid 1000, /, /tmp and the install read-only, the chart's command
#      `stargate-k8s-router`: the demo, then the chart's args unchanged (/livez 200).
# Needs PyPI for step 2 only, and root for step 5 (unshare, mount, setpriv: CI runs as root;
# IMAGE_SMOKE_SKIP_CHART=1 skips it, saying so). The [demo] extra is installed so the demo can run.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python="${PYTHON:-python3}"

echo "image-smoke: build context from .dockerignore's allowlist"
mkdir -p "$work/context"
for item in pyproject.toml setup.py README.md LICENSE router wire quic discovery; do
  if [[ -e "$repo/$item" ]]; then
    cp -r "$repo/$item" "$work/context/"
  fi
done
find "$work/context" -name __pycache__ -type d -prune -exec rm -rf {} +

echo "image-smoke: pip wheel (stage 1)"
"$python" -m pip wheel --quiet --disable-pip-version-check -w "$work/wheels" "$work/context[demo]"

echo "image-smoke: install wheels only into a fresh venv (stage 2)"
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-index --find-links="$work/wheels" "stargate-router[demo]"

if command -v cc >/dev/null 2>&1 && [[ "$(uname -s)" == Linux ]]; then
  echo "image-smoke: the wheel carries the C splice and the C TCP pump (a compiler was there)"
  (cd "$work" && env PYTHONDONTWRITEBYTECODE=1 "$work/venv/bin/python" -c \
    "from router.extensions import SPLICE_MODULE as m, is_built; raise SystemExit(0 if is_built(m) else m + ' missing')")
  (cd "$work" && env PYTHONDONTWRITEBYTECODE=1 "$work/venv/bin/python" -c \
    "from router.extensions import TCP_PUMP_MODULE as m, is_built; raise SystemExit(0 if is_built(m) else m + ' missing')")
  if [[ -f /usr/include/openssl/evp.h ]]; then
    echo "image-smoke: the wheel carries the C Initial protection (OpenSSL headers were there)"
    (cd "$work" && env PYTHONDONTWRITEBYTECODE=1 "$work/venv/bin/python" -c \
      "from router.extensions import INITIALS_MODULE as m, is_built; raise SystemExit(0 if is_built(m) else m + ' missing')")
  fi
fi

touch "$work/installed.marker"
sleep 1  # mtime granularity: anything written after the install is newer than the marker
run() {
  (cd "$work" && env -u HOME PYTHONDONTWRITEBYTECODE=1 timeout 300 "$work/venv/bin/stargate-router" "$@")
}

echo "image-smoke: stargate-router --help"
run --help >"$work/help.txt"
grep -q -- "--listen-addr" "$work/help.txt"

if [[ -f "$repo/router/demo/command.py" ]]; then
  echo "image-smoke: stargate-router demo"
  run demo
else
  echo "image-smoke: router/demo/command.py absent, demo skipped"
fi

written="$(find "$work/venv" -newer "$work/installed.marker" -type f | head -n 20)"
if [[ -n "$written" ]]; then
  echo "image-smoke: FAILED: files written into the install at runtime:" >&2
  echo "$written" >&2
  exit 1
fi
chart="$repo/tests/support/data/upstream-chart-backend-router.yaml"
echo "image-smoke: the Rust router's chart (${chart#"$repo"/}): its command and args"
"$work/venv/bin/python" - "$chart" >"$work/chart-args.txt" <<'PY'
import os, sys, yaml
(container,) = yaml.safe_load(open(sys.argv[1]))["spec"]["template"]["spec"]["containers"]
command = container["command"]
assert len(command) == 1 and os.path.basename(command[0]) == "stargate-k8s-router", command
print("\n".join(container["args"]))
PY
if [[ "${IMAGE_SMOKE_SKIP_CHART:-}" == 1 ]]; then
  echo "image-smoke: SKIPPED the chart's conditions (IMAGE_SMOKE_SKIP_CHART=1)"
elif [[ "$(id -u)" != 0 ]] || ! command -v unshare >/dev/null || ! command -v setpriv >/dev/null; then
  echo "image-smoke: FAILED: the chart's conditions need root, unshare and setpriv (CI runs as root;" \
    "IMAGE_SMOKE_SKIP_CHART=1 skips them)" >&2
  exit 1
else
  unshare --mount --net --propagation private bash "$repo/.ci/chart-conditions.sh" "$work" "$work/chart-args.txt"
fi
echo "image-smoke: OK"
