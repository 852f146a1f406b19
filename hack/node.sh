#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, for the end-to-end tests and for a user who
# wants to try the chart locally: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# containerd (Debian), kubelet, kube-proxy (iptables) and CoreDNS, every binary built by
# hack/build-tool.sh (k8s, etcd, coredns) and every image by hack/images.sh.
#
#   hack/node.sh up      start everything, wait for the node to be Ready and DNS to answer;
#                        prints the env file (KUBECONFIG=..., NODE_IP=...) to source
#   hack/node.sh down    stop everything and restore every side effect (see below); idempotent
#   hack/node.sh status  is it up?
#
# An OCI registry (docker-registry) on 127.0.0.1:25000 is part of the node: what is pushed there is
# what the kubelet pulls (containerd's registry config), as from any registry.
#
# Network (workplace rule: only loopback or addresses the test creates): the script creates the bridge
# opsgate0 with 10.244.0.1/24 before anything starts. The apiserver, kubelet and CoreDNS listen on that
# address; etcd, controller-manager, scheduler and kube-proxy's health/metrics on 127.0.0.1. Pods get
# 10.244.0.x on the bridge (CNI bridge + host-local from Debian's containernetworking-plugins), Services
# 10.96.0.0/16 (routed to the bridge). No masquerade to the outside, no port on any other address.
#
# Side effects restored by `down`: the sysctls the kubelet, kube-proxy and this script change
# (recorded before `up`), kube-proxy's KUBE-* and any CNI-* iptables chains, the bridge and route,
# pod network namespaces, every mount under the state dir, the kubepods cgroups, the state dir itself.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${OPSGATE_TOOLS_BIN:-$ROOT/.tools/bin}
STATE=${OPSGATE_NODE_DIR:-/tmp/opsgate-node}
BRIDGE=opsgate0
NODE_IP=10.244.0.1
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
DNS_IP=10.96.0.10
API_PORT=6443
# The node's OCI registry (Debian's docker-registry, CNCF distribution): loopback only; containerd
# pulls from it over plain HTTP (hosts.toml below), `make push REGISTRY=$REGISTRY_ADDR/...` fills it.
# Its port is below Linux's ephemeral range (32768-60999): a port in that range can be held, at the
# moment the registry binds, by any outgoing connection of the tests that ran before (bind fails).
REGISTRY_ADDR=127.0.0.1:${OPSGATE_REGISTRY_PORT:-25000}
NODE_NAME=opsgate-node
K8S_VERSION=${K8S_VERSION:-v1.35.4}
PAUSE_IMAGE=localhost/pause:$K8S_VERSION
SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward
  net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables net.netfilter.nf_conntrack_max
  net.netfilter.nf_conntrack_tcp_timeout_established net.netfilter.nf_conntrack_tcp_timeout_close_wait)

log() { echo "[node $(date +%T)] $*" >&2; }
die() { echo "node.sh: $*" >&2; exit 1; }

