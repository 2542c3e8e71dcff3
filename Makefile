# hangar: `make up` runs the local stack, `make test` runs every test.
# Builds are cached outside the work tree ($HANGAR_CACHE, default
# ~/.cache/hangar): Go binaries by version, the moto venv, cargo's target dir.

SHELL := /bin/bash
export HANGAR_CACHE ?= $(HOME)/.cache/hangar
export CARGO_TARGET_DIR ?= $(HANGAR_CACHE)/target
CARGO ?= cargo

.PHONY: up test crds bench deps binaries moto help

help:
	@echo "make up     build what is missing, start the local stack, keep it running (Ctrl-C stops it)"
	@echo "make test   every test, from nothing"
	@echo "make crds   regenerate crds/manifests and charts/hangar/crds from the Rust types"
	@echo "make bench  lifecycle benchmark (release build), prints figures"

## Build what is missing (progress on stderr), then run until Ctrl-C.
up: deps
	@echo "[make up] building hangar (cargo, cached in $(CARGO_TARGET_DIR))" >&2
	$(CARGO) build --workspace --bins
	$(CARGO_TARGET_DIR)/debug/hangar-up

## Every test, from nothing: the unit tests, the CRD drift test, and the
## end-to-end tests against a real apiserver, moto and helm.
test: deps
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace --no-fail-fast

## Regenerate the CRD YAML from the Rust types.
crds:
	$(CARGO) run -q -p hangar-crds --bin crdgen

## etcd, kube-apiserver and helm from their Go modules; moto in a venv.
deps: binaries moto

binaries:
	@bash e2e/scripts/build-binaries.sh >/dev/null

moto:
	@bash e2e/scripts/moto-venv.sh >/dev/null

## Lifecycle benchmark (release build): prints latency, call-count and
## memory figures over 100 sessions (and 1,000 paused for memory).
bench: deps
	$(CARGO) build --release --workspace --bins
	$(CARGO_TARGET_DIR)/release/lifecycle-bench $(BENCH_ARGS)
