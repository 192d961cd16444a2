#!/usr/bin/env bash
# Checks the API contract: schemathesis (a property-based API tester, from PyPI) generates
# requests from the OpenAPI document the server serves, sends them to a real server and fails
# on any answer the document does not allow: a server error, a status, content type, header or
# body it does not list, a request it allows that is refused or one it forbids that is taken,
# an operation that ignores its token.
#
# Usage: scripts/api-contract.sh [--examples N] [--seed N] [extra schemathesis run args]
#
# Starts `gpuledger demo` (2 days of simulated history) on a fresh SQLite file bound to a free
# port on 127.0.0.1, mints an ingest token with `gpuledger token create`, and runs every check
# of schemathesis with a fixed seed and at most N examples per operation (default 50). Installs
# schemathesis into target/api-contract-venv with Python 3.11 when missing. Writes the run's
# JUnit report to target/api-contract/junit.xml.
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
examples=50
seed=19
while (($#)); do
  case $1 in
    --examples) examples=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) break ;;
  esac
done

log() { printf '==> %s\n' "$*" >&2; }

venv=target/api-contract-venv
if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -qF "$SCHEMATHESIS_VERSION"; then
  python=$(command -v python3.11 || command -v python3 || true)
  [ -n "$python" ] && "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
    echo "api-contract: needs Python 3.11 (python3.11 or python3) to install schemathesis" >&2
    exit 1
  }
  log "installing schemathesis $SCHEMATHESIS_VERSION into $venv"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet "schemathesis==$SCHEMATHESIS_VERSION"
fi

cargo build --locked --quiet -p gpuledger
bin=target/debug/gpuledger
out=target/api-contract
mkdir -p "$out"
work=$(mktemp -d)
demo_pid=
cleanup() {
  [ -n "$demo_pid" ] && kill "$demo_pid" 2>/dev/null && wait "$demo_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base=http://127.0.0.1:$port
db=$work/demo.db
log "starting the demo on $base"
"$bin" demo --days 2 --listen "127.0.0.1:$port" --database-url "$db" >"$out/demo.log" 2>&1 &
demo_pid=$!
for _ in $(seq 1 300); do
  curl -sf "$base/readyz" >/dev/null 2>&1 && break
  kill -0 "$demo_pid" 2>/dev/null || { cat "$out/demo.log" >&2; exit 1; }
  sleep 0.2
done
curl -sf "$base/readyz" >/dev/null || { echo "api-contract: the demo did not start" >&2; exit 1; }
token=$("$bin" token create --source api-contract --database-url "$db" | tail -n 1)

log "schemathesis $SCHEMATHESIS_VERSION: every check, seed $seed, at most $examples examples per operation"
"$venv/bin/schemathesis" --config-file scripts/api-contract/schemathesis.toml run \
  "$base/api/v1/openapi.json" \
  --checks all \
  --seed "$seed" \
  --max-examples "$examples" \
  --workers 1 \
  --header "Authorization: Bearer $token" \
  --report junit --report-junit-path "$out/junit.xml" \
  --no-color \
  "$@"
