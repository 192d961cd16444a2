#!/usr/bin/env bash
# Starts a real single-node Slurm cluster for the slurm collector's test
# (crates/collect/tests/slurm.rs): Debian's slurm-wlm with accounting in slurmdbd on the
# MariaDB already running at 127.0.0.1:3306 (root, no password), one node `gpuledger-node1`
# with four fake H100 GPUs (gres.conf `File=` pointing at symlinks to /dev/null), partition
# `gpu`, accounts `gl-speech` and `gl-vision` with users `gl-alice` and `gl-bob`, and slurmrestd
# on 127.0.0.1:6820 taking JWTs for the read-only user `gl-reader` (`scontrol token
# username=gl-reader` makes one).
#
# Needs root (it installs packages, writes /etc/slurm and starts daemons); no systemd needed.
# Also installs openssh-server (not started: the SSH test runs its own sshd on 127.0.0.1).
# Idempotent: with everything up it checks and returns in about a second.
# Usage: scripts/slurm-test-cluster.sh          start (or check) the cluster, and print
#                                               `<cluster> <node> <slurmrestd URL>`
#        scripts/slurm-test-cluster.sh stop     stop its daemons (keeps the packages)
# Prints the cluster name and the node on success; logs are in /var/log/gpuledger-slurm-test/.
set -euo pipefail

CLUSTER=gpuledger-test
NODE=gpuledger-node1
PARTITION=gpu
GPUS=4
GPU_TYPE=h100
BASE=/var/lib/gpuledger-slurm-test
RUN=/run/gpuledger-slurm-test
LOGS=/var/log/gpuledger-slurm-test
DB=gpuledger_slurm_acct
ACCOUNTS=("gl-speech:gl-alice" "gl-vision:gl-bob")
REST=127.0.0.1:6820
REST_USER=gl-rest

log() { printf '==> slurm-test-cluster: %s\n' "$*" >&2; }
die() { printf 'slurm-test-cluster: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts Slurm's daemons)"

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop() {
  local pid
  for d in slurmrestd slurmd slurmctld slurmdbd; do
    if alive "$RUN/$d.pid"; then
      pid=$(cat "$RUN/$d.pid")
      log "stopping $d ($pid)"
      kill "$pid" || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  done
}

if [ "${1:-}" = stop ]; then
  stop
  exit 0
fi

started=$(date +%s%N)