need() {
  local missing=()
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl coredns; do
    [[ -x $BIN/$b ]] || missing+=("$b")
  done
  [[ ${#missing[@]} == 0 ]] || die "missing ${missing[*]} in $BIN (make tools)"
  for c in containerd ctr runc iptables ip openssl docker-registry; do command -v "$c" >/dev/null || missing+=("$c"); done
  [[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
  [[ ${#missing[@]} == 0 ]] || die "missing ${missing[*]} (make node-deps)"
}

# ---------------------------------------------------------------------------------------------------
certs() {
  local d=$STATE/pki; mkdir -p "$d"; cd "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 7 -subj /CN=opsgate-node-ca \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
  issue() { # name subject san extendedKeyUsage
    openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
    { [[ -n $3 ]] && echo "subjectAltName=$3"; echo "extendedKeyUsage=$4"; echo "keyUsage=critical,digitalSignature,keyEncipherment"; } >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 7 -extfile "$1.ext" 2>/dev/null
  }
  issue apiserver /CN=kube-apiserver \
    "IP:$NODE_IP,IP:10.96.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" serverAuth
  issue admin "/O=system:masters/CN=opsgate-admin" "" clientAuth
  issue kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME" "serverAuth,clientAuth"
  issue kube-controller-manager /CN=system:kube-controller-manager "" clientAuth
  issue kube-scheduler /CN=system:kube-scheduler "" clientAuth
  issue kube-proxy /CN=system:kube-proxy "" clientAuth
  issue coredns "/O=system:masters/CN=opsgate-coredns" "" clientAuth
  issue apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "" clientAuth
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  cd - >/dev/null
}

kubeconfig() { # name -> $STATE/<name>.kubeconfig with its client certificate
  local n=$1 d=$STATE/pki
  cat >"$STATE/$n.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: opsgate-node
  cluster:
    server: https://$NODE_IP:$API_PORT
    certificate-authority: $d/ca.crt
users:
- name: $n
  user:
    client-certificate: $d/$n.crt
    client-key: $d/$n.key
contexts:
- name: opsgate-node
  context: {cluster: opsgate-node, user: $n}
current-context: opsgate-node
EOF
}

start() { # name args... (background, log in $STATE/logs/<name>.log, pid in $STATE/pids/<name>)
  local n=$1; shift
  "$@" >>"$STATE/logs/$n.log" 2>&1 &
  echo $! >"$STATE/pids/$n"
}

wait_for() { # what seconds command...
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { log "timed out waiting for $what"; tail -n 30 "$STATE"/logs/*.log >&2 || true; return 1; }
    sleep 0.5
  done
  log "$what"
}

KC() { "$BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig" "$@"; }
node_ready() { [[ $(KC get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]; }

# ---------------------------------------------------------------------------------------------------
up() {
  need
  [[ -e $STATE/up ]] && { log "already up ($STATE)"; env_file; return; }
  [[ -d $STATE ]] && down
  mkdir -p "$STATE"/{logs,pids,etcd,kubelet,pod-logs,containerd/root,containerd/state,cni/net.d,cni/ipam,registry/data}
  local t0=$SECONDS

  # Side effects are recorded first, so `down` can restore them even after a failed `up`.
  for s in "${SYSCTLS[@]}"; do v=$(sysctl -n "$s" 2>/dev/null) && echo "$s=$v"; done >"$STATE/sysctl.before"
  ls /run/netns 2>/dev/null | sort >"$STATE/netns.before" || true

  ip link add "$BRIDGE" type bridge
  ip addr add "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # Host -> Service traffic leaves from the bridge address (kube-proxy DNATs it in OUTPUT).
  ip route add "$SERVICE_CIDR" dev "$BRIDGE" src "$NODE_IP"
  sysctl -qw net.ipv4.ip_forward=1

  certs
  for n in admin kubelet kube-controller-manager kube-scheduler kube-proxy coredns; do kubeconfig "$n"; done
  local pki=$STATE/pki

  # etcd (127.0.0.1 only)
  start etcd "$BIN/etcd" --name node --data-dir "$STATE/etcd" \
    --listen-client-urls http://127.0.0.1:32379 --advertise-client-urls http://127.0.0.1:32379 \
    --listen-peer-urls http://127.0.0.1:32380 --initial-advertise-peer-urls http://127.0.0.1:32380 \
    --initial-cluster node=http://127.0.0.1:32380 --unsafe-no-fsync --log-level warn
  wait_for "etcd healthy" 60 curl -fsS http://127.0.0.1:32379/health

  start kube-apiserver "$BIN/kube-apiserver" --etcd-servers http://127.0.0.1:32379 \
    --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port "$API_PORT" \
    --service-cluster-ip-range "$SERVICE_CIDR" --service-node-port-range 30000-30100 \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" --client-ca-file "$pki/ca.crt" \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --allow-privileged=true --profiling=false --v=1
  wait_for "apiserver ready" 120 curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "https://$NODE_IP:$API_PORT/readyz"

  start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$STATE/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig "$STATE/kube-controller-manager.kubeconfig" --authorization-kubeconfig "$STATE/kube-controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 10257 --leader-elect=false \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" --use-service-account-credentials \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --controllers '*,-nodeipam' --v=1
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$STATE/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$STATE/kube-scheduler.kubeconfig" --authorization-kubeconfig "$STATE/kube-scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 10259 --leader-elect=false --v=1

  cat >"$STATE/registry/config.yml" <<EOF
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: $STATE/registry/data}
  delete: {enabled: true}
http:
  addr: $REGISTRY_ADDR
EOF
  start registry docker-registry serve "$STATE/registry/config.yml"
  wait_for "registry on $REGISTRY_ADDR" 30 curl -fsS "http://$REGISTRY_ADDR/v2/"
  mkdir -p "$STATE/containerd/certs.d/$REGISTRY_ADDR"
  cat >"$STATE/containerd/certs.d/$REGISTRY_ADDR/hosts.toml" <<EOF
server = "http://$REGISTRY_ADDR"
[host."http://$REGISTRY_ADDR"]
  capabilities = ["pull", "resolve"]
EOF

  # containerd (Debian) with its own root, state, socket and CNI config.
  cat >"$STATE/containerd/config.toml" <<EOF
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
[grpc]
  address = "$STATE/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Without CAP_SYS_RESOURCE the pause container's oom_score_adj (-998) cannot be written.
  restrict_oom_score_adj = true
  enable_cdi = false
  # pod network namespaces under the state dir: nothing left in /run/netns
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$STATE/containerd/certs.d"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
EOF
  cat >"$STATE/cni/net.d/10-opsgate.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "opsgate",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": { "type": "host-local", "dataDir": "$STATE/cni/ipam",
                "ranges": [[{ "subnet": "$POD_CIDR", "rangeStart": "10.244.0.10", "gateway": "$NODE_IP" }]],
                "routes": [{ "dst": "0.0.0.0/0" }] }
    },
    { "type": "loopback" }
  ]
}
EOF
  start containerd containerd --config "$STATE/containerd/config.toml"
  wait_for "containerd up" 60 ctr --address "$STATE/containerd/containerd.sock" version
  log "loading images into containerd"
  "$ROOT/hack/images.sh" load "$STATE/containerd/containerd.sock"

  # kubelet
  : >"$STATE/resolv.conf"   # pods get no upstream resolver: cluster DNS only
  cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
tlsCertFile: $pki/kubelet.crt
tlsPrivateKeyFile: $pki/kubelet.key
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
resolvConf: $STATE/resolv.conf
containerRuntimeEndpoint: unix://$STATE/containerd/containerd.sock
podLogsDir: $STATE/pod-logs
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
maxPods: 60
# A changed Secret reaches its mounted volume at the pod's next sync: every syncFrequency, up to
# 1.5 times it with the kubelet's jitter (default 1m). Shorter here so the rotation e2e
# (test/e2e/node/tlsRotation.test.ts) waits seconds, not minutes; kubelet.yaml is read by that test.
syncFrequency: 10s
EOF
  start kubelet "$BIN/kubelet" --config "$STATE/kubelet.yaml" --kubeconfig "$STATE/kubelet.kubeconfig" \
    --root-dir "$STATE/kubelet" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v=1

  # kube-proxy (iptables): health and metrics on loopback, NodePorts only on the bridge address.
  cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$NODE_IP/32"]
iptables: {masqueradeAll: true}
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  start kube-proxy "$BIN/kube-proxy" --config "$STATE/kube-proxy.yaml" --v=1

  wait_for "node $NODE_NAME Ready" 180 node_ready

  # Cluster DNS: CoreDNS as a host process on the bridge address behind the kube-dns Service.
  cat >"$STATE/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    errors
    health 127.0.0.1:18080
    ready 127.0.0.1:18181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $STATE/coredns.kubeconfig opsgate-node
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
EOF
  start coredns "$BIN/coredns" -conf "$STATE/Corefile"
  wait_for "coredns ready" 60 curl -fsS http://127.0.0.1:18181/ready
  KC apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $DNS_IP
  ports: [{name: dns, port: 53, protocol: UDP, targetPort: 53}, {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns}
addressType: IPv4
endpoints: [{addresses: ["$NODE_IP"], conditions: {ready: true}}]
ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
EOF
  # The default ServiceAccount must exist before pods can be created in a namespace.
  wait_for "default ServiceAccount" 60 KC get serviceaccount default -n default
  touch "$STATE/up"
  log "up in $((SECONDS - t0))s"
  env_file
}

env_file() {
  cat >"$STATE/env" <<EOF
KUBECONFIG=$STATE/admin.kubeconfig
OPSGATE_NODE_DIR=$STATE
NODE_IP=$NODE_IP
CONTAINERD_ADDRESS=$STATE/containerd/containerd.sock
REGISTRY_ADDR=$REGISTRY_ADDR
EOF
  cat "$STATE/env"
}

# ---------------------------------------------------------------------------------------------------
stop_pid() { # name signal-grace-seconds
  local f=$STATE/pids/$1 pid
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 $(( ${2:-10} * 10 ))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

down() {
  [[ -d $STATE ]] || { log "not up"; return 0; }
  log "tearing down $STATE"
  stop_pid kubelet 10
  stop_pid kube-proxy 5
  stop_pid coredns 5
  # Every pod container: killed through containerd (the kubelet is gone, nothing restarts them).
  local sock=$STATE/containerd/containerd.sock
  if [[ -S $sock ]] && ctr --address "$sock" version >/dev/null 2>&1; then
    local ids; ids=$(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null || true)
    for id in $ids; do ctr --address "$sock" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    for id in $ids; do
      for _ in $(seq 1 50); do ctr --address "$sock" -n k8s.io tasks delete "$id" >/dev/null 2>&1 && break; sleep 0.1; done
    done
  fi
  stop_pid containerd 10
  # Leftover shims of this containerd (their sockets/bundles live under the state dir).
  pkill -KILL -f "containerd-shim-runc-v2 -namespace k8s.io -id .* -address $sock" 2>/dev/null || true
  for n in kube-scheduler kube-controller-manager kube-apiserver etcd registry; do stop_pid "$n" 10; done

  # Pod network namespaces made by CNI during this run.
  if [[ -d /run/netns ]]; then
    comm -13 "$STATE/netns.before" <(ls /run/netns | sort) 2>/dev/null | while read -r ns; do
      [[ $ns == cni-* ]] || continue
      umount "/run/netns/$ns" 2>/dev/null || true; rm -f "/run/netns/$ns"
    done
  fi
  # Mounts under the state dir (kubelet volumes, containerd rootfs/shm), deepest first.
  awk -v d="$STATE" '$2 ~ "^"d {print $2}' /proc/self/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  # kubepods cgroups made by the kubelet (cgroupfs driver), deepest first.
  for c in /sys/fs/cgroup/*/; do
    [[ -d ${c}kubepods ]] || [[ -d ${c}kubepods.slice ]] || continue
    find "${c}kubepods" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  # iptables: kube-proxy's own cleanup, then any KUBE-*/CNI-* chain left behind.
  if [[ -x $BIN/kube-proxy ]]; then "$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true; fi
  # (IPv4 and IPv6: the kubelet writes its canary and firewall chains into both)
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle; do
      "$ipt" -t "$t" -S 2>/dev/null | awk '/^-A / && / -j (KUBE-|CNI-)/' | sed 's/^-A/-D/' | while read -r r; do eval "$ipt" -t "$t" "$r" 2>/dev/null || true; done
      for ch in $("$ipt" -t "$t" -S 2>/dev/null | awk '/^-N (KUBE-|CNI-)/ {print $2}'); do "$ipt" -t "$t" -F "$ch" 2>/dev/null || true; done
      for ch in $("$ipt" -t "$t" -S 2>/dev/null | awk '/^-N (KUBE-|CNI-)/ {print $2}'); do "$ipt" -t "$t" -X "$ch" 2>/dev/null || true; done
    done
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  # veth host ends left on no bridge
  if [[ -f $STATE/sysctl.before ]]; then
    while IFS='=' read -r k v; do sysctl -qw "$k=$v" 2>/dev/null || true; done <"$STATE/sysctl.before"
  fi
  rm -rf "$STATE"
  log "down"
}

status() { [[ -e $STATE/up ]] && KC get nodes -o wide; }

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: node.sh up|down|status" >&2; exit 2 ;;
esac
