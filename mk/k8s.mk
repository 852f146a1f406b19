# Tests against a real control plane (etcd + kube-apiserver + kube-controller-manager built by
# mk/tools.mk), one shared cluster for the suite (test/helpers/controlPlaneSetup.ts).
##@ Test
.PHONY: test-k8s
test-k8s: deps redis tools ## Kubernetes tests: chart apply, helm install/upgrade/uninstall, RBAC, worker jobs on a real apiserver
	$(JEST) --ci -c test/e2e/controlplane/jest.config.js