# --- packages ------------------------------------------------------------------------------
missing=()
command -v slurmctld >/dev/null 2>&1 || missing+=(slurm-wlm)
command -v slurmdbd >/dev/null 2>&1 || missing+=(slurmdbd)
command -v munged >/dev/null 2>&1 || missing+=(munge)
command -v sacct >/dev/null 2>&1 || missing+=(slurm-client)
command -v slurmrestd >/dev/null 2>&1 || missing+=(slurmrestd)
ls /usr/lib/*/slurm-wlm/auth_jwt.so >/dev/null 2>&1 || missing+=(slurm-wlm-jwt-plugin)
# The SSH test starts its own sshd on 127.0.0.1; the package's own service is not started.
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  policy_added=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    policy_added=1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurm-wlm slurmdbd munge slurm-client slurmrestd slurm-wlm-jwt-plugin openssh-server >/dev/null
  [ "$policy_added" = 0 ] || rm -f /usr/sbin/policy-rc.d
fi

# --- MariaDB -------------------------------------------------------------------------------
db_up() { mysql -h 127.0.0.1 -P 3306 -u root -e 'SELECT 1' >/dev/null 2>&1; }
if ! db_up; then
  log "starting MariaDB"
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql || true
  for _ in $(seq 1 100); do db_up && break; sleep 0.1; done
  db_up || die "MariaDB is not reachable on 127.0.0.1:3306 as root without a password"
fi

# --- files ---------------------------------------------------------------------------------
mkdir -p "$BASE/ctld" "$BASE/d" "$BASE/dev" "$RUN" "$LOGS" /etc/slurm
for i in $(seq 0 $((GPUS - 1))); do
  [ -L "$BASE/dev/nvidia$i" ] || ln -sfn /dev/null "$BASE/dev/nvidia$i"
done
CTLD_HOST=$(hostname -s)
# The key slurmctld and slurmdbd sign and check slurmrestd's JWTs with.
if [ ! -s "$BASE/jwt_hs256.key" ]; then
  dd if=/dev/urandom of="$BASE/jwt_hs256.key" bs=32 count=1 2>/dev/null
fi
chmod 0600 "$BASE/jwt_hs256.key"

# Write $1 from stdin only when it changed; say whether it did.
changed=0
put() {
  local tmp
  tmp=$(mktemp)
  cat >"$tmp"
  if [ -f "$1" ] && cmp -s "$tmp" "$1"; then
    rm -f "$tmp"
  else
    mv "$tmp" "$1"
    changed=1
  fi
  chmod "${2:-644}" "$1"
}

put /etc/slurm/slurm.conf <<EOF
# Written by gpuledger's scripts/slurm-test-cluster.sh: a one-node test cluster.
ClusterName=$CLUSTER
SlurmctldHost=$CTLD_HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$BASE/jwt_hs256.key
StateSaveLocation=$BASE/ctld
SlurmdSpoolDir=$BASE/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStorageEnforce=associations
AccountingStorageTRES=gres/gpu,gres/gpu:$GPU_TYPE
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
JobCompType=jobcomp/none
MinJobAge=30
NodeName=$NODE NodeHostname=$CTLD_HOST NodeAddr=127.0.0.1 CPUs=4 RealMemory=1000 Gres=gpu:$GPU_TYPE:$GPUS State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

put /etc/slurm/gres.conf <<EOF
NodeName=$NODE Name=gpu Type=$GPU_TYPE File=$BASE/dev/nvidia[0-$((GPUS - 1))]
EOF

put /etc/slurm/slurmdbd.conf 600 <<EOF
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$BASE/jwt_hs256.key
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=root
StorageLoc=$DB
LogFile=$LOGS/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
EOF

if [ "$changed" = 1 ] && alive "$RUN/slurmctld.pid"; then
  log "configuration changed: restarting the daemons"
  stop
fi

# --- munge ---------------------------------------------------------------------------------
munge_up() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
if ! munge_up; then
  log "starting munged"
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  chmod 0755 /run/munge
  [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 1 50); do munge_up && break; sleep 0.1; done
  munge_up || die "munged did not start (see /var/log/munge/munged.log)"
fi

# --- slurmdbd ------------------------------------------------------------------------------
dbd_up() { (exec 3<>/dev/tcp/127.0.0.1/6819) 2>/dev/null; }
if ! alive "$RUN/slurmdbd.pid" || ! dbd_up; then
  log "starting slurmdbd"
  /usr/sbin/slurmdbd
  for _ in $(seq 1 100); do dbd_up && break; sleep 0.1; done
  dbd_up || die "slurmdbd did not start (see $LOGS/slurmdbd.log)"
fi
if ! sacctmgr -n -P show cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"; then
  log "adding cluster $CLUSTER to accounting"
  sacctmgr -i add cluster "$CLUSTER" >/dev/null
fi

# --- slurmctld and slurmd ------------------------------------------------------------------
if ! alive "$RUN/slurmctld.pid" || ! scontrol ping >/dev/null 2>&1; then
  log "starting slurmctld"
  /usr/sbin/slurmctld
  for _ in $(seq 1 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
  scontrol ping >/dev/null 2>&1 || die "slurmctld did not start (see $LOGS/slurmctld.log)"
fi
if ! alive "$RUN/slurmd.pid"; then
  log "starting slurmd as $NODE"
  /usr/sbin/slurmd -N "$NODE"
fi
state=""
for _ in $(seq 1 150); do
  state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
  case "$state" in idle* | mixed* | allocated*) break ;; esac
  sleep 0.1
done
case "$state" in
  idle* | mixed* | allocated*) ;;
  *)
    # A node left down by an earlier run comes back once slurmd is up.
    scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
    sleep 1
    state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
    case "$state" in idle* | mixed* | allocated*) ;; *) die "node $NODE is '$state' (see $LOGS/slurmd.log)" ;; esac
    ;;
esac

# --- accounts and users --------------------------------------------------------------------
assocs=$(sacctmgr -n -P show assoc cluster="$CLUSTER" format=account,user 2>/dev/null || true)
for pair in "${ACCOUNTS[@]}"; do
  account=${pair%%:*}
  user=${pair##*:}
  id -u "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /bin/sh "$user"
  if ! grep -qx "$account|" <<<"$assocs"; then
    sacctmgr -i add account "$account" cluster="$CLUSTER" description="gpuledger test" organization=gpuledger >/dev/null
  fi
  if ! grep -qx "$account|$user" <<<"$assocs"; then
    sacctmgr -i add user "$user" account="$account" cluster="$CLUSTER" >/dev/null
  fi
done
if ! grep -qx "root|root" <<<"$assocs"; then
  sacctmgr -i add user root account=root cluster="$CLUSTER" >/dev/null 2>&1 || true
fi

# --- slurmrestd (it refuses to run as root or as SlurmUser) -----------------------------------
id -u "$REST_USER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$REST_USER"
# The read-only user the tests ask slurmrestd as (no association, no admin level).
id -u gl-reader >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin gl-reader
rest_up() { (exec 3<>"/dev/tcp/${REST%:*}/${REST#*:}") 2>/dev/null; }
if ! alive "$RUN/slurmrestd.pid" || ! rest_up; then
  log "starting slurmrestd on $REST"
  setsid runuser -u "$REST_USER" -- env SLURM_JWT=daemon /usr/sbin/slurmrestd -a rest_auth/jwt "$REST" \
    >>"$LOGS/slurmrestd.log" 2>&1 </dev/null &
  echo $! >"$RUN/slurmrestd.pid"
  for _ in $(seq 1 100); do rest_up && break; sleep 0.1; done
  rest_up || die "slurmrestd did not start (see $LOGS/slurmrestd.log)"
fi

took_ms=$((($(date +%s%N) - started) / 1000000))
log "up in ${took_ms} ms: cluster $CLUSTER, node $NODE ($GPUS x gpu:$GPU_TYPE), partition $PARTITION"
echo "$CLUSTER $NODE http://$REST"
