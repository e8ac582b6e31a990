#!/usr/bin/env bash
# Stops the cluster deploy/up.sh started. Extra arguments go to `compose down`: `--volumes`
# also deletes every node's data. The keys in deploy/cluster/ are kept; delete that directory
# together with the volumes for a fresh cluster, never one without the other.
set -euo pipefail
cd "$(dirname "$0")/.."
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
else
  compose=(docker-compose)
fi
"${compose[@]}" --project-name bulwark --file deploy/compose.yaml down "$@"
