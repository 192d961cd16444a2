#!/usr/bin/env bash
# Memory and time of the release gpuledger-agent replaying a long backlog: DAYS days of an
# 8-GPU host read every 60 s (generated into a temporary buffer directory, just under the 64 MiB
# default cap for 30 days), sent with `--once` to a local sink that answers like the ingest
# endpoint. Shows that memory stays flat whatever the backlog.
#
#   crates/agent/bench/replay.sh [DAYS=30]
#
# Needs: cargo, python3, GNU time (/usr/bin/time), the corpus ($GPULEDGER_CORPUS or
# ../shared/fixtures) for the one live read. A benchmark: it prints figures, asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/../../.."

days=${1:-30}
corpus=${GPULEDGER_CORPUS:-$(cd .. && pwd)/shared/fixtures}
xml=$corpus/nvidia-smi/tesla-t4.xml
[ -f "$xml" ] || { echo "corpus file $xml not found; set GPULEDGER_CORPUS" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "needs GNU time: apt-get install time" >&2; exit 1; }

cargo build --release -q -p gpuledger-agent
bin=target/release/gpuledger-agent

work=$(mktemp -d)
sink_pid=""
cleanup() {
  [ -n "$sink_pid" ] && kill "$sink_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The backlog, in the buffer's own format: one compact JSON body per file, named by sequence
# number; inventory every 10th body, as the agent sends it.
python3 - "$work/buf" "$days" <<'PY'
import datetime, json, os, sys
buf, days = sys.argv[1], int(sys.argv[2])
os.makedirs(buf)
start = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) - datetime.timedelta(days=days)
uuids = ["GPU-d37e67a5-91dd-3774-a5cb-9909624960%02d" % i for i in range(8)]
total = 0
for k in range(days * 1440):
    ts = (start + datetime.timedelta(minutes=k)).strftime('%Y-%m-%dT%H:%M:%SZ')
    body = {"samples": [{"gpu_uuid": u, "ts": ts, "util_pct": float(k % 101),
                         "mem_used_mib": 1032.0, "power_w": 26.78} for u in uuids]}
    if k % 10 == 0:
        body["gpus"] = [{"uuid": u, "model": "Tesla T4", "memory_mib": 15360, "host": "bench",
                         "pci_bus_id": "00000000:%02X:00.0" % (16 + i),
                         "labels": {"driver_version": "515.105.01"}, "observed_at": ts}
                        for i, u in enumerate(uuids)]
    text = json.dumps(body, separators=(',', ':'))
    total += len(text)
    with open(os.path.join(buf, '%020d.json' % ((1 << 40) + k)), 'w') as f:
        f.write(text)
print("backlog: %d bodies, %d samples, %.1f MiB" % (days * 1440, days * 1440 * 8, total / 2**20))
PY

python3 crates/agent/bench/sink.py "$work" &
sink_pid=$!
for _ in $(seq 1 50); do [ -s "$work/port" ] && break; sleep 0.1; done

mkdir -p "$work/bin"
printf '#!/bin/sh\n[ "$1" = -q ] && exec cat "%s"\nexit 9\n' "$xml" > "$work/bin/nvidia-smi"
chmod +x "$work/bin/nvidia-smi"

PATH="$work/bin:$PATH" GPULEDGER_LOG=warn /usr/bin/time -f "replayed with --once: peak RSS %M KiB, %e s wall, %U s user + %S s system CPU" \
  "$bin" --once --no-processes --server "http://127.0.0.1:$(cat "$work/port")" --token bench \
  --buffer-dir "$work/buf"
left=$(find "$work/buf" -name '*.json' ! -name 'open-allocations.json' | wc -l)
echo "requests: $(wc -l < "$work/posts"), bodies left in the buffer: $left"
