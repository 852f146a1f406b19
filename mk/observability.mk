# Observability: promtool (metrics/rules checks) and a headless Chromium for the Bull Board e2e test.
# Both come from Debian packages (apt-get as root); nothing is downloaded outside the package registries.
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends
PROMTOOL ?= $(shell command -v promtool 2>/dev/null || echo /usr/bin/promtool)
export PROMTOOL

##@ Build
.PHONY: tools-prom
tools-prom: ## Install promtool (Debian package prometheus) if missing
	@if ! command -v promtool >/dev/null 2>&1 && [ ! -x /usr/bin/promtool ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get -o DPkg::Lock::Timeout=600 update -qq && $(APT_INSTALL) prometheus >/dev/null; \
	  else echo "promtool missing: apt-get install prometheus (or set PROMTOOL)" >&2; exit 1; fi; \
	fi
	@promtool --version 2>&1 | head -1

.PHONY: chromium
chromium: ## Install Debian's chromium (headless browser for test/integration/browser) if missing
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get -o DPkg::Lock::Timeout=600 update -qq && $(APT_INSTALL) chromium fonts-dejavu-core >/dev/null; \
	  else echo "chromium missing: apt-get install chromium (or set CHROMIUM_PATH)" >&2; exit 1; fi; \
	fi
	@/usr/bin/chromium --version 2>/dev/null | head -1

##@ Test
.PHONY: test-observability
test-observability: deps redis tools-prom build ## Metrics server, real-scrape promtool checks, alert rule unit tests, dashboard, Bull Board access
	$(JEST) --ci test/unit/observability test/integration/observability

.PHONY: test-browser
test-browser: deps redis chromium build ## Bull Board end to end in headless Chromium (screenshot in artifacts/)
	$(JEST) --ci test/integration/browser
