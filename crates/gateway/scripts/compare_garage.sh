#!/usr/bin/env bash
# PUT and GET throughput of the Bulwark gateway beside Garage 2.5 (one node, and three nodes
# with three replicas) and moto, one boto3 client on loopback, the systems taking turns round
# after round (s3_bench.py: 1 MiB and 64 MiB, one request at a time). A benchmark, never run in
# CI; docs/benchmarks.md has its results.
#
#   crates/gateway/scripts/compare_garage.sh [ROUNDS] [SECONDS_PER_SIZE]
#
# Builds what it lacks: Garage from crates.io (`cargo install garage --version 2.5.0`, about 10
# minutes on two cores) into $TOOLS (default target/bench-tools), the release `bulwark`, and the
# Python tools of tests/s3 (boto3, moto) in target/s3-venv. Everything it starts listens on
# 127.0.0.1 and is stopped when it ends, however it ends.
set -euo pipefail

ROUNDS=${1:-3}
SECONDS_PER=${2:-6}
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
TOOLS=${TOOLS:-$REPO/target/bench-tools}
WORK=$(mktemp -d -t bulwark-garage-compare.XXXXXX)
VENV=${BULWARK_S3_VENV:-$REPO/target/s3-venv}
GARAGE=$TOOLS/garage/bin/garage
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

[[ -x $GARAGE ]] || cargo install garage --version 2.5.0 --locked --root "$TOOLS/garage"
(cd "$REPO" && cargo build --release --bins)
if [[ ! -x $VENV/bin/moto_server ]]; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet -r "$REPO/tests/s3/requirements.txt"
fi
BULWARK=$REPO/target/release/bulwark
PY=$VENV/bin/python
BENCH=$REPO/crates/gateway/scripts/s3_bench.py

wait_port() {
  for _ in $(seq 1 200); do
    (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2
  return 1
}

# ---- Bulwark: `bulwark dev` (four nodes, f = 1) and the gateway in front of it.
"$BULWARK" dev --dir "$WORK/bulwark" >"$WORK/dev.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 600); do
  grep -q "Press Ctrl-C to stop" "$WORK/dev.log" 2>/dev/null && break
  sleep 0.2
done
grep -q "Press Ctrl-C to stop" "$WORK/dev.log" || { cat "$WORK/dev.log" >&2; exit 1; }
"$BULWARK" gateway --cluster "$WORK/bulwark" --listen 127.0.0.1:9500 \
  --access-key bench --secret-key bench-secret >"$WORK/gateway.log" 2>&1 &
PIDS+=($!)
wait_port 9500

# ---- moto.
"$VENV/bin/moto_server" -H 127.0.0.1 -p 9510 >"$WORK/moto.log" 2>&1 &
PIDS+=($!)
wait_port 9510

# ---- Garage: one node, and three nodes with three replicas.
GARAGE_KEY=GK0123456789abcdef01234567
GARAGE_SECRET=$(printf '5%.0s' $(seq 1 64))
RPC_SECRET=$(printf 'a%.0s' $(seq 1 64))
garage_config() { # name s3-port rpc-port admin-port replicas
  mkdir -p "$WORK/$1/meta" "$WORK/$1/data"
  cat >"$WORK/$1.toml" <<EOF
metadata_dir = "$WORK/$1/meta"
data_dir = "$WORK/$1/data"
db_engine = "lmdb"
replication_factor = $5
rpc_bind_addr = "127.0.0.1:$3"
rpc_public_addr = "127.0.0.1:$3"
rpc_secret = "$RPC_SECRET"
[s3_api]
s3_region = "us-east-1"
api_bind_addr = "127.0.0.1:$2"
[admin]
api_bind_addr = "127.0.0.1:$4"
EOF
  "$GARAGE" -c "$WORK/$1.toml" server >"$WORK/$1.log" 2>&1 &
  PIDS+=($!)
  wait_port "$3"
}
garage_node_id() { "$GARAGE" -c "$WORK/$1.toml" node id -q; }
garage_layout() { # config-name node-ids...
  local config=$1; shift
  for node in "$@"; do
    "$GARAGE" -c "$WORK/$config.toml" layout assign -z dc1 -c 10G "${node%@*}" >/dev/null
  done
  "$GARAGE" -c "$WORK/$config.toml" layout apply --version 1 >/dev/null
  "$GARAGE" -c "$WORK/$config.toml" key import --yes -n bench "$GARAGE_KEY" "$GARAGE_SECRET" >/dev/null
  "$GARAGE" -c "$WORK/$config.toml" key allow --create-bucket bench >/dev/null
}

garage_config garage1 9520 9521 9522 1
garage_layout garage1 "$(garage_node_id garage1)"
wait_port 9520

garage_config garage3a 9530 9531 9532 3
garage_config garage3b 9540 9541 9542 3
garage_config garage3c 9550 9551 9552 3
ids=("$(garage_node_id garage3a)" "$(garage_node_id garage3b)" "$(garage_node_id garage3c)")
"$GARAGE" -c "$WORK/garage3a.toml" node connect "${ids[1]}" >/dev/null
"$GARAGE" -c "$WORK/garage3a.toml" node connect "${ids[2]}" >/dev/null
sleep 2
garage_layout garage3a "${ids[@]}"
wait_port 9530
sleep 2

run() { # label endpoint access secret
  "$PY" "$BENCH" --endpoint "$2" --access-key "$3" --secret-key "$4" \
    --seconds "$SECONDS_PER" --sizes 1,64 --label "$1"
}
echo "# rounds=$ROUNDS seconds-per-size=$SECONDS_PER"
for round in $(seq 1 "$ROUNDS"); do
  echo "# round $round"
  run bulwark http://127.0.0.1:9500 bench bench-secret
  run garage-1 http://127.0.0.1:9520 "$GARAGE_KEY" "$GARAGE_SECRET"
  run garage-3 http://127.0.0.1:9530 "$GARAGE_KEY" "$GARAGE_SECRET"
  run moto http://127.0.0.1:9510 testing testing
done
