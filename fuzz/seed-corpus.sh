#!/usr/bin/env bash
# Seed the fuzz corpora of the agent and dcgm targets from the real-world files in
# shared/fixtures (`$GPULEDGER_CORPUS`, else `<repo>/../shared/fixtures`). The corpora live in
# fuzz/corpus/<target>/, which is not versioned; running this again only adds files.
#
#   fuzz/seed-corpus.sh            # from anywhere
set -euo pipefail

fuzz="$(cd "$(dirname "$0")" && pwd)"
fixtures="${GPULEDGER_CORPUS:-$fuzz/../../shared/fixtures}"
if [ ! -d "$fixtures/nvidia-smi" ] || [ ! -d "$fixtures/dcgm" ]; then
    echo "no corpus at $fixtures; set GPULEDGER_CORPUS to shared/fixtures" >&2
    exit 1
fi
corpus="$fuzz/corpus"
mkdir -p "$corpus"/{agent_smi_xml,agent_smi_csv,agent_smi_list,agent_procs,agent_ingest_reply,dcgm_scrape,dcgm_prometheus_api,slurm_parse,cloud_answers,agent_amd,agent_hl_smi}

# nvidia-smi -q -x, as is.
cp "$fixtures"/nvidia-smi/*.xml "$corpus/agent_smi_xml/"
# nvidia-smi -L for the MIG-enabled A100 of the corpus (the layout NVIDIA's MIG guide shows,
# with that GPU's UUID and made-up instance UUIDs), alone and before that GPU's XML.
mig_xml="$fixtures/nvidia-smi/a100-sxm4-80gb-mig-enabled.xml"
gpu_uuid="$(grep -o -m1 '<uuid>GPU-[^<]*</uuid>' "$mig_xml" | sed 's/<[^>]*>//g')"
list="GPU 0: NVIDIA A100-SXM4-80GB (UUID: $gpu_uuid)
  MIG 3g.40gb     Device  0: (UUID: MIG-11111111-2222-5333-8444-555555555555)
  MIG 2g.20gb     Device  1: (UUID: MIG-66666666-7777-5888-9999-aaaaaaaaaaaa)
  MIG 1g.10gb     Device  2: (UUID: MIG-bbbbbbbb-cccc-5ddd-8eee-ffffffffffff)
  MIG 1g.10gb     Device  3: (UUID: MIG-00000000-1111-5222-8333-444444444444)
GPU 1: Tesla T4 (UUID: GPU-d37e67a5-91dd-3774-a5cb-99096249601a)"
printf '%s\n' "$list" > "$corpus/agent_smi_list/a100-mig-and-t4.txt"
{ printf '%s\n' "$list"; printf '\0'; cat "$mig_xml"; } > "$corpus/agent_smi_xml/list+a100-sxm4-80gb-mig-enabled.xml"

# nvidia-smi --query-gpu / --query-compute-apps CSV, as is; the MIG ones also after that -L.
cp "$fixtures"/nvidia-smi/*.csv "$corpus/agent_smi_csv/"
for f in "$fixtures"/nvidia-smi/query-gpu-full-*mig*.csv; do
    uuid="$(sed -n 2p "$f" | grep -o -m1 'GPU-[0-9a-fA-F-]*' | head -n1)"
    { printf '%s\n' "${list//$gpu_uuid/$uuid}"; printf '\0'; cat "$f"; } \
        > "$corpus/agent_smi_csv/list+$(basename "$f")"
done

# /proc and /etc/passwd: this host's own files for the calling process, and the cgroup paths
# of Kubernetes containers under the systemd and cgroupfs drivers.
for f in /proc/self/status /proc/self/stat /proc/self/cgroup /proc/stat; do
    [ -r "$f" ] && cat "$f" > "$corpus/agent_procs/$(echo "${f#/proc/}" | tr / -)" || true
done
printf '%s\n' 'root:x:0:0:root:/root:/bin/bash' '# comment' 'alice:x:1000:1000::/home/alice:/bin/sh' \
    'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin' > "$corpus/agent_procs/passwd"
cid=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
printf '%s\n' "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0000_4a5b_8c9d_0123456789ab.slice/cri-containerd-$cid.scope" \
    > "$corpus/agent_procs/cgroup-v2-systemd"
printf '%s\n' "12:memory:/kubepods/besteffort/pod1b2c3d4e-0000-4a5b-8c9d-0123456789ab/$cid" \
    "11:cpu,cpuacct:/docker/$cid" '0::/' > "$corpus/agent_procs/cgroup-v1-cgroupfs"

# The server's answers to a push: two bytes of HTTP status, then the body.
reply() { printf "\\x$(printf %02x $(($1 / 256)))\\x$(printf %02x $(($1 % 256)))%s" "$2" > "$corpus/agent_ingest_reply/$3"; }
reply 200 '{"accepted":{"gpus":1,"samples":2,"allocations":0},"duplicates":{},"rejected":[{"path":"samples[1].gpu_uuid","reason":"GPU GPU-1 has been reported by no one"}]}' ok-rejected
reply 400 '{"error":"body is not valid JSON"}' bad-request
reply 403 '{"error":"a viewer token cannot write","rejected":[{"path":"allocations[0].gpu_uuid","reason":"not yours"}]}' forbidden
reply 429 '120' busy-retry-after
reply 503 'Wed, 02 Dec 2026 10:00:30 GMT' unavailable-date
reply 502 '<html><body>Bad Gateway</body></html>' proxy-page

# dcgm-exporter /metrics scrapes, as is, and the same series as Prometheus API answers: a
# vector (/api/v1/query) and a three-step matrix (/api/v1/query_range).
# rocm-smi --json as is (the agent_amd input starts with it), and Gaudi hl-smi tables as is.
cp "$fixtures"/amd/*.json "$corpus/agent_amd/"
cp "$fixtures"/gaudi/* "$corpus/agent_hl_smi/"
cp "$fixtures"/dcgm/*.prom "$corpus/dcgm_scrape/"
# AMD's device-metrics-exporter (recorded) and the written AMD and Gaudi expositions.
cp "$fixtures"/amd/*.prom "$corpus/dcgm_scrape/"
cp "$fuzz"/../crates/collect/tests/data/*.prom "$corpus/dcgm_scrape/"
python3 - "$fixtures/dcgm" "$corpus/dcgm_prometheus_api" <<'PY'
import json, pathlib, re, sys

line_re = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$')
label_re = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
t0 = 1764676800.0
for f in sorted(src.glob("*.prom")):
    vector, matrix = [], []
    for line in f.read_text(errors="replace").splitlines():
        m = line_re.match(line.strip())
        if not m or line.lstrip().startswith("#"):
            continue
        name, labels, value = m.groups()
        metric = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in label_re.findall(labels or "")}
        metric["__name__"] = name
        vector.append({"metric": metric, "value": [t0, value]})
        matrix.append({"metric": metric, "values": [[t0 + 60 * i, value] for i in range(3)]})
    for kind, result in (("vector", vector), ("matrix", matrix)):
        body = {"status": "success", "data": {"resultType": kind, "result": result}}
        (dst / f"{f.stem}.{kind}.json").write_text(json.dumps(body))
(dst / "error-bad-data.json").write_text(json.dumps(
    {"status": "error", "errorType": "bad_data", "error": "parse error at char 1"}))
(dst / "warnings.json").write_text(json.dumps(
    {"status": "success", "warnings": ["query hit the sample limit"],
     "data": {"resultType": "vector", "result": []}}))
PY

# Slurm command outputs, as is.
cp "$fixtures"/slurm/* "$corpus/slurm_parse/"
# slurmrestd answers of the later API versions, written from Slurm's schema (no recorded ones).
cp "$fuzz"/../crates/collect/tests/data/slurmrestd/*.json "$corpus/slurm_parse/"

# Cloud answers and inventory sheets: the recorded GCP answer, the sample sheet and its XLSX
# twin (the repository's), and the test modules' EC2 and Azure answers.
repo="$fuzz/.."
cp "$fixtures"/cloud/gcp/*.json "$repo/docs/examples/inventory-sample.csv" \
    "$repo/crates/collect/tests/data/inventory.xlsx" "$corpus/cloud_answers/"
python3 - "$repo/crates/collect/src/collectors/aws/xml.rs" "$corpus/cloud_answers" <<'PY'
import pathlib, re, sys
src, dst = pathlib.Path(sys.argv[1]).read_text(), pathlib.Path(sys.argv[2])
(dst / "ec2-instances.xml").write_text(re.search(r'const INSTANCES: &str = r#"(.*?)"#;', src, re.S).group(1))
PY

for d in "$corpus"/{agent_smi_xml,agent_smi_csv,agent_smi_list,agent_procs,agent_ingest_reply,dcgm_scrape,dcgm_prometheus_api,slurm_parse,cloud_answers,agent_amd,agent_hl_smi}; do
    echo "$(basename "$d"): $(find "$d" -type f | wc -l) files, $(du -sk "$d" | cut -f1) KiB"
done
