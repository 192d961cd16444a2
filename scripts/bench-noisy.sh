#!/usr/bin/env bash
# One noisy source and a quiet one: how much the first slows the second's pushes, with the
# per-source rate limit off and on (docs/benchmarks.md). Loopback only; prints a table.
#
#   scripts/bench-noisy.sh [--secs 30] [--bin ./target/release/gpuledger]
#
# The noisy source pushes bodies of 20,000 records (500 GPUs, 39 samples each) from two
# clients, each sending the next as soon as the last is answered; the quiet one pushes one GPU
# and one sample every 200 ms and its latencies are reported.
set -euo pipefail

secs=30
bin=./target/release/gpuledger
while [ $# -gt 0 ]; do
  case "$1" in
    --secs) secs=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
for tool in curl python3; do
  command -v "$tool" >/dev/null || { echo "bench-noisy: $tool is needed" >&2; exit 1; }
done
[ -x "$bin" ] || { echo "bench-noisy: build first: cargo build --release -p gpuledger" >&2; exit 1; }

work=$(mktemp -d)
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null || true
  jobs -p | xargs -r kill 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The noisy body: 500 GPUs, each with 39 samples in the last hours (times computed now).
python3 - "$work/noisy.json" <<'PY'
import json, sys, datetime
now = datetime.datetime.now(datetime.timezone.utc).replace(second=0, microsecond=0)
ts = lambda m: (now - datetime.timedelta(minutes=m)).strftime("%Y-%m-%dT%H:%M:%SZ")
gpus, samples = [], []
for g in range(500):
    uuid = f"GPU-00000000-0000-4000-8000-{g:012d}"
    gpus.append({"uuid": uuid, "model": "NVIDIA H100 80GB HBM3", "host": f"noisy-{g // 8}",
                 "labels": {"team": "noisy"}, "observed_at": ts(0)})
    samples += [{"gpu_uuid": uuid, "ts": ts(5 * i), "util_pct": (g + i) % 100} for i in range(39)]
json.dump({"gpus": gpus, "samples": samples}, open(sys.argv[1], "w"))
PY

run() { # $1: label, $2: records_per_sec, $3: noisy clients
  local label=$1 tag=${1// /-}
  tag=${tag//,/}
  set -- "$tag" "$2" "$3"
  local db="$work/$1.db"
  cat > "$work/$1.toml" <<EOF
[ingest]
records_per_sec = $2
EOF
  "$bin" serve --database-url "$db" --config "$work/$1.toml" --listen 127.0.0.1:0 \
    > "$work/$1.out" 2> "$work/$1.log" &
  server=$!
  for _ in $(seq 100); do grep -q serving "$work/$1.out" 2>/dev/null && break; sleep 0.1; done
  local url
  url=$(sed -n 's/^gpuledger serving on //p' "$work/$1.out")
  local noisy quiet
  noisy=$("$bin" token create --source noisy --database-url "$db" | tail -n 1)
  quiet=$("$bin" token create --source quiet --database-url "$db" | tail -n 1)
  local end=$((SECONDS + secs)) pids=() c
  : > "$work/$1.noisy.1"; : > "$work/$1.noisy.2"
  for c in $(seq "$3"); do
    (while [ $SECONDS -lt $end ]; do
       curl -s -o /dev/null -w '%{http_code}\n' -X POST "$url/api/v1/ingest" \
         -H "Authorization: Bearer $noisy" -H 'Content-Type: application/json' \
         --data-binary "@$work/noisy.json" || echo 000
     done > "$work/$1.noisy.$c") &
    pids+=($!)
  done
  : > "$work/$1.quiet"
  while [ $SECONDS -lt $end ]; do
    now=$(date -u +%FT%TZ)
    curl -s -o /dev/null -w '%{http_code} %{time_total}\n' -X POST "$url/api/v1/ingest" \
      -H "Authorization: Bearer $quiet" -H 'Content-Type: application/json' \
      -d '{"gpus":[{"uuid":"GPU-11111111-0000-4000-8000-000000000001","model":"NVIDIA L4","host":"quiet-1","observed_at":"'"$now"'"}],"samples":[{"gpu_uuid":"GPU-11111111-0000-4000-8000-000000000001","ts":"'"$now"'","util_pct":50}]}' \
      >> "$work/$1.quiet" || true
    sleep 0.2
  done
  [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}" 2>/dev/null || true
  kill "$server"; wait "$server" 2>/dev/null || true; server=
  python3 - "$label" "$2" "$work/$1.quiet" "$work/$1.noisy.1" "$work/$1.noisy.2" "$secs" <<'PY'
import sys
label, rate, quiet, n1, n2, secs = sys.argv[1:]
q = [l.split() for l in open(quiet) if l.strip()]
ok = sorted(float(t) * 1000 for s, t in q if s == "200")
bad = sum(1 for s, _ in q if s != "200")
codes = {}
for f in (n1, n2):
    for l in open(f):
        codes[l.strip()] = codes.get(l.strip(), 0) + 1
pct = lambda p: ok[min(len(ok) - 1, int(p * len(ok)))] if ok else float("nan")
stored = codes.get("200", 0)
print(f"| {label} | {pct(0.5):.1f} | {pct(0.95):.1f} | "
      f"{ok[-1] if ok else float('nan'):.1f} | {len(ok)} ({bad} not 200) | {stored} ({stored * 20000 / float(secs):,.0f} records/s) | "
      f"{codes.get('429', 0)} |")
PY
}

echo "| run | quiet p50 ms | quiet p95 ms | quiet max ms | quiet pushes | noisy bodies stored | noisy 429s |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
run "quiet alone" 0 0
run "noisy, no limit" 0 2
run "noisy, default limit" 10000 2
