# The README's two commands are `make demo` and `make test`; everything else is for developers.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo
# The test bed's binaries: KUBEBUILDER_ASSETS if set, else built once and cached (~10 min cold).
ASSETS = $(shell bash hack/testbed-assets.sh)

.PHONY: all build test unit e2e demo lint fmt bench assets tools clean

all: build

build:
	$(CARGO) build --all-targets

assets:
	@bash hack/testbed-assets.sh

# Unit tests, then e2e tests against real kube-apiservers.
test:
	@assets="$$(bash hack/testbed-assets.sh)" && \
	KUBEBUILDER_ASSETS="$$assets" $(CARGO) test --lib --bins --tests

unit:
	$(CARGO) test --lib

e2e:
	@assets="$$(bash hack/testbed-assets.sh)" && \
	KUBEBUILDER_ASSETS="$$assets" $(CARGO) test --test '*'

# A local fleet of three hosted clusters; Ctrl-C stops it and removes everything.
demo:
	@assets="$$(bash hack/testbed-assets.sh)" && $(CARGO) build --bin hcp-fleet-agent && \
	KUBEBUILDER_ASSETS="$$assets" ./target/debug/hcp-fleet-agent dev --hosted-clusters 3

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	@bash hack/advisories.sh

fmt:
	$(CARGO) fmt --all

# The admission service under load (BENCH_SECONDS), then the agent against 16 real hosted
# kube-apiservers (BENCH_HOSTED, BENCH_IDLE_SECONDS).
bench:
	$(CARGO) bench --bench admission
	@assets="$$(bash hack/testbed-assets.sh)" && \
	KUBEBUILDER_ASSETS="$$assets" $(CARGO) bench --bench fleet

clean:
	$(CARGO) clean
