#!/usr/bin/env bash
# Checks everything under deploy/server, and fails on any problem:
#
#   1. the config files (deploy/server/gpuledger.toml, the Kubernetes ConfigMap's) pass
#      `gpuledger check-config`;
#   2. the Kubernetes manifests: the kustomization is rendered (with and without the ingress
#      component) by `kubectl kustomize` and by a small Python renderer (used alone where kubectl
#      is missing; both must agree), then every rendered object and every manifest file is
#      validated against the Kubernetes OpenAPI schemas of versions $K8S_VERSIONS by
#      `kubernetes-validate --strict` (PyPI, in a venv under target/). Names that no schema
#      checks are checked here: the Deployment's flags and environment are the binary's, its
#      probes, ports, ConfigMap and Secret references resolve;
#   3. the Deployment's arguments and environment, and the systemd unit's ExecStart, start a real
#      server (PostgreSQL and SQLite) whose /healthz and /readyz answer 200;
#   4. the systemd unit passes `systemd-analyze verify` with no message, and
#      `systemd-analyze security --offline` rates it 2.0 or better;
#   5. the image: deploy/server/Containerfile is built by buildah (no daemon, no registry: the
#      `prebuilt` stage takes a static binary built here), then run as its own user in its
#      own empty root file system, serving /readyz on PostgreSQL.
#
# Usage: scripts/check-deploy.sh. Needs cargo, python3, curl, a PostgreSQL on 127.0.0.1:5432
# with trust auth for user postgres (scripts/test.sh starts one; GPULEDGER_DEPLOY_PG_URL names
# another server's `postgres` database), systemd-analyze; installs buildah (Debian) when it is
# missing. Leaves its work in target/deploy-check/.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBERNETES_VALIDATE_VERSION=1.37.0
K8S_VERSIONS="1.27 1.37"
PG_ADMIN_URL=${GPULEDGER_DEPLOY_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
PG_DB=gpuledger_deploy_check
PG_URL=${PG_ADMIN_URL%/*}/$PG_DB
export PGOPTIONS=--client-min-messages=warning
WORK=target/deploy-check
VENV=target/deploy-venv

log() { printf '==> %s\n' "$*" >&2; }
fail() {
  printf 'check-deploy: %s\n' "$*" >&2
  exit 1
}

rm -rf "$WORK"
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# --- tools -------------------------------------------------------------------------------------
if ! "$VENV/bin/kubernetes-validate" --version 2>/dev/null | grep -qx "$KUBERNETES_VALIDATE_VERSION"; then
  log "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION in $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi
PY=$VENV/bin/python
command -v systemd-analyze >/dev/null || fail "systemd-analyze is missing (Debian: apt-get install systemd)"
command -v curl >/dev/null || fail "curl is missing"

log "building gpuledger"
cargo build --locked -q -p gpuledger
BIN=$(pwd)/target/debug/gpuledger

# --- PostgreSQL ---------------------------------------------------------------------------------
psql "$PG_ADMIN_URL" -qAtc 'select 1' >/dev/null 2>&1 ||
  fail "no PostgreSQL at $PG_ADMIN_URL: start one (scripts/test.sh does) or set GPULEDGER_DEPLOY_PG_URL"
psql "$PG_ADMIN_URL" -qc "DROP DATABASE IF EXISTS $PG_DB" -c "CREATE DATABASE $PG_DB" >/dev/null

# --- 1. config files ---------------------------------------------------------------------------
for f in deploy/server/gpuledger.toml deploy/server/kubernetes/gpuledger.toml; do
  log "check-config $f"
  "$BIN" check-config "$f" >/dev/null || fail "$f: gpuledger check-config found problems (above)"
done

# --- 2. Kubernetes manifests -------------------------------------------------------------------
# A copy of the kustomization with its database.env written as a user writes it, and an overlay
# that adds the ingress component.
cp -r deploy/server/kubernetes "$WORK/kubernetes"
printf 'url=%s\n' "$PG_URL" >"$WORK/kubernetes/database.env"
mkdir -p "$WORK/with-ingress"
cat >"$WORK/with-ingress/kustomization.yaml" <<'EOF'
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../kubernetes
components:
  - ../kubernetes/ingress
EOF
renderers=(python)
if command -v kubectl >/dev/null; then
  renderers=(kubectl python)
else
  log "kubectl is missing: rendering with the Python renderer only"
fi
for variant in kubernetes with-ingress; do
  for r in "${renderers[@]}"; do
    out=$WORK/$variant.$r.yaml
    if [ "$r" = kubectl ]; then
      kubectl kustomize "$WORK/$variant" >"$out" || fail "kubectl kustomize $variant failed"
    else
      "$PY" - "$WORK/$variant" >"$out" <<'PY' || fail "the Python renderer failed on $variant"
# A renderer for the part of kustomize these manifests use: resources, components, namespace,
# configMapGenerator (files), secretGenerator (envs), images. Anything else is an error.
import base64, pathlib, sys, yaml

KNOWN = {"apiVersion", "kind", "namespace", "resources", "components", "configMapGenerator",
         "secretGenerator", "images"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}

def render(d):
    k = yaml.safe_load((d / "kustomization.yaml").read_text())
    unknown = set(k) - KNOWN
    if unknown:
        sys.exit(f"{d}: the Python renderer does not know {sorted(unknown)}; install kubectl")
    docs = []
    for r in k.get("resources", []) + k.get("components", []):
        p = d / r
        docs += render(p) if p.is_dir() else [x for x in yaml.safe_load_all(p.read_text()) if x]
    for g in k.get("configMapGenerator", []):
        data = {pathlib.Path(f).name: (d / f).read_text() for f in g.get("files", [])}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": g["name"]}, "data": data})
    for g in k.get("secretGenerator", []):
        data = {}
        for f in g.get("envs", []):
            for line in (d / f).read_text().splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    key, _, value = line.partition("=")
                    data[key.strip()] = base64.b64encode(value.encode()).decode()
        docs.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                     "metadata": {"name": g["name"]}, "data": data})
    for doc in docs:
        if k.get("namespace") and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = k["namespace"]
        for img in k.get("images", []):
            for c in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                if c["image"].split(":")[0] == img["name"]:
                    c["image"] = f"{img.get('newName', img['name'])}:{img['newTag']}"
    return docs

yaml.safe_dump_all(render(pathlib.Path(sys.argv[1])), sys.stdout, sort_keys=False)
PY
    fi
  done
done

log "kubernetes-validate --strict, Kubernetes $K8S_VERSIONS"
manifests=$(find deploy/server -name '*.yaml' ! -name kustomization.yaml | sort)
for v in $K8S_VERSIONS; do
  # shellcheck disable=SC2086
  "$VENV/bin/kubernetes-validate" --strict --quiet -k "$v" $manifests "$WORK"/*.yaml ||
    fail "a manifest does not validate against Kubernetes $v (above)"
done

log "promtool: the alerting rules in deploy/prometheus load and fire as their tests say"
command -v promtool >/dev/null 2>&1 || fail "promtool (Debian package prometheus) is needed"
promtool check rules deploy/prometheus/gpuledger-alerts.yaml >/dev/null ||
  fail "deploy/prometheus/gpuledger-alerts.yaml does not load (above)"
promtool test rules deploy/prometheus/gpuledger-alerts.test.yaml ||
  fail "an alerting rule does not fire as deploy/prometheus/gpuledger-alerts.test.yaml says"

log "checking names: renderers agree, flags and references resolve"
"$BIN" serve --help >"$WORK/serve-help.txt"
"$PY" - "$WORK" "${renderers[@]}" <<'PY' || fail "the manifests' names do not hold together (above)"
import base64, pathlib, re, sys, tomllib, yaml

work, renderers = pathlib.Path(sys.argv[1]), sys.argv[2:]
problems = []
def check(ok, what):
    if not ok:
        problems.append(what)

def load(variant, r):
    return [d for d in yaml.safe_load_all((work / f"{variant}.{r}.yaml").read_text()) if d]

# kustomize appends a content hash to generated names; the Python renderer does not.
def key(d):
    name = d["metadata"]["name"]
    if d["kind"] in ("ConfigMap", "Secret"):
        name = re.sub(r"-[a-z0-9]{10}$", "", name)
    return (d["kind"], d["metadata"].get("namespace", ""), name)

for variant in ("kubernetes", "with-ingress"):
    rendered = {r: load(variant, r) for r in renderers}
    first = rendered[renderers[0]]
    for r, docs in rendered.items():
        check(sorted(map(key, docs)) == sorted(map(key, first)),
              f"{variant}: {r} renders {sorted(map(key, docs))}, {renderers[0]} {sorted(map(key, first))}")
    by = {(d["kind"], d["metadata"]["name"]): d for d in first}
    ns = {d["metadata"]["name"] for d in first if d["kind"] == "Namespace"}
    for d in first:
        if d["kind"] != "Namespace":
            check(d["metadata"].get("namespace") in ns, f"{variant}: {key(d)} is not in the namespace it creates")
    [deploy] = [d for d in first if d["kind"] == "Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    [c] = pod["containers"]
    help_text = (work / "serve-help.txt").read_text()
    # Flags the Deployment passes exist in `gpuledger serve --help`.
    check(c["args"][0] == "serve", "the container must run `serve`")
    for a in c["args"][1:]:
        if a.startswith("--"):
            flag = a.split("=")[0]
            check(re.search(rf"(^|\s){re.escape(flag)}[\s=,]", help_text), f"`gpuledger serve` has no flag {flag}")
    # Environment: the variables the binary reads, the Secret it names exists with that key.
    env = {e["name"]: e for e in c.get("env", [])}
    check(set(env) <= {"GPULEDGER_DATABASE_URL", "GPULEDGER_CONFIG", "GPULEDGER_LOG"},
          f"unknown environment variables {sorted(set(env))}")
    ref = env["GPULEDGER_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    secrets = {d["metadata"]["name"]: d for d in first if d["kind"] == "Secret"}
    check(ref["name"] in secrets, f"the Secret {ref['name']} is not rendered")
    if ref["name"] in secrets:
        url = base64.b64decode(secrets[ref["name"]]["data"][ref["key"]]).decode()
        check(url.startswith("postgres"), f"the Secret's {ref['key']} is not a postgres:// URL")
        (work / f"{variant}.database-url").write_text(url)
    # The config file the flags name is the ConfigMap's key, mounted where the flag says.
    if "--config" not in c["args"]:
        problems.append("the container's args do not name the config file (--config FILE)")
        continue
    conf = c["args"][c["args"].index("--config") + 1]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    cms = {d["metadata"]["name"]: d for d in first if d["kind"] == "ConfigMap"}
    found = None
    for vname, path in mounts.items():
        cm = vols[vname].get("configMap")
        if cm and conf.startswith(path.rstrip("/") + "/"):
            check(cm["name"] in cms, f"the ConfigMap {cm['name']} is not rendered")
            found = cms.get(cm["name"], {}).get("data", {}).get(conf[len(path.rstrip("/")) + 1:])
    check(found is not None, f"--config {conf} is in no mounted ConfigMap key")
    if found:
        (work / f"{variant}.gpuledger.toml").write_text(found)
        port = int(tomllib.loads(found)["listen"].rsplit(":", 1)[1])
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        check(ports.get("http") == port, f"containerPort http is {ports.get('http')}, the config listens on {port}")
    # Probes hit the health endpoints on a declared port.
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = c[probe]["httpGet"]
        check(get["path"] == path and get["port"] in {p["name"] for p in c["ports"]},
              f"{probe} must GET {path} on a container port")
    # The Service, the NetworkPolicy and the Ingress reach that port.
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    svc = by[("Service", "gpuledger")]
    check(svc["spec"]["selector"].items() <= pod_labels.items(), "the Service selects no server pod")
    check(all(p["targetPort"] in {"http", port} for p in svc["spec"]["ports"]), "the Service's targetPort is not the server's")
    netpol = by[("NetworkPolicy", "gpuledger")]
    check(netpol["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items(), "the NetworkPolicy selects no server pod")
    check(any(p.get("port") in ("http", port) for r in netpol["spec"]["ingress"] for p in r.get("ports", [])),
          "the NetworkPolicy lets nothing reach the server's port")
    if ("Ingress", "gpuledger") in by:
        for rule in by[("Ingress", "gpuledger")]["spec"]["rules"]:
            for p in rule["http"]["paths"]:
                b = p["backend"]["service"]
                check(b["name"] == "gpuledger" and b["port"] in ({"name": "http"}, {"number": 8080}),
                      "the Ingress does not reach the Service's http port")
    elif variant == "with-ingress":
        problems.append("with-ingress renders no Ingress")
for p in dict.fromkeys(problems):
    print(f"check-deploy: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
log "check-config on the ConfigMap's gpuledger.toml as rendered"
"$BIN" check-config "$WORK/kubernetes.gpuledger.toml" >/dev/null || fail "the rendered ConfigMap's gpuledger.toml has problems (above)"

# --- 3. the Deployment's and the unit's command lines start a server ---------------------------
# start NAME ENV... -- ARGV...: start a server, wait until /healthz and /readyz answer 200.
start() {
  local name=$1 envs=() log
  log=$WORK/$(printf '%s' "$1" | tr -cs 'a-zA-Z0-9' '-').log
  shift
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "$@" >"$log" 2>&1 &
  PIDS+=($!)
  local url=""
  for _ in $(seq 1 600); do
    url=$(sed -n 's/^gpuledger serving on \(http:[^ ]*\)$/\1/p' "$log")
    [ -n "$url" ] && break
    kill -0 "${PIDS[-1]}" 2>/dev/null || { cat "$log" >&2; fail "$name: the server exited"; }
    sleep 0.1
  done
  [ -n "$url" ] || { cat "$log" >&2; fail "$name: the server did not start in 60 s"; }
  for path in /healthz /readyz; do
    curl -fsS -o /dev/null "$url$path" || { cat "$log" >&2; fail "$name: GET $path did not answer 200"; }
  done
  kill "${PIDS[-1]}"
  wait "${PIDS[-1]}" 2>/dev/null || true
  log "$name: started, /healthz and /readyz answered 200 ($url)"
}

# The Deployment: its args, its environment (the Secret's URL: PostgreSQL), the ConfigMap's file
# mounted where --config says; only the listen address moves to a free port on 127.0.0.1.
sed -i 's/^listen = .*/listen = "127.0.0.1:0"/' "$WORK/kubernetes.gpuledger.toml"
mapfile -t deploy_args < <("$PY" -c '
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
[d] = [d for d in docs if d["kind"] == "Deployment"]
print("\n".join(d["spec"]["template"]["spec"]["containers"][0]["args"]))
' "$WORK/kubernetes.${renderers[0]}.yaml")
conf_in_pod=/etc/gpuledger/gpuledger.toml
local_args=()
for a in "${deploy_args[@]}"; do
  [ "$a" = "$conf_in_pod" ] && a=$WORK/kubernetes.gpuledger.toml
  local_args+=("$a")
done
start deployment GPULEDGER_DATABASE_URL="$(cat "$WORK/kubernetes.database-url")" GPULEDGER_LOG=info -- \
  "$BIN" "${local_args[@]}"

# The systemd unit: its ExecStart with its config file (SQLite, as installed) and again with
# GPULEDGER_DATABASE_URL as /etc/gpuledger/gpuledger.env sets it (PostgreSQL).
exec_start=$(sed -n 's/^ExecStart=//p' deploy/server/gpuledger.service)
[ -n "$exec_start" ] || fail "deploy/server/gpuledger.service has no ExecStart"
read -r -a unit_args <<<"$exec_start"
[ "${unit_args[0]}" = /usr/local/bin/gpuledger ] || fail "ExecStart must run /usr/local/bin/gpuledger"
mkdir -p "$WORK/var-lib-gpuledger"
sed -e 's/^listen = .*/listen = "127.0.0.1:0"/' \
  -e "s#/var/lib/gpuledger/#$WORK/var-lib-gpuledger/#" \
  deploy/server/gpuledger.toml >"$WORK/unit.gpuledger.toml"
unit_args=("$BIN" "${unit_args[@]:1}")
for i in "${!unit_args[@]}"; do
  [ "${unit_args[$i]}" = /etc/gpuledger/gpuledger.toml ] && unit_args[$i]=$WORK/unit.gpuledger.toml
done
start "systemd unit (SQLite)" GPULEDGER_LOG=info -- "${unit_args[@]}"
[ -s "$WORK/var-lib-gpuledger/gpuledger.db" ] || fail "the unit's SQLite database was not created in its state directory"
psql "$PG_ADMIN_URL" -qc "DROP DATABASE $PG_DB" -c "CREATE DATABASE $PG_DB" >/dev/null
start "systemd unit (PostgreSQL)" GPULEDGER_DATABASE_URL="$PG_URL" GPULEDGER_LOG=info -- "${unit_args[@]}"

# --- 4. systemd unit -----------------------------------------------------------------------------
log "systemd-analyze verify and security"
mkdir -p "$WORK/unit"
sed "s#/usr/local/bin/gpuledger#$BIN#" deploy/server/gpuledger.service >"$WORK/unit/gpuledger.service"
verify=$(systemd-analyze verify "$WORK/unit/gpuledger.service" 2>&1) || true
[ -z "$verify" ] || fail "systemd-analyze verify deploy/server/gpuledger.service: $verify"
systemd-analyze security --offline=true --threshold=20 "$WORK/unit/gpuledger.service" >"$WORK/unit/security.txt" 2>&1 ||
  { tail -n 3 "$WORK/unit/security.txt" >&2; fail "the unit's sandbox rates worse than 2.0 (systemd-analyze security)"; }
log "$(tail -n 1 "$WORK/unit/security.txt")"

# --- 5. the image ------------------------------------------------------------------------------
if ! command -v buildah >/dev/null; then
  [ "$(id -u)" = 0 ] || fail "buildah is missing: install it (Debian: apt-get install buildah)"
  log "installing buildah"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah >/dev/null
fi
log "building the static binary (crt-static) for the image"
RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked -q -p gpuledger \
  --target x86_64-unknown-linux-gnu
static=target/x86_64-unknown-linux-gnu/release/gpuledger
if ldd "$static" >/dev/null 2>&1 && ! ldd "$static" 2>&1 | grep -q 'statically linked'; then
  fail "$static is not static: $(ldd "$static" | tr '\n' ' ')"
fi
mkdir -p "$WORK/image"
cp "$static" /etc/ssl/certs/ca-certificates.crt "$WORK/image/"
B=(buildah --root "$WORK/containers" --runroot "$WORK/containers-run" --storage-driver vfs)
log "buildah build deploy/server/Containerfile (BINARY=prebuilt)"
"${B[@]}" build --quiet --isolation chroot -f deploy/server/Containerfile --build-arg BINARY=prebuilt \
  -t localhost/gpuledger:check "$WORK/image" >/dev/null || fail "buildah could not build deploy/server/Containerfile"
cfg=$("${B[@]}" inspect --type image --format '{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' localhost/gpuledger:check)
[ "$cfg" = '65532:65532 [/usr/local/bin/gpuledger]' ] || fail "the image's user and entrypoint are $cfg"
ctr=$("${B[@]}" from --quiet localhost/gpuledger:check)
root=$("${B[@]}" mount "$ctr")
files=$(cd "$root" && find . -type f | sort | tr '\n' ' ')
[ "$files" = "./etc/ssl/certs/ca-certificates.crt ./usr/local/bin/gpuledger " ] || fail "the image holds more than the binary and the CA bundle: $files"
# What a container runtime adds: /etc/hosts and /etc/resolv.conf, here naming a DNS server on
# 127.0.0.153 that answers every name with 127.0.0.1, so that the database is reached by a
# Service-like name through DNS, as in a cluster (the static binary has no NSS modules to load).
printf '127.0.0.1 localhost\n' >"$root/etc/hosts"
printf 'nameserver 127.0.0.153\n' >"$root/etc/resolv.conf"
"$PY" - >"$WORK/dns.log" 2>&1 <<'PY' &
import socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.153", 53))
s.settimeout(300)
while True:
    q, addr = s.recvfrom(512)
    end = 12
    while q[end]:
        end += q[end] + 1
    qtype = struct.unpack("!H", q[end + 1:end + 3])[0]
    a = qtype == 1  # A: 127.0.0.1; anything else: no answer
    reply = struct.pack("!HHHHHH", struct.unpack("!H", q[:2])[0], 0x8180, 1, int(a), 0, 0)
    reply += q[12:end + 5]
    if a:
        reply += struct.pack("!HHHLH", 0xC00C, 1, 1, 60, 4) + socket.inet_aton("127.0.0.1")
    s.sendto(reply, addr)
PY
PIDS+=($!)
# The ConfigMap's file where the Deployment mounts it, the Deployment's arguments.
mkdir -p "$root$(dirname "$conf_in_pod")"
cp "$WORK/kubernetes.gpuledger.toml" "$root$conf_in_pod"
psql "$PG_ADMIN_URL" -qc "DROP DATABASE $PG_DB" -c "CREATE DATABASE $PG_DB" >/dev/null
start "image (as 65532, chrooted)" \
  GPULEDGER_DATABASE_URL="${PG_URL/127.0.0.1/postgres.gpuledger-server.svc.cluster.local}" GPULEDGER_LOG=info -- \
  chroot --userspec=65532:65532 "$root" /usr/local/bin/gpuledger "${deploy_args[@]}"
"${B[@]}" umount "$ctr" >/dev/null
"${B[@]}" rm "$ctr" >/dev/null
"${B[@]}" rmi --all --force >/dev/null

psql "$PG_ADMIN_URL" -qc "DROP DATABASE $PG_DB" >/dev/null
log "deploy/server: every check passed"
