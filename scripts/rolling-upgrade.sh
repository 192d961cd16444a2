#!/usr/bin/env bash
# A rolling upgrade on PostgreSQL (docs/deploy.md, Rolling upgrades): two replicas of the old
# release take pushes, a replica of the new one starts and migrates, an old one restarts on the
# migrated schema, then the old ones are replaced; every push must be answered 200 and every
# replica must see every GPU. Loopback only; needs psql, curl and python3, and PostgreSQL on
# 127.0.0.1:5432 (the database is dropped and made again).
#
#   scripts/rolling-upgrade.sh OLD-BINARY NEW-BINARY [DATABASE]
#
# OLD-BINARY is a build of the release before (one that tolerates a newer schema).
set -euo pipefail
OLD=${1:?usage: scripts/rolling-upgrade.sh OLD-BINARY NEW-BINARY [DATABASE]} NEW=${2:?usage: scripts/rolling-upgrade.sh OLD-BINARY NEW-BINARY [DATABASE]}
DB=${3:-gpuledger_roll}
URL=postgres://postgres@127.0.0.1:5432/$DB
psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
W=$(mktemp -d)
start() { # name bin port
  "$2" serve --database-url "$URL" --listen 127.0.0.1:$3 > $W/$1.out 2> $W/$1.log &
  echo $! > $W/$1.pid
  for _ in $(seq 100); do curl -fs http://127.0.0.1:$3/readyz >/dev/null 2>&1 && break; sleep 0.1; done
  echo "$(date +%T.%3N) $1 ready on $3 ($2): $(curl -fs http://127.0.0.1:$3/readyz)"
}
stop() { kill $(cat $W/$1.pid); wait $(cat $W/$1.pid) 2>/dev/null || true; echo "$(date +%T.%3N) $1 stopped"; }
push() { # port gpu
  now=$(date -u +%FT%TZ)
  code=$(curl -s -o $W/push.json -w '%{http_code}' -X POST http://127.0.0.1:$1/api/v1/ingest -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
   -d '{"gpus":[{"uuid":"GPU-00000000-0000-4000-8000-00000000000'$2'","model":"NVIDIA L4","host":"roll-'$2'","observed_at":"'$now'"}],"samples":[{"gpu_uuid":"GPU-00000000-0000-4000-8000-00000000000'$2'","ts":"'$now'","util_pct":40}]}')
  echo "  push to :$1 -> $code $(cat $W/push.json)"
}
gpus() { echo "  :$1 sees $(curl -fs http://127.0.0.1:$1/api/v1/gpus | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["items"]))') GPUs"; }
migs() { psql -h 127.0.0.1 -U postgres -d $DB -Atc "SELECT string_agg(version::text, ',' ORDER BY version) FROM _sqlx_migrations"; }
start old-a $OLD 18101
start old-b $OLD 18102
echo "  migrations applied: $(migs)"
TOKEN=$($OLD token create --source roll --database-url "$URL" | tail -n 1)
push 18101 1; push 18102 2; gpus 18101
echo "-- a replica of the new release starts (it migrates)"
start new-c $NEW 18103
echo "  migrations applied: $(migs)"
push 18101 3; push 18103 4; gpus 18102; gpus 18103
echo "-- an old replica restarts on the migrated schema"
stop old-b
start old-b $OLD 18102
push 18102 5; gpus 18102
echo "-- the old ones are replaced"
stop old-a; stop old-b
start new-d $NEW 18104
push 18104 6; gpus 18104
curl -fs "http://127.0.0.1:18104/api/v1/audit?range=1d&source=roll" | python3 -c 'import json,sys; [print("  audit:", r["minute"], r["actor"], r["action"], r["outcome"], r["records"]) for r in json.load(sys.stdin)["items"]]'
stop new-c; stop new-d
grep -i "error\|panic" $W/*.log | head || true
rm -rf $W
