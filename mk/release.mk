# Release: both images and the packaged chart of one version (package.json "version" = the chart's
# appVersion = the image tag), and their publication to any OCI registry, signed with cosign.
# PLATFORMS (linux/amd64, linux/arm64, comma-separated; default this machine's) are the images'
# platforms: with two, each image is pushed as one OCI image index under one tag.
PLATFORMS ?=
.PHONY: release push
release: deps node-deps tools-helm ## Build the images for PLATFORMS, their SBOMs, the packaged chart (artifacts/); with REGISTRY, push and sign them too
	PLATFORMS=$(PLATFORMS) hack/release.sh build
	@if [ -n "$(REGISTRY)" ]; then $(MAKE) push; fi

push: ## Push the images (or their index) and the chart to REGISTRY=host[:port][/path] and sign them (COSIGN_KEY); REGISTRY_INSECURE=1 for plain HTTP
	@test -n "$(REGISTRY)" || { echo "usage: make push REGISTRY=host[:port][/path] COSIGN_KEY=<key> [REGISTRY_INSECURE=1]" >&2; exit 2; }
	@$(MAKE) tools-cosign
	REGISTRY=$(REGISTRY) REGISTRY_INSECURE=$(or $(REGISTRY_INSECURE),0) hack/release.sh push
