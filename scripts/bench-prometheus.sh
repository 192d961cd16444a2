#!/usr/bin/env bash
# gpuledger and Prometheus side by side on the same samples (docs/benchmarks.md): loads the
# benchmark fleet into gpuledger, writes the very samples it pushed as OpenMetrics, backfills
# them into a real Prometheus with promtool, starts that Prometheus on 127.0.0.1, then asks
# both the same team question over the history (GPU-hours, idle hours, average activity per
# team): gpuledger's `GET /api/v1/summary` and three PromQL instant queries, from the same
# client, and prints both p50 times, the ratio, and a per-team check that the answers agree
# (the run fails when they do not). Prometheus is stopped and the files removed at the end.
#
# Usage: scripts/bench-prometheus.sh [--gpus N] [--days D] [--requests N]
#   defaults: 2000 GPUs, 30 days, 10 timed requests per question after a warm-up.
# Needs: the gpuledger binary ($GPULEDGER_BIN, else target/release/gpuledger), Debian's
# `prometheus` package (prometheus and promtool on PATH) and curl.
set -euo pipefail
cd "$(dirname "$0")/.."

gpus=2000
days=30
requests=10
while (($#)); do
  case $1 in
    --gpus) gpus=$2; shift 2 ;;
    --days) days=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    *) echo "unknown argument $1; usage: $0 [--gpus N] [--days D] [--requests N]" >&2; exit 2 ;;
  esac
done

log() { printf '==> %s\n' "$*" >&2; }

bin=${GPULEDGER_BIN:-target/release/gpuledger}
[ -x "$bin" ] || { echo "no gpuledger binary at $bin: build it (cargo build --release -p gpuledger) or set GPULEDGER_BIN" >&2; exit 1; }
for tool in prometheus promtool curl; do
  command -v "$tool" >/dev/null || { echo "$tool is not on PATH: install Debian's prometheus package (and curl)" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/gpuledger-bench-prometheus.XXXXXX")
prom_pid=
cleanup() {
  if [ -n "$prom_pid" ]; then
    kill "$prom_pid" 2>/dev/null || true
    wait "$prom_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "$(prometheus --version 2>&1 | head -n 1); $(nproc) cores"

log "loading $gpus GPUs x $days days into gpuledger and writing the samples as OpenMetrics"
"$bin" bench --gpus "$gpus" --days "$days" --no-pages \
  --database-url "$work/gpuledger.db" --openmetrics "$work/samples.om"

log "backfilling Prometheus with promtool"
started=$(date +%s.%N)
# Blocks of up to 31 days: the largest Prometheus itself compacts to with a long retention,
# so the queries read what a Prometheus that had run the whole month would hold.
promtool tsdb create-blocks-from openmetrics --quiet --max-block-duration=744h \
  "$work/samples.om" "$work/prometheus" >/dev/null
echo "promtool backfill: $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $started }") s, \
$(du -sk "$work/prometheus" | cut -f1) KiB of blocks"
rm "$work/samples.om"

printf 'global:\n  scrape_interval: 1m\n' >"$work/prometheus.yml"
for _ in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 40000))
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue # taken
  log "starting Prometheus on 127.0.0.1:$port"
  prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prometheus" \
    --storage.tsdb.retention.time=10y --web.listen-address="127.0.0.1:$port" \
    >"$work/prometheus.log" 2>&1 &
  prom_pid=$!
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/-/ready" >/dev/null && break 2
    kill -0 "$prom_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill "$prom_pid" 2>/dev/null || true
  wait "$prom_pid" 2>/dev/null || true
  prom_pid=
done
if [ -z "$prom_pid" ]; then
  echo "Prometheus did not get ready; its log:" >&2
  cat "$work/prometheus.log" >&2
  exit 1
fi

log "asking gpuledger and Prometheus the same question, $requests times each"
"$bin" bench --gpus "$gpus" --days "$days" --no-load --no-pages --requests "$requests" \
  --database-url "$work/gpuledger.db" --prometheus "http://127.0.0.1:$port"
