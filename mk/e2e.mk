# `make e2e`: every test that needs Kubernetes. The control-plane suite (test/e2e/controlplane: etcd,
# kube-apiserver, kube-controller-manager built by mk/tools.mk), then end to end on a real node:
# images built by podman (hack/images.sh), a single-node cluster whose kubelet runs them (hack/node.sh:
# etcd, kube-apiserver, controller-manager, scheduler, containerd, kubelet, kube-proxy, CoreDNS), the chart installed as a user installs it, Prometheus and
# Alertmanager (Debian packages) closing the alert loop. Needs root (bridge, iptables, mounts).
NODE_APT := podman buildah debootstrap runc conmon containernetworking-plugins fuse-overlayfs uidmap iptables gnupg jq qemu-user-static binfmt-support \
  iproute2 openssl containerd conntrack catatonit docker-registry prometheus prometheus-alertmanager libatomic1 gcc libc6-dev
E2E_JEST_ARGS ?=
# The release's platforms make e2e builds and tests: test/e2e/node/images.test.ts runs each image of
# each (arm64 through qemu-user-static), registry.test.ts pushes and verifies their index.
E2E_PLATFORMS ?= linux/amd64,linux/arm64
# test/e2e/node/registry.test.ts runs last, on its own: once containerd (Debian's 1.6) has pulled an image
# from the registry, its CRI no longer finds the same image under the side-loaded localhost/ name
# (pullPolicy Never), which the other files install with.

##@ Cluster

.PHONY: node-deps images node-up node-down e2e e2e-tools
node-deps: ## Container engine, qemu-user-static (the arm64 images), containerd, CNI plugins, the node's OCI registry, Prometheus, Alertmanager, gnupg (Debian packages, as root)
	@missing=""; for p in $(NODE_APT); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get -o DPkg::Lock::Timeout=600 update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else echo "missing Debian packages:$$missing (apt-get install them as root)" >&2; exit 1; fi; \
	fi

images: deps node-deps ## Build the api/worker images with podman (+ Debian-made Node base, redis/curl and pause images; cold ~6 min)
	hack/images.sh all

node-up: tools node-deps images ## Start the single-node test cluster (hack/node.sh up; KUBECONFIG in /tmp/opsgate-node/env)
	hack/node.sh up

node-down: ## Stop the test cluster and restore every side effect (sysctls, iptables, bridge, mounts)
	hack/node.sh down

# The images (every platform of E2E_PLATFORMS) beside the tool builds, E2E_TOOLS_JOBS of those at a
# time: a Go build leaves a core idle while it downloads modules and links, the image build while it
# downloads and unpacks packages. The images start at once in their own make, since one make -j
# picks among ready targets in no fixed order and would queue them behind the Go builds.
E2E_TOOLS_JOBS ?= 2
e2e-tools: deps redis node-deps ## Install/build what `make e2e` uses (Kubernetes, etcd, CoreDNS, Prometheus, Traefik, cosign from source; images; the release for E2E_PLATFORMS)
	@$(MAKE) images PLATFORMS=$(E2E_PLATFORMS) & images=$$!; \
	$(MAKE) -j$(E2E_TOOLS_JOBS) tools tools-cosign; rc=$$?; \
	wait $$images || rc=1; exit $$rc
	$(MAKE) release PLATFORMS=$(E2E_PLATFORMS)

##@ Test
e2e: e2e-tools ## Kubernetes tests: the control-plane suite, then the real node (helm install --wait/test, registry, Ingress, jobs in pods, alert loop)
	@mkdir -p artifacts; rm -f artifacts/jest-controlplane.json artifacts/jest-node.json artifacts/jest-registry.json; start=$$(date +%s); rc=0; \
	export PLATFORMS=$(E2E_PLATFORMS); \
	$(JEST) --ci -c test/e2e/controlplane/jest.config.js --json --outputFile=artifacts/jest-controlplane.json || rc=1; \
	up=0; hack/node.sh up >artifacts/node-up.log 2>&1 || { up=1; rc=1; tail -40 artifacts/node-up.log; }; \
	if [ $$up = 0 ]; then \
	  $(JEST) --ci -c test/e2e/node/jest.config.js --testPathIgnorePatterns /node_modules/ 'registry\.test\.ts' --json --outputFile=artifacts/jest-node.json $(E2E_JEST_ARGS) || rc=1; \
	  $(JEST) --ci -c test/e2e/node/jest.config.js test/e2e/node/registry.test.ts --json --outputFile=artifacts/jest-registry.json || rc=1; \
	fi; \
	hack/node.sh down >>artifacts/node-up.log 2>&1 || rc=1; \
	$(SUMMARY) --label e2e artifacts/jest-controlplane.json artifacts/jest-node.json artifacts/jest-registry.json || rc=1; \
	echo "make e2e: $$(( $$(date +%s) - start ))s after its tools"; exit $$rc
