#!/usr/bin/env bash
# Starts the 4-node cluster of deploy/compose.yaml: builds the static `bulwark` and the production
# image, writes deploy/cluster/ (cluster.toml and every party's secrets) on first use, starts the
# containers and waits until a quorum answers. Running it again rebuilds and restarts the nodes;
# the keys in deploy/cluster/ and the data in the named volumes are kept. Stop with deploy/down.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-unknown-linux-gnu
bin="${CARGO_TARGET_DIR:-target}/$target/release"

if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
else
  compose=(docker-compose)
fi

echo "== static build (first time: a few minutes on 2 cores)"
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --release --locked --target "$target" --bins

echo "== image bulwark:local (FROM scratch, the bulwark binary only)"
context="${CARGO_TARGET_DIR:-target}/docker/bulwark"
rm -rf "$context"
mkdir -p "$context"
cp "$bin/bulwark" "$context/bulwark"
docker build --quiet --tag bulwark:local --file deploy/Dockerfile "$context"

if [ ! -f deploy/cluster/cluster.toml ]; then
  echo "== new cluster in deploy/cluster/ (f = 1, nodes at 127.0.0.1:7100-7103)"
  "$bin/bulwark" cluster init --dir deploy/cluster --f 1 \
    --host 127.0.0.1 --base-port 7100 --metrics-base-port 9100
fi

echo "== starting"
"${compose[@]}" --project-name bulwark --file deploy/compose.yaml up --detach

for _ in $(seq 1 30); do
  if "$bin/bulwark" status --cluster deploy/cluster --timeout 2 >/dev/null 2>&1; then
    "$bin/bulwark" status --cluster deploy/cluster
    cat <<USAGE

Ready. From this host:
  $bin/bulwark put greeting --cluster deploy/cluster <<< hello
  $bin/bulwark get greeting --cluster deploy/cluster
  (or: export BULWARK_CLUSTER=\$PWD/deploy/cluster)
Metrics: http://127.0.0.1:9100/metrics (node 0) to :9103 (node 3). Logs: ${compose[*]} -p bulwark -f deploy/compose.yaml logs
Stop: deploy/down.sh (keeps data), deploy/down.sh --volumes (deletes it).
USAGE
    exit 0
  fi
  sleep 1
done
echo "error: the cluster did not answer within 30 s; its logs:" >&2
"${compose[@]}" --project-name bulwark --file deploy/compose.yaml logs --tail 20 >&2
exit 1
