# The import layers (.dependency-cruiser.cjs): routes -> domain -> shared, middleware -> shared,
# worker -> shared, never upward, no cycles.
.PHONY: lint-layers
lint-layers: deps ## Check the import layers of src/ and worker/ (dependency-cruiser)
	npx depcruise --config .dependency-cruiser.cjs src worker
