#!/usr/bin/env bash
# S3 compatibility suite for `bulwark gateway` (see tests/s3/README.md).
#
#   tests/s3/run.sh --endpoint http://127.0.0.1:PORT --access-key AK --secret-key SK \
#                   [--region us-east-1] [--max-object-bytes N] [pytest args...]
#   tests/s3/run.sh --against-moto [pytest args...]      # validates the suite itself
#
# Installs what it needs (a pinned venv, rclone from Debian) idempotently and without stdin,
# then runs pytest on tests/s3/test_*.py. The exit code is pytest's.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${BULWARK_S3_VENV:-$REPO/target/s3-venv}"
PYTHON="${PYTHON:-python3}"

die() { echo "tests/s3/run.sh: $*" >&2; exit 2; }

usage() {
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
}

ENDPOINT="${S3_ENDPOINT:-}"
ACCESS_KEY="${S3_ACCESS_KEY:-}"
SECRET_KEY="${S3_SECRET_KEY:-}"
REGION="${S3_REGION:-us-east-1}"
MAX_OBJECT_BYTES="${S3_MAX_OBJECT_BYTES:-}"
AGAINST_MOTO=0
PYTEST_ARGS=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --endpoint) ENDPOINT="${2:?--endpoint needs a value}"; shift 2 ;;
    --endpoint=*) ENDPOINT="${1#*=}"; shift ;;
    --access-key) ACCESS_KEY="${2:?--access-key needs a value}"; shift 2 ;;
    --access-key=*) ACCESS_KEY="${1#*=}"; shift ;;
    --secret-key) SECRET_KEY="${2:?--secret-key needs a value}"; shift 2 ;;
    --secret-key=*) SECRET_KEY="${1#*=}"; shift ;;
    --region) REGION="${2:?--region needs a value}"; shift 2 ;;
    --region=*) REGION="${1#*=}"; shift ;;
    --max-object-bytes) MAX_OBJECT_BYTES="${2:?--max-object-bytes needs a value}"; shift 2 ;;
    --max-object-bytes=*) MAX_OBJECT_BYTES="${1#*=}"; shift ;;
    --against-moto) AGAINST_MOTO=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; PYTEST_ARGS+=("$@"); break ;;
    *) PYTEST_ARGS+=("$1"); shift ;;
  esac
done

# ---------------------------------------------------------------- install (idempotent, no stdin)
ensure_venv() {
  local stamp="$VENV/.bulwark-s3-stamp" want
  want="$(cat "$HERE/requirements.txt"; "$PYTHON" -c 'import sys; print(sys.version)')"
  if [[ -x "$VENV/bin/python" && -f "$stamp" ]] && [[ "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  echo "== tests/s3: installing the pinned Python environment into $VENV"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV" </dev/null \
    || die "could not create a venv with '$PYTHON -m venv' (on Debian: apt-get install -y python3-venv)"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    -r "$HERE/requirements.txt" </dev/null \
    || die "pip install -r tests/s3/requirements.txt failed"
  printf '%s' "$want" >"$stamp"
}

ensure_rclone() {
  command -v rclone >/dev/null 2>&1 && return 0
  echo "== tests/s3: rclone is missing; installing it from Debian"
  local sudo=()
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      die "rclone is not installed and this user can neither apt-get install (not root) nor sudo without a password. Install it: apt-get install -y rclone"
    fi
  fi
  if ! { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null \
         && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rclone </dev/null; }; then
    die "apt-get could not install rclone; the rclone smoke test needs it (apt-get install -y rclone)"
  fi
  command -v rclone >/dev/null 2>&1 || die "apt-get reported success but rclone is still not on PATH"
}

# Several runs may start at once (the gateway tests run side by side): one installs, the others
# wait for it, and none removes a venv another is using.
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
ensure_venv
ensure_rclone
flock -u 9

# ---------------------------------------------------------------- moto (self-validation)
MOTO_PID=""
# shellcheck disable=SC2317  # invoked through trap
cleanup() {
  local rc=$?
  if [[ -n "$MOTO_PID" ]]; then
    kill "$MOTO_PID" 2>/dev/null || true
    wait "$MOTO_PID" 2>/dev/null || true
  fi
  if [[ -n "${MOTO_LOG:-}" ]]; then
    if [[ "$rc" == 0 ]]; then rm -f "$MOTO_LOG"; else echo "== tests/s3: moto_server log kept: $MOTO_LOG" >&2; fi
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ "$AGAINST_MOTO" == 1 ]]; then
  PORT="$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
  MOTO_LOG="$(mktemp -t bulwark-moto.XXXXXX.log)"
  echo "== tests/s3: starting moto_server on 127.0.0.1:$PORT (log: $MOTO_LOG)"
  "$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" </dev/null >"$MOTO_LOG" 2>&1 &
  MOTO_PID=$!
  for _ in $(seq 1 100); do
    if "$VENV/bin/python" - "$PORT" <<'EOF' 2>/dev/null; then break; fi
import socket, sys
socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=0.5).close()
EOF
    kill -0 "$MOTO_PID" 2>/dev/null || { cat "$MOTO_LOG" >&2; die "moto_server exited during start-up"; }
    sleep 0.2
  done
  ENDPOINT="http://127.0.0.1:$PORT"
  ACCESS_KEY="${ACCESS_KEY:-testing}"
  SECRET_KEY="${SECRET_KEY:-testing}"
  export S3_TARGET=moto
fi

[[ -n "$ENDPOINT" ]] || { usage >&2; die "--endpoint (or --against-moto) is required"; }
[[ -n "$ACCESS_KEY" && -n "$SECRET_KEY" ]] || die "--access-key and --secret-key are required"

# Fail fast and clearly when nothing listens at the endpoint (waits up to S3_WAIT_SECONDS, 30).
if ! "$VENV/bin/python" - "$ENDPOINT" "${S3_WAIT_SECONDS:-30}" <<'EOF'; then
import socket, sys, time, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
port = u.port or (443 if u.scheme == "https" else 80)
deadline = time.monotonic() + float(sys.argv[2])
while True:
    try:
        socket.create_connection((u.hostname, port), timeout=2).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.5)
EOF
  die "nothing accepts connections at $ENDPOINT"
fi

export S3_ENDPOINT="$ENDPOINT" S3_ACCESS_KEY="$ACCESS_KEY" S3_SECRET_KEY="$SECRET_KEY" S3_REGION="$REGION"
if [[ -n "$MAX_OBJECT_BYTES" ]]; then export S3_MAX_OBJECT_BYTES="$MAX_OBJECT_BYTES"; fi
export PATH="$VENV/bin:$PATH"
export PYTHONDONTWRITEBYTECODE=1

echo "== tests/s3: endpoint $S3_ENDPOINT region $S3_REGION target ${S3_TARGET:-gateway}"
# The whole suite unless the caller named test files or node ids (relative to the caller's cwd).
TARGETS=("$HERE")
for a in ${PYTEST_ARGS[@]+"${PYTEST_ARGS[@]}"}; do
  case "$a" in *.py|*.py::*) TARGETS=() ;; esac
done
set +e
"$VENV/bin/python" -m pytest -c "$HERE/pytest.ini" --rootdir "$HERE" \
  ${TARGETS[@]+"${TARGETS[@]}"} ${PYTEST_ARGS[@]+"${PYTEST_ARGS[@]}"} </dev/null
rc=$?
set -e
exit "$rc"
