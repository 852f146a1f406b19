# Test tools built from Go modules (the machine reaches the Go module proxy, not GitHub or
# dl.k8s.io): helm, etcd, kube-apiserver, kube-controller-manager, kubectl.
# Real binaries are cached per version in $(TOOLS_CACHE)/<tool>-<version>/ (shared by every
# clone on the machine, so CI's fresh clone reuses them) and symlinked into .tools/bin.
# A missing binary is built (needs only Go); a cached one is just linked.
HELM_VERSION ?= v3.22.0
K8S_VERSION  ?= v1.35.4
ETCD_VERSION ?= v3.6.16
COREDNS_VERSION ?= v1.15.0
# Prometheus 3.x (module versions v0.3xx): Debian's 2.42 has no Kubernetes service discovery.
PROMETHEUS_VERSION ?= v0.316.0
# Traefik: the Ingress controller of the e2e (v3.7 needs a nested module the module proxy refuses).
TRAEFIK_VERSION ?= v3.6.12
# cosign signs the release (images and chart) and the e2e verifies it. v3.1.x is the newest line the
# Go module proxy serves.
COSIGN_VERSION ?= v3.1.3
TOOLS_CACHE  ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/opsgate-tools
export OPSGATE_TOOLS_CACHE := $(TOOLS_CACHE)

##@ Build
.PHONY: tools tools-helm tools-k8s tools-etcd tools-coredns tools-prometheus tools-traefik tools-cosign
tools: tools-helm tools-etcd tools-k8s tools-coredns tools-prometheus tools-traefik ## Build/link helm, etcd, Kubernetes (apiserver, controller-manager, scheduler, kubelet, kube-proxy, kubectl), CoreDNS, Prometheus, Traefik into .tools/bin

tools-helm: ## helm (HELM_VERSION) built from helm.sh/helm/v3 (built once per version and machine; cold times: README, Tests)
	@hack/build-tool.sh helm $(HELM_VERSION)

tools-etcd: ## etcd (ETCD_VERSION) built from go.etcd.io/etcd/server/v3 (built once per version and machine; cold times: README, Tests)
	@hack/build-tool.sh etcd $(ETCD_VERSION)

tools-k8s: ## kube-apiserver, -controller-manager, -scheduler, kubelet, kube-proxy, kubectl (K8S_VERSION) from k8s.io/kubernetes (built once per version and machine; cold times: README, Tests)
	@hack/build-tool.sh k8s $(K8S_VERSION)

tools-coredns: ## CoreDNS (COREDNS_VERSION), only the plugins the test node uses, for its cluster DNS (built once per version and machine; cold times: README, Tests)
	@hack/build-tool.sh coredns $(COREDNS_VERSION)

tools-prometheus: ## Prometheus (PROMETHEUS_VERSION) with Kubernetes service discovery for the e2e alert loop (built once per version and machine; cold times: README, Tests)
	@hack/build-tool.sh prometheus $(PROMETHEUS_VERSION)

tools-traefik: ## Traefik (TRAEFIK_VERSION), the e2e's Ingress controller, from github.com/traefik/traefik/v3, and its CRDs (built once per version and machine; cold times: README, Tests)
	@hack/build-tool.sh traefik $(TRAEFIK_VERSION)
	@hack/traefik-crds.sh $(TRAEFIK_VERSION) .tools/traefik

tools-cosign: ## cosign (COSIGN_VERSION) from github.com/sigstore/cosign/v3, to sign and verify the release (built once per version and machine; cold times: README, Tests)
	@hack/build-tool.sh cosign $(COSIGN_VERSION)
