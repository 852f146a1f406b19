# End to end on a real node: images built by podman (hack/images.sh), a single-node cluster whose
# kubelet runs them (hack/node.sh: etcd, kube-apiserver, controller-manager, scheduler, containerd,
# kubelet, kube-proxy, CoreDNS), the chart installed as a user installs it, Prometheus and
# Alertmanager (Debian packages) closing the alert loop. Needs root (bridge, iptables, mounts).
NODE_APT := podman buildah debootstrap runc conmon containernetworking-plugins fuse-overlayfs uidmap iptables \
  containerd conntrack catatonit prometheus prometheus-alertmanager libatomic1 gcc libc6-dev
E2E_JEST_ARGS ?=
# test/node/registry.test.ts runs last, on its own: once containerd (Debian's 1.6) has pulled an image
# from the registry, its CRI no longer finds the same image under the side-loaded localhost/ name
# (pullPolicy Never), which the other files install with.

.PHONY: node-deps images node-up node-down e2e
node-deps: ## Container engine, containerd, CNI plugins, Prometheus, Alertmanager (Debian packages, as root)
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

e2e: deps tools node-deps images release ## End-to-end on a real node: helm install --wait/test, jobs in pods, alert loop (~10 min)
	@mkdir -p artifacts; start=$$(date +%s); rc=0; \
	hack/node.sh up >artifacts/node-up.log 2>&1 || { rc=$$?; tail -40 artifacts/node-up.log; }; \
	if [ $$rc = 0 ]; then \
	  $(JEST) --ci -c test/node/jest.config.js --testPathIgnorePatterns /node_modules/ test/node/registry.test.ts $(E2E_JEST_ARGS) || rc=$$?; \
	  $(JEST) --ci -c test/node/jest.config.js test/node/registry.test.ts || rc=$$?; \
	fi; \
	hack/node.sh down >>artifacts/node-up.log 2>&1 || rc=1; \
	echo "e2e: node + tests took $$(( $$(date +%s) - start ))s"; exit $$rc
