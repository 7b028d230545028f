# The README's two commands are `make demo` and `make test`; everything else is for developers.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo

.PHONY: all build test unit e2e demo lint fmt bench assets tools clean chart-schema policies helm image image-binary image-fips fips kubectl-plugin

all: build

build:
	$(CARGO) build --workspace --all-targets

assets:
	@bash hack/testbed-versions.sh

helm:
	@bash hack/helm.sh

# Unit tests once, then the e2e suite against the test bed's version (hack/testbed-versions.sh:
# Debian's 1.20.2, or the KUBEBUILDER_ASSETS directory), in two lanes side by side, and the
# container image checked to be reproducible with its SBOMs (hack/image.sh reproduce, at idle
# priority beside the tests) and run alone (hack/image-check.sh): all in hack/test.sh.
test:
	@helm="$$(bash hack/helm.sh)" && eval "$$(bash hack/prometheus.sh)" && \
	HELM="$$helm" CARGO="$(CARGO)" bash hack/test.sh

# The chart's generated files: values.schema.json from the configuration types,
# templates/crds.yaml from the agent's own resource types (src/model/src/crd/health.rs), and README.md
# from the schema and values.yaml; docs/api.md from the resource types.
chart-schema:
	$(CARGO) build -q -p hcp-fleet-e2e --bin hcp-fleet-dev
	./target/debug/hcp-fleet-dev package values-schema > charts/hcp-fleet-agent/values.schema.json.tmp
	mv charts/hcp-fleet-agent/values.schema.json.tmp charts/hcp-fleet-agent/values.schema.json
	./target/debug/hcp-fleet-dev package crds > charts/hcp-fleet-agent/templates/crds.yaml.tmp
	mv charts/hcp-fleet-agent/templates/crds.yaml.tmp charts/hcp-fleet-agent/templates/crds.yaml
	./target/debug/hcp-fleet-dev package chart-readme > charts/hcp-fleet-agent/README.md.tmp
	mv charts/hcp-fleet-agent/README.md.tmp charts/hcp-fleet-agent/README.md
	./target/debug/hcp-fleet-dev package api-reference > docs/api.md.tmp
	mv docs/api.md.tmp docs/api.md

# policies/ from the rendered chart; never edit those files by hand (make test compares).
policies: chart-schema
	bash hack/policies.sh policies

unit:
	$(CARGO) test --workspace --lib --bins

e2e:
	@helm="$$(bash hack/helm.sh)" && eval "$$(bash hack/prometheus.sh)" && versions="$$(bash hack/testbed-versions.sh)" && \
	for assets in $$versions; do \
	  KUBEBUILDER_ASSETS="$$assets" HELM="$$helm" $(CARGO) test -p hcp-fleet-e2e --tests; \
	done

# A local fleet of three hosted clusters on the newest test-bed version; Ctrl-C stops it and
# removes everything. DEMO_ARGS adds to `dev`'s arguments (`--config FILE`: the README's demo).
demo:
	@assets="$$(bash hack/testbed-versions.sh | tail -n 1)" && $(CARGO) build -p hcp-fleet-e2e --bin hcp-fleet-dev && \
	KUBEBUILDER_ASSETS="$$assets" ./target/debug/hcp-fleet-dev dev --hosted-clusters 3 $(DEMO_ARGS)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p hcp-fleet-cli --no-default-features --features ring --lib --bins -- -D warnings
	@bash hack/advisories.sh

fmt:
	$(CARGO) fmt --all

# The admission service under load (BENCH_SECONDS, BENCH_ADMISSION_ROUNDS), then beside a Go standard-library server
# shaped like it under wrk (BENCH_WRK_SECONDS; both installed by hack/bench-tools.sh), the guards' two engines side by side
# through a hosted kube-apiserver (BENCH_SECONDS, BENCH_CLIENTS), the agent against 16 real
# hosted kube-apiservers (BENCH_HOSTED, BENCH_IDLE_SECONDS), a tenant's tampering with the guards
# and the delete-then-act race (BENCH_TAMPER_RUNS, BENCH_RACE_TRIES), one row per hosted cluster on
# the ACM hub: a broken cluster to its row and Event, and the idle requests reporting adds
# (BENCH_HOSTED, BENCH_ROUNDS, BENCH_IDLE_SECONDS), then one agent and a thousand
# HCPs, 16 hosted clusters real and the rest simulated (BENCH_SCALE_SIZES, default
# 250,1000; the growth curve: BENCH_SCALE_SIZES=250,1000,2000,3000; BENCH_SCALE_REAL,
# BENCH_SCALE_DRIFTS, BENCH_SCALE_NEW, BENCH_IDLE_SECONDS).
bench:
	@eval "$$(bash hack/bench-tools.sh)" && $(CARGO) bench -p hcp-fleet-e2e --bench admission
	@assets="$$(bash hack/testbed-versions.sh | tail -n 1)" && \
	KUBEBUILDER_ASSETS="$$assets" $(CARGO) bench -p hcp-fleet-e2e --bench engines && \
	KUBEBUILDER_ASSETS="$$assets" $(CARGO) bench -p hcp-fleet-e2e --bench fleet && \
	KUBEBUILDER_ASSETS="$$assets" $(CARGO) bench -p hcp-fleet-e2e --bench guards && \
	KUBEBUILDER_ASSETS="$$assets" $(CARGO) bench -p hcp-fleet-e2e --bench acm && \
	KUBEBUILDER_ASSETS="$$assets" $(CARGO) bench -p hcp-fleet-e2e --bench scale

# The container image of Containerfile, as an OCI archive (target/image/hcp-fleet-agent.oci.tar),
# without a container engine; `image-binary` builds only its static binary.
image:
	@bash hack/image.sh

image-binary:
	@bash hack/image.sh binary

# The FIPS variant (feature `fips`: AWS-LC's FIPS module; cmake and Go from Debian's packages):
# `fips` runs its tests (FIPS mode, the admission service's suites seen from OpenSSL, every
# guard through a real kube-apiserver) and builds and checks its image; `image-fips` only the
# image, target/image-fips/hcp-fleet-agent.oci.tar.
fips:
	@bash hack/fips.sh

image-fips:
	@bash hack/fips.sh image

# `kubectl hcp-fleet status`: the release binary on the PATH as kubectl-hcp_fleet (kubectl's
# plugin naming). PLUGIN_DIR defaults to ~/.local/bin.
PLUGIN_DIR ?= $(HOME)/.local/bin
kubectl-plugin:
	$(CARGO) build --release -p hcp-fleet-cli --bin hcp-fleet-agent
	mkdir -p $(PLUGIN_DIR)
	install -m 0755 target/release/hcp-fleet-agent $(PLUGIN_DIR)/kubectl-hcp_fleet
	@echo "installed $(PLUGIN_DIR)/kubectl-hcp_fleet: run kubectl hcp-fleet status"

clean:
	$(CARGO) clean
