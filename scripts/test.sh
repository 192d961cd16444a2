#!/usr/bin/env bash
# Runs every test of gpuledger on a fresh machine: installs and starts what the tests need,
# then runs the whole workspace's tests. Usage: scripts/test.sh [extra cargo test args]
#
# Needs: a Rust toolchain (cargo) and the corpus ($GPULEDGER_CORPUS, else ../shared/fixtures).
# Installs when missing (Debian packages): PostgreSQL, openssl, curl and jq (the docs' examples),
# Chromium with its WebDriver for the browser end-to-end test, and Prometheus for the dcgm
# collector's test (which starts its own Prometheus on 127.0.0.1); from PyPI, moto (an AWS API
# emulator) into target/moto-venv for the aws collector's test, which starts its own moto
# server on 127.0.0.1, and aiosmtpd into target/smtp-venv for the notification test's SMTP
# server; Slurm (slurm-wlm, slurmdbd, munge, slurmrestd) as a one-node cluster with
# stand-in GPUs, its accounting in the local MariaDB, for the slurm collector's test
# (scripts/slurm-test-cluster.sh).
# Starts when stopped: the local PostgreSQL on 127.0.0.1:5432 (trust auth, database `test`),
# which the store suite runs against, each test in its own schema. The browser test starts its
# own chromedriver and headless Chromium on 127.0.0.1 and saves screenshots to
# target/screenshots/.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*" >&2; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

pg_up() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }

ensure_postgres() {
  if ! pg_up; then
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then
      log "installing PostgreSQL"
      as_root apt-get update -qq
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    fi
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    hba=/etc/postgresql/$version/main/pg_hba.conf
    # The tests connect as postgres over TCP without a password (trust, local addresses only).
    if ! grep -Eq '^host\s+all\s+all\s+127\.0\.0\.1/32\s+trust' "$hba"; then
      log "allowing trust auth for 127.0.0.1 in $hba"
      as_root sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    fi
    log "starting PostgreSQL $version"
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    for _ in $(seq 1 50); do pg_up && break; sleep 0.2; done
  fi
  pg_up || { echo "PostgreSQL is not reachable on 127.0.0.1:5432" >&2; exit 1; }
  if ! psql -h 127.0.0.1 -U postgres -d test -Atc 'select 1' >/dev/null 2>&1; then
    log "creating database test"
    psql -h 127.0.0.1 -U postgres -d postgres -c 'CREATE DATABASE test' >/dev/null
  fi
}

ensure_packages() {
  local missing=()
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
  command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
  # The HTTPS test makes its certificates with it.
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  # The docs' examples (crates/gpuledger/tests/docs_examples.rs) run with them.
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  command -v jq >/dev/null 2>&1 || missing+=(jq)
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# The aws collector's tests run against moto's EC2 and STS, made with boto3 (in moto's venv).
MOTO_VERSION=5.2.5
ensure_moto() {
  local venv=target/moto-venv
  if ! "$venv/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null; then
    command -v python3 >/dev/null 2>&1 && python3 -c 'import venv, ensurepip' 2>/dev/null || {
      log "installing python3-venv"
      as_root apt-get update -qq
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null
    }
    log "installing moto $MOTO_VERSION into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "moto[server,ec2]==$MOTO_VERSION"
  fi
  export GPULEDGER_MOTO=$PWD/$venv/bin/moto_server GPULEDGER_REQUIRE_MOTO=1
}

# The notification test sends e-mail to a real SMTP server (aiosmtpd, in its own venv), which
# it starts itself on 127.0.0.1 with STARTTLS and AUTH (scripts/smtp-test-server.py).
AIOSMTPD_VERSION=1.4.6
ensure_smtp() {
  local venv=target/smtp-venv
  if ! "$venv/bin/python" -c "import aiosmtpd, sys; sys.exit(aiosmtpd.__version__ != '$AIOSMTPD_VERSION')" 2>/dev/null; then
    log "installing aiosmtpd $AIOSMTPD_VERSION into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "aiosmtpd==$AIOSMTPD_VERSION"
  fi
  export GPULEDGER_SMTP_PYTHON=$PWD/$venv/bin/python GPULEDGER_REQUIRE_SMTP=1
}

export GPULEDGER_CORPUS=${GPULEDGER_CORPUS:-$(cd .. && pwd)/shared/fixtures}
[ -d "$GPULEDGER_CORPUS" ] || {
  echo "no corpus at $GPULEDGER_CORPUS: set GPULEDGER_CORPUS to shared/fixtures" >&2
  exit 1
}
ensure_postgres
ensure_packages
ensure_moto
ensure_smtp
# Nothing the tests need may be skipped: without these switches a test whose browser,
# Prometheus, corpus or PostgreSQL is missing prints "skipped" and passes; with them it fails.
export GPULEDGER_REQUIRE_BROWSER=1 GPULEDGER_REQUIRE_PROMETHEUS=1
export GPULEDGER_REQUIRE_CORPUS=1 GPULEDGER_REQUIRE_POSTGRES=1
export GPULEDGER_TEST_PG_URL=${GPULEDGER_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/test}

scripts/check-deploy.sh
log "starting the one-node Slurm test cluster"
as_root scripts/slurm-test-cluster.sh
export GPULEDGER_TEST_SLURM=1 GPULEDGER_REQUIRE_SLURM=1
log "cargo test (PostgreSQL: $GPULEDGER_TEST_PG_URL)"
cargo test --workspace --locked "$@"
scripts/api-contract.sh
