# hangar: `make up` runs the local stack, `make test` runs every test.
# Builds are cached outside the work tree ($HANGAR_CACHE, default
# ~/.cache/hangar): Go binaries by version, the moto venv, cargo's target dir.

SHELL := /bin/bash
export HANGAR_CACHE ?= $(HOME)/.cache/hangar
export CARGO_TARGET_DIR ?= $(HANGAR_CACHE)/target
CARGO ?= cargo

.PHONY: up test crds bench bench-scale deps binaries real-node moto system-packages images images-local help

help:
	@echo "make up     build what is missing, start the local stack, keep it running (Ctrl-C stops it)"
	@echo "            NODE=real: every component a Pod on a real kubelet, sessions on real nodes"
	@echo "make test   every test, from nothing"
	@echo "make images hangar's release images: every component, linux/amd64 and linux/arm64, optimised"
	@echo "make crds   regenerate the CRD YAML (crds/manifests, both charts) from the Rust types"
	@echo "make bench  the benchmarks (bench profile), each figure with its ratio to a baseline; RUNS=5"
	@echo "make bench-scale  SESSIONS=5000 on one operator replica (kwok nodes), leader failover, and"
	@echo "            kubernetes-sigs/agent-sandbox's controller on the same kind of stack; SANDBOXES=1000"

## Build what is missing (progress on stderr), then run until Ctrl-C.
## NODE=real: hangar installed by Helm onto a real kubelet from its own
## images, sessions on real session nodes (docs/real-node.md); the default
## is the node simulator.
NODE ?= sim
up: deps $(if $(filter real,$(NODE)),real-node images-local)
	@echo "[make up] building hangar (cargo, cached in $(CARGO_TARGET_DIR))" >&2
	$(CARGO) build --workspace --bins
	HANGAR_UP_NODE=$(NODE) $(CARGO_TARGET_DIR)/debug/hangar-up

## Every test, from nothing: the unit tests, the CRD drift test, and the
## end-to-end tests against a real apiserver, moto and helm (and hangar's
## own images, which e2e/tests/images.rs packs and checks). The Go tools
## and the moto venv build in the background beside the cargo builds
## (e2e/scripts/test.sh).
test:
	@bash e2e/scripts/test.sh

## Regenerate the CRD YAML from the Rust types.
crds:
	$(CARGO) run -q -p hangar-crds --bin crdgen

## etcd, kube-apiserver and helm from their Go modules; moto in a venv;
## the Debian packages the workspace volume needs (cryptsetup, …).
deps: system-packages binaries moto

system-packages:
	@bash e2e/scripts/system-packages.sh

binaries:
	@bash e2e/scripts/build-binaries.sh >/dev/null

moto:
	@bash e2e/scripts/moto-venv.sh >/dev/null

## A real node for e2e/tests/real_node.rs: kubelet, kube-controller-manager
## and kube-scheduler (same module as kube-apiserver), containerd and its
## runc shim, the CNI plugins and hangar's pause program.
real-node: system-packages
	@bash e2e/scripts/build-binaries.sh real-node >/dev/null

## hangar's release images' static binaries (musl, profile `image`): every
## component for linux/amd64 and linux/arm64, which `e2e/scripts/images.sh
## push REGISTRY release` packs into multi-platform OCI images.
images: system-packages
	@bash e2e/scripts/images.sh build release

## The local set `make test` and `make up NODE=real` use (dev profile):
## every component for this machine's amd64, the session node's worker and
## supervisor for arm64 too.
images-local: system-packages
	@bash e2e/scripts/images.sh build local

## Benchmarks (release build): the lifecycle (latency, EC2 call counts and
## memory over 100 sessions, 1,000 paused for memory) and commands (create
## to process start, 1 GiB of output, long-poll wake, worker and gateway
## memory), admission (a burst of 64 creates for one session; reviews at a
## steady 200/s), the gateway's auth overhead per request, how fast a
## lost worker and a terminated instance are noticed, and the image
## preflight (cold and cached), and the workspace key hand-over.
## Each latency is printed with its ratio to a baseline measured in the
## same run, over RUNS repetitions (medians), with the machine's load
## before and after. The `bench` profile (Cargo.toml) builds into
## target/release.
## The lifecycle's moto forgets a terminated instance 5 s after it ended
## (EC2: about an hour), so each run describes only its own instances
## (e2e/scripts/moto_server.py; docs/benchmarks.md).
## RUNS: the lifecycle's and the commands' p99s rest on about 100
## samples a run; two invocations are compared on all runs pooled.
RUNS ?= 5
bench: deps
	$(CARGO) build --profile bench --workspace --bins
	HANGAR_MOTO_FORGET_TERMINATED_AFTER_SECONDS=5 $(CARGO_TARGET_DIR)/release/lifecycle-bench --runs $(RUNS) $(BENCH_ARGS)
	$(CARGO_TARGET_DIR)/release/commands-bench --runs $(RUNS)
	$(CARGO_TARGET_DIR)/release/admission-bench
	$(CARGO_TARGET_DIR)/release/gateway-auth-bench
	$(CARGO_TARGET_DIR)/release/interruption-bench
	$(CARGO_TARGET_DIR)/release/preflight-bench
	$(CARGO_TARGET_DIR)/release/key-handover-bench

## Scale (bench profile): SESSIONS concurrent sessions on one operator
## replica with kwok nodes and the in-memory EC2 stub, then leader failover
## with two replicas (scale-bench); kubernetes-sigs/agent-sandbox's
## controller with SANDBOXES Sandboxes on kwok nodes, side by side
## (agent-sandbox-bench). kwok and the agent-sandbox controller are built
## from their Go modules.
## HEARTBEAT: the light nodes' renewal (s); at 10 (the worker's default)
## 5,000 nodes write more Leases than this machine's apiserver serves.
SESSIONS ?= 5000
HEARTBEAT ?= 30
SANDBOXES ?= 1000
bench-scale: deps
	@bash e2e/scripts/build-binaries.sh kwok agent-sandbox >/dev/null
	$(CARGO) build --profile bench --workspace --bins
	$(CARGO_TARGET_DIR)/release/scale-bench $(SESSIONS) $(HEARTBEAT)
	$(CARGO_TARGET_DIR)/release/agent-sandbox-bench $(SANDBOXES) 10
