#!/usr/bin/env bash
# Per-push latency with SQLite synchronous NORMAL and FULL (docs/configuration.md, Durability):
# 300 one-sample pushes in turn over HTTP to a fresh database each.
#   scripts/bench-durability.sh [BIN]   (default ./target/release/gpuledger)
set -euo pipefail
BIN=${1:-./target/release/gpuledger}
W=$(mktemp -d)
for mode in normal full; do
  printf '[database]\nsqlite_synchronous = "%s"\n[ingest]\nrecords_per_sec = 0\n' $mode > $W/$mode.toml
  $BIN serve --database-url $W/$mode.db --config $W/$mode.toml --listen 127.0.0.1:0 > $W/$mode.out 2>$W/$mode.log &
  pid=$!
  for _ in $(seq 100); do grep -q serving $W/$mode.out 2>/dev/null && break; sleep 0.1; done
  url=$(sed -n 's/^gpuledger serving on //p' $W/$mode.out)
  tok=$($BIN token create --source s --database-url $W/$mode.db | tail -n 1)
  : > $W/$mode.t
  for i in $(seq 300); do
    now=$(date -u +%FT%TZ)
    curl -s -o /dev/null -w '%{time_total}\n' -X POST $url/api/v1/ingest -H "Authorization: Bearer $tok" \
      -d '{"gpus":[{"uuid":"GPU-00000000-0000-4000-8000-000000000001","model":"NVIDIA L4","observed_at":"'$now'"}],"samples":[{"gpu_uuid":"GPU-00000000-0000-4000-8000-000000000001","ts":"'$now'","util_pct":'$((i%100))'}]}' >> $W/$mode.t
  done
  kill $pid; wait $pid 2>/dev/null || true
  sort -n $W/$mode.t | awk -v m=$mode '{a[NR]=$1*1000} END {printf "%s: p50 %.2f ms, p95 %.2f ms, max %.2f ms (%d pushes)\n", m, a[int(NR*0.5)], a[int(NR*0.95)], a[NR], NR}'
done
rm -rf $W
