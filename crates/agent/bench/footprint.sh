#!/usr/bin/env bash
# Footprint of the release gpuledger-agent reporting 8 GPUs: memory (VmRSS, VmHWM) and CPU time
# from /proc, over a run of DURATION_SECS at INTERVAL_SECS.
#
#   crates/agent/bench/footprint.sh [INTERVAL_SECS=60] [DURATION_SECS=600] [VENDOR=nvidia]
#
# The GPUs come from a fake nvidia-smi that prints the corpus Tesla T4 `-q -x` file repeated as
# 8 GPUs with distinct UUIDs (generated into a temporary directory here; nothing is committed).
# VENDOR=amd: a fake rocm-smi printing the corpus 6 x MI100 file (no nvidia-smi, no amd-smi);
# VENDOR=gaudi: a fake hl-smi printing the corpus 8 x Gaudi 2 table (its -Q query refused).
# The agent sends to a small local HTTP sink that answers like gpuledger's ingest, so only the
# agent is measured. Needs: cargo, python3, the corpus ($GPULEDGER_CORPUS or ../shared/fixtures).
# A benchmark, not a test: it prints figures and asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/../../.."

interval=${1:-60}
duration=${2:-600}
vendor=${3:-nvidia}
corpus=${GPULEDGER_CORPUS:-$(cd .. && pwd)/shared/fixtures}
xml=$corpus/nvidia-smi/tesla-t4.xml
[ -f "$xml" ] || { echo "corpus file $xml not found; set GPULEDGER_CORPUS" >&2; exit 1; }

cargo build --release -q -p gpuledger-agent
bin=target/release/gpuledger-agent

work=$(mktemp -d)
agent_pid=""
sink_pid=""
cleanup() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null || true
  [ -n "$sink_pid" ] && kill "$sink_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# 8 GPUs: the T4 <gpu> element 8 times, with distinct UUIDs and PCI bus IDs.
python3 - "$xml" "$work/8gpu.xml" <<'PY'
import sys
src = open(sys.argv[1]).read()
head, rest = src.split('<gpu id=', 1)
gpu = '<gpu id=' + rest[:rest.rindex('</nvidia_smi_log>')]
out = [head.replace('<attached_gpus>1</attached_gpus>', '<attached_gpus>8</attached_gpus>')]
for i in range(8):
    g = gpu.replace('GPU-d37e67a5-91dd-3774-a5cb-99096249601a',
                    'GPU-d37e67a5-91dd-3774-a5cb-9909624960%02d' % i)
    out.append(g.replace('00000000:00:1E.0', '00000000:%02X:00.0' % (0x10 + i)))
out.append('</nvidia_smi_log>\n')
open(sys.argv[2], 'w').write(''.join(out))
PY

mkdir -p "$work/bin"
case "$vendor" in
nvidia)
  cat > "$work/bin/nvidia-smi" <<EOF
#!/bin/sh
[ "\$1" = -q ] || exit 9
echo read >> "$work/reads"
exec cat "$work/8gpu.xml"
EOF
  chmod +x "$work/bin/nvidia-smi"
  gpus=8
  tool=nvidia-smi
  ;;
amd)
  cat > "$work/bin/rocm-smi" <<EOF
#!/bin/sh
case "\$*" in *--showpidgpus*) echo '{}'; exit 0 ;; esac
echo read >> "$work/reads"
exec cat "$corpus/amd/rocm-smi-json-mi100-x6-rocm571-leading-blank-line.json"
EOF
  chmod +x "$work/bin/rocm-smi"
  gpus=6
  tool=rocm-smi
  ;;
gaudi)
  cat > "$work/bin/hl-smi" <<EOF
#!/bin/sh
case "\$1" in -Q*) echo "unknown option \$1" >&2; exit 2 ;; esac
echo read >> "$work/reads"
exec cat "$corpus/gaudi/hl-smi-table-8x-gaudi2-hl225-1.20.0-busy-with-process-row.txt"
EOF
  chmod +x "$work/bin/hl-smi"
  gpus=8
  tool=hl-smi
  ;;
*) echo "VENDOR is nvidia, amd or gaudi, not $vendor" >&2; exit 2 ;;
esac

# A sink that answers 200 like the ingest endpoint and counts requests and bytes.
python3 crates/agent/bench/sink.py "$work" &
sink_pid=$!
for _ in $(seq 1 50); do [ -s "$work/port" ] && break; sleep 0.1; done
port=$(cat "$work/port")

PATH="$work/bin:$PATH" GPULEDGER_LOG=warn "$bin" \
  --server "http://127.0.0.1:$port" --token bench --host bench-node \
  --interval-secs "$interval" --buffer-dir "$work/buf" 2> "$work/agent.log" &
agent_pid=$!

hz=$(getconf CLK_TCK)
start=$(date +%s.%N)
max_rss=0
end_at=$(( $(date +%s) + duration ))
while [ "$(date +%s)" -lt "$end_at" ]; do
  kill -0 "$agent_pid" 2>/dev/null || { echo "the agent exited:" >&2; cat "$work/agent.log" >&2; exit 1; }
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$agent_pid/status")
  [ "$rss" -gt "$max_rss" ] && max_rss=$rss
  sleep 1
done
status=$(cat "/proc/$agent_pid/status")
stat=$(cat "/proc/$agent_pid/stat")
now=$(date +%s.%N)

rss_kib=$(awk '/^VmRSS:/ {print $2}' <<<"$status")
hwm_kib=$(awk '/^VmHWM:/ {print $2}' <<<"$status")
anon_kib=$(awk '/^RssAnon:/ {print $2}' <<<"$status")
file_kib=$(awk '/^RssFile:/ {print $2}' <<<"$status")
# Fields after the ")" of comm: utime is field 14, stime 15, cutime 16, cstime 17.
read -r utime stime cutime cstime < <(sed 's/.*) //' <<<"$stat" | awk '{print $12, $13, $14, $15}')
reads=$(wc -l < "$work/reads")
posts=$(wc -l < "$work/posts" 2>/dev/null || echo 0)
bytes=$(awk '{s+=$1} END {print s+0}' "$work/posts" 2>/dev/null || echo 0)

python3 - <<PY
elapsed = $now - $start
hz = $hz
agent_cpu = ($utime + $stime) / hz
child_cpu = ($cutime + $cstime) / hz
reads = $reads
print(f"gpuledger-agent footprint, $gpus GPUs ($vendor, through $tool), interval $interval s, {elapsed:.0f} s wall, {reads} reads, $posts pushes, $bytes bytes sent")
print(f"  binary size             {__import__('os').path.getsize('$bin') / 2**20:.1f} MiB")
print(f"  RSS now / peak (VmHWM)  {$rss_kib / 1024:.1f} MiB / {$hwm_kib / 1024:.1f} MiB (max sampled VmRSS {$max_rss / 1024:.1f} MiB)")
print(f"  of which heap/stack     {$anon_kib / 1024:.1f} MiB (RssAnon); mapped binary and libraries {$file_kib / 1024:.1f} MiB (RssFile)")
print(f"  agent CPU               {agent_cpu:.2f} s = {100 * agent_cpu / elapsed:.4f} % of one core")
print(f"  $tool children CPU {child_cpu:.2f} s (the fake prints a file; the real tool costs more, NVML none)")
if reads:
    per_read = agent_cpu / reads
    print(f"  agent CPU per read      {1000 * per_read:.2f} ms -> {100 * per_read / 60:.4f} % of one core at a 60 s interval")
PY
