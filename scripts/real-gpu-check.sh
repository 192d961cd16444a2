#!/usr/bin/env bash
# The agent against a real NVIDIA GPU, end to end: what NVML and nvidia-smi say, what the agent
# would send through each of its NVIDIA readers, then a server on 127.0.0.1 with the agent
# pushing every 5 s while a matrix-multiply load runs on the GPU for a while, and what the API
# then holds. Everything it saw goes to OUT_DIR (default ./real-gpu-check): nvidia-smi's outputs,
# the agent's bodies and logs, the API's answers and the agent's footprint.
#
#   scripts/real-gpu-check.sh [BIN_DIR] [OUT_DIR]
#
# BIN_DIR holds `gpuledger` and `gpuledger-agent` (default target/release). Needs a GPU, its
# driver and nvidia-smi; the load needs python3 with PyTorch (skipped, and said, without it).
set -u
BIN=${1:-target/release}
OUT_DIR=${2:-./real-gpu-check}
mkdir -p "$OUT_DIR"
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
say() { printf '\n=== %s\n' "$*"; }
# GET a URL to stdout: curl where it is installed, else Python's standard library.
get() {
    if command -v curl > /dev/null; then
        curl -fsS "$1"
    else
        python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' "$1"
    fi
}

say "host"
uname -a
nvidia-smi --version 2>&1 | head -5

say "nvidia-smi, -L, -q -x and the CSV query"
nvidia-smi > "$OUT_DIR/nvidia-smi.txt" 2>&1
cat "$OUT_DIR/nvidia-smi.txt"
nvidia-smi -L 2>&1 | tee "$OUT_DIR/nvidia-smi-L.txt"
nvidia-smi -q -x > "$OUT_DIR/nvidia-smi-q.xml" 2>&1
echo "nvidia-smi -q -x: $(wc -c < "$OUT_DIR/nvidia-smi-q.xml") bytes"
nvidia-smi --query-gpu=uuid,name,serial,pci.bus_id,memory.total,memory.used,utilization.gpu,power.draw,mig.mode.current,driver_version \
    --format=csv > "$OUT_DIR/nvidia-smi-query.csv" 2>&1
cat "$OUT_DIR/nvidia-smi-query.csv"

say "the agent's body through each NVIDIA reader (--once --dry-run)"
for src in nvml smi-xml smi-csv auto; do
    start=$(date +%s%N)
    GPULEDGER_LOG=debug "$BIN/gpuledger-agent" --once --dry-run --no-cloud-metadata --source "$src" \
        > "$OUT_DIR/agent-$src.json" 2> "$OUT_DIR/agent-$src.log"
    rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    echo "source $src: exit $rc in $ms ms, $(wc -c < "$OUT_DIR/agent-$src.json") bytes of JSON"
    head -c 3000 "$OUT_DIR/agent-$src.json"; echo
    tail -5 "$OUT_DIR/agent-$src.log"
done

say "server, token, agent pushing every 5 s, GPU load in the middle"
db="$work/g.db"
"$BIN/gpuledger" serve --database-url "$db" --listen 127.0.0.1:18080 > "$OUT_DIR/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do
    get http://127.0.0.1:18080/healthz > /dev/null 2>&1 && break
    sleep 0.2
done
token=$(GPULEDGER_DATABASE_URL="$db" "$BIN/gpuledger" token create --source real-gpu --team ml-research | tail -1)
GPULEDGER_LOG=debug "$BIN/gpuledger-agent" --server http://127.0.0.1:18080 --token "$token" \
    --interval-secs 5 --no-cloud-metadata --buffer-dir "$work/buffer" --cluster bench-h200 \
    --label team=ml-research --label env=dev > "$OUT_DIR/agent-push.log" 2>&1 &
agent=$!
pids+=($agent)
sleep 20
if python3 -c 'import torch; assert torch.cuda.is_available()' 2> /dev/null; then
    echo "load: bf16 8192^3 matrix products for 40 s"
    python3 - <<'EOF' > "$OUT_DIR/load.log" 2>&1
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t = time.time(); n = 0
while time.time() - t < 40:
    a @ a; n += 1
torch.cuda.synchronize()
print(f"{n} products in {time.time() - t:.1f} s")
EOF
    cat "$OUT_DIR/load.log"
else
    echo "load: skipped (no python3 with PyTorch and CUDA)"
fi
sleep 20
echo "agent footprint (rss KiB, cpu time):"
ps -o rss=,time= -p "$agent" | tee "$OUT_DIR/agent-footprint.txt"
grep -c "delivered\|sent" "$OUT_DIR/agent-push.log" || true
tail -20 "$OUT_DIR/agent-push.log"

say "what the API holds"
get http://127.0.0.1:18080/api/v1/gpus > "$OUT_DIR/api-gpus.json"
head -c 4000 "$OUT_DIR/api-gpus.json"; echo
for uuid in $(grep -o '"uuid":"GPU-[^"]*"' "$OUT_DIR/api-gpus.json" | cut -d'"' -f4 | sort -u); do
    get "http://127.0.0.1:18080/api/v1/gpus/$uuid?range=1d" > "$OUT_DIR/api-gpu-$uuid.json"
    head -c 6000 "$OUT_DIR/api-gpu-$uuid.json"; echo
done
get "http://127.0.0.1:18080/api/v1/summary?group_by=team&range=1d" | tee "$OUT_DIR/api-summary.json"; echo
get http://127.0.0.1:18080/api/v1/sources | tee "$OUT_DIR/api-sources.json"; echo
echo "overview page: $(get http://127.0.0.1:18080/ | wc -c) bytes"
