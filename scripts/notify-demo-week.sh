#!/usr/bin/env bash
# A week of the demo's notifications, replayed day by day: the demo's history is loaded up to
# each day 09:00 UTC (`demo --load-only --until`) and one notification round runs as of then
# (`notify --at`), sending to a real SMTP server (aiosmtpd, STARTTLS and AUTH, on 127.0.0.1)
# and a local webhook receiver. Prints each round, then the mails and webhook bodies received.
#
# Usage: scripts/notify-demo-week.sh [MONDAY]   (default 2026-11-23; needs a release build and
# a Python with aiosmtpd: GPULEDGER_SMTP_PYTHON, as scripts/test.sh makes it)
set -euo pipefail
cd "$(dirname "$0")/.."
monday=${1:-2026-11-23}
bin=./target/release/gpuledger
python=${GPULEDGER_SMTP_PYTHON:-target/smtp-venv/bin/python}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=127.0.0.1 -addext "subjectAltName=IP:127.0.0.1" \
  -addext "basicConstraints=critical,CA:FALSE" -addext "extendedKeyUsage=serverAuth" \
  -keyout "$work/smtp.key" -out "$work/smtp.crt" 2>/dev/null
echo "s3cret" >"$work/smtp-password"
"$python" scripts/smtp-test-server.py 2526 "$work/smtp.crt" "$work/smtp.key" gpuledger s3cret \
  "$work/mail" >"$work/smtp.log" 2>&1 &
# The webhook receiver: every body, one JSON line each, by path.
python3 - "$work/hooks.jsonl" <<'PY' &
import http.server, json, sys
out = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with open(out, "a") as f:
            f.write(json.dumps({"path": self.path, "body": json.loads(body)}) + "\n")
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 18990), H).serve_forever()
PY
sleep 1

cat >"$work/notify.toml" <<EOF
[teams.nlp]
email = "nlp-leads@example.com"
webhook = "http://127.0.0.1:18990/hooks/nlp"

[teams.search]
email = "search-leads@example.com"

[notifications]
dashboard_url = "https://gpuledger.example.com"
central = ["email:gpu-platform@example.com", "webhook:platform"]

[notifications.smtp]
host = "127.0.0.1"
port = 2526
username = "gpuledger"
password_file = "$work/smtp-password"
from = "gpuledger <gpuledger@example.com>"
ca_file = "$work/smtp.crt"

[notifications.webhooks.platform]
url = "http://127.0.0.1:18990/hooks/platform"
style = "teams"

[[notifications.rules]]
kind = "idle_gpu"
min_usd_per_month = 1000
to = "owner"

[[notifications.rules]]
kind = "team_idle_cost"
usd_per_week = 20000
to = "owner"

[[notifications.rules]]
kind = "stale_source"
to = "central"

[[notifications.rules]]
kind = "unowned_gpus"
to = "central"

[notifications.digest]
weekday = "monday"
hour = 8
EOF
$bin check-config "$work/notify.toml"

db="$work/demo.db"
days=14
for d in 0 1 2 3 4 5 6 7; do
  at=$(date -u -d "$monday + $d day" +%Y-%m-%dT09:00:00Z)
  GPULEDGER_LOG=warn $bin demo --load-only --days "$days" --until "$at" --database-url "$db" >/dev/null
  days=2
  echo "== round at $at ($(date -u -d "$at" +%A))"
  GPULEDGER_LOG=warn $bin notify --at "$at" --config "$work/notify.toml" --database-url "$db" |
    awk 'NR % 2 == 1'
done

echo "== e-mails received: $(ls "$work/mail" | wc -l)"
for m in "$work"/mail/*.eml; do grep -m2 -E '^(To|Subject):' "$m" | tr '\n' ' '; echo; done
echo "== webhook bodies received: $(wc -l <"$work/hooks.jsonl")"
cut -c1-240 "$work/hooks.jsonl"
