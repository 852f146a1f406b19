# Release: both images and the packaged chart of one version (package.json "version" = the chart's
# appVersion = the image tag), and their publication to any OCI registry.
.PHONY: release push
release: deps node-deps tools-helm ## Build both images and helm package the chart into artifacts/ (versions checked to agree)
	hack/release.sh build

push: ## Push both images (podman) and the chart (helm push oci://) to REGISTRY=host[:port][/path]; REGISTRY_INSECURE=1 for plain HTTP
	@test -n "$(REGISTRY)" || { echo "usage: make push REGISTRY=host[:port][/path] [REGISTRY_INSECURE=1]" >&2; exit 2; }
	REGISTRY=$(REGISTRY) REGISTRY_INSECURE=$(or $(REGISTRY_INSECURE),0) hack/release.sh push
