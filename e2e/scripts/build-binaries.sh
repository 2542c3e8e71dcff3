#!/usr/bin/env bash
# Builds etcd, kube-apiserver and helm from their published Go modules into a
# cache outside the work tree, keyed by version. Nothing prebuilt can be
# downloaded here, so each binary is compiled from a small wrapper module:
#   - etcd: a main that calls go.etcd.io/etcd/server/v3/etcdmain.Main;
#   - kube-apiserver: k8s.io/kubernetes cannot be required as-is (its go.mod
#     points the k8s.io/<staging> modules at ./staging), so the wrapper
#     replaces each of them with its published v0.<minor>.<patch>;
#   - helm: helm.sh/helm/v3/cmd/helm from a wrapper module;
#   - registry: an OCI registry on loopback (go-containerregistry's
#     pkg/registry) for the image preflight, from a wrapper main that binds
#     127.0.0.1, prints its port and can ask for basic auth;
#   - crane: go-containerregistry's image tool, which packs hangar's own
#     binaries into OCI images and multi-platform indexes (no Docker engine).
#   - kubelet (same wrapper as kube-apiserver), containerd with its runc
#     shim, and the CNI plugins, for a real node (asked for by name only).
#   - kwok (simulated nodes) and kubernetes-sigs/agent-sandbox's controller,
#     for the scale and side-by-side benchmarks (asked for by name only).
# Usage: build-binaries.sh [etcd|kube-apiserver|helm|registry|crane|kubelet|
#   kube-controller-manager|kube-scheduler|containerd|cni|pause|kwok|
#   agent-sandbox|control-plane|real-node|test ...]
#   control-plane (the default): etcd kube-apiserver helm registry crane,
#     what `make up` and most tests run;
#   real-node: kube-controller-manager kube-scheduler kubelet containerd
#     cni pause, what the real-node tests and `make up NODE=real` add;
#   test: both.
# Prints the cache's bin directory on stdout; progress goes to stderr.
# Each binary is built under a lock of its own in the cache: `.ci/run`
# starts the test set in the background while clippy runs, and a later call
# for the same binary (`make test`'s, a test's) waits for that build and
# finds it done. Each binary built records its seconds in $HANGAR_TIMINGS
# (lib/timing.sh).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../versions.env
source "$here/../versions.env"
# shellcheck source=lib/timing.sh
source "$here/lib/timing.sh"
CACHE="${HANGAR_CACHE:-$HOME/.cache/hangar}"
BIN="$CACHE/bin"
WORK="$CACHE/go-build"
mkdir -p "$BIN" "$WORK"

export CGO_ENABLED=0
export GOFLAGS="-mod=mod"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

log() { printf '[build-binaries] %s\n' "$*" >&2; }

# go_build <name> <version> <module dir> <package> [ldflags]
go_build() {
  local name=$1 version=$2 dir=$3 pkg=$4 ldflags=${5:-}
  local out="$BIN/$name-$version"
  log "compiling $name $version (this takes a few minutes on 2 cores)"
  local start=$SECONDS
  (cd "$dir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
  log "built $out in $((SECONDS - start))s"
}

# cached <name> <version>: true (and says so) when it is built already.
cached() {
  [[ -x "$BIN/$1-$2" ]] || return 1
  log "$1 $2 cached"
}

# work_dir <name> <version>: a fresh directory for its wrapper module.
work_dir() {
  local dir="$WORK/$1-$2"
  rm -rf "$dir" && mkdir -p "$dir"
  echo "$dir"
}

# tools_file <dir> <package>: a tools.go in <dir> that imports <package>,
# so the wrapper module builds that program of the required module.
tools_file() {
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$2" >"$1/tools.go"
}

# wrapper_module <dir> <name> <module> <version>: a module in <dir> that
# requires <module>@<version>, its graph resolved.
wrapper_module() {
  (cd "$1" && go mod init "hangar.local/$2" >/dev/null 2>&1 &&
    log "resolving $3@$4" &&
    go get "$3@$4" >&2 && go mod tidy >&2)
}

build_etcd() {
  cached etcd "$ETCD_VERSION" && return
  local dir
  dir=$(work_dir etcd "$ETCD_VERSION")
  cat >"$dir/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  wrapper_module "$dir" etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
  go_build etcd "$ETCD_VERSION" "$dir" . \
    "-X go.etcd.io/etcd/api/v3/version.GitSHA=hangar"
}

# kube_wrapper: the wrapper module for k8s.io/kubernetes (shared by its
# binaries), in $WORK/kubernetes-$KUBE_VERSION; prints its directory.
KUBE_CMDS="kube-apiserver kubelet kube-controller-manager kube-scheduler"
kube_wrapper() {
  local dir="$WORK/kubernetes-$KUBE_VERSION"
  # Its binaries may be built by two calls at once; one resolves the module.
  exec 8>"$BIN/.lock-kube-wrapper"
  flock 8
  if [[ -f "$dir/go.sum" && "$(cat "$dir/.resolved" 2>/dev/null)" == "$KUBE_CMDS" ]]; then
    echo "$dir"
    return
  fi
  rm -rf "$dir" && mkdir -p "$dir"
  log "reading k8s.io/kubernetes@$KUBE_VERSION go.mod for its staging modules"
  local gomod
  gomod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
    sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  local minor_patch="${KUBE_VERSION#v1.}" # 37.2
  local go_directive
  go_directive=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")
  {
    echo "module hangar.local/kubernetes"
    echo
    echo "go $go_directive"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    grep -E '=> \./staging/src/' "$gomod" | awk -v v="v0.$minor_patch" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } >"$dir/go.mod"
  # Every binary of k8s.io/kubernetes that hangar builds, so one tidy
  # resolves them all.
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    local c
    for c in $KUBE_CMDS; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
    printf ')\n'
  } >"$dir/tools.go"
  log "resolving the module graph of k8s.io/kubernetes@$KUBE_VERSION"
  (cd "$dir" && go mod tidy >&2)
  echo "$KUBE_CMDS" >"$dir/.resolved"
  echo "$dir"
}

# build_kube <binary>: cmd/<binary> of k8s.io/kubernetes, version-stamped.
build_kube() {
  local name=$1
  cached "$name" "$KUBE_VERSION" && return
  local dir
  dir=$(kube_wrapper)
  local v="$KUBE_VERSION" minor_patch="${KUBE_VERSION#v1.}" ld=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=${minor_patch%%.*}"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  go_build "$name" "$KUBE_VERSION" "$dir" "k8s.io/kubernetes/cmd/$name" "$ld"
}

# containerd and its runc shim (runc itself is Debian's: it needs cgo).
# Without cgo the btrfs and devmapper snapshotters cannot build; the
# overlayfs and native ones stay.
build_containerd() {
  local name
  for name in containerd containerd-shim-runc-v2; do
    cached "$name" "$CONTAINERD_VERSION" && continue
    local dir="$WORK/containerd-$CONTAINERD_VERSION"
    if [[ ! -f "$dir/.resolved" ]]; then
      rm -rf "$dir" && mkdir -p "$dir"
      printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "github.com/containerd/containerd/v2/cmd/containerd"\n\t_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"\n)\n' >"$dir/tools.go"
      wrapper_module "$dir" containerd github.com/containerd/containerd/v2 "$CONTAINERD_VERSION"
      touch "$dir/.resolved"
    fi
    local ld="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
    (export GOFLAGS="$GOFLAGS -tags=no_btrfs,no_devmapper,no_zfs"
      go_build "$name" "$CONTAINERD_VERSION" "$dir" "github.com/containerd/containerd/v2/cmd/$name" "$ld")
  done
}

# The CNI plugins a node's Pods need: bridge, host-local IPAM, loopback,
# portmap; into $BIN/cni-$CNI_PLUGINS_VERSION/ (the kubelet's CNI bin dir).
build_cni() {
  local out="$BIN/cni-$CNI_PLUGINS_VERSION"
  [[ -x "$out/bridge" && -x "$out/host-local" && -x "$out/loopback" && -x "$out/portmap" ]] &&
    { log "cni plugins $CNI_PLUGINS_VERSION cached"; return; }
  local dir
  dir=$(work_dir cni "$CNI_PLUGINS_VERSION")
  local m=github.com/containernetworking/plugins
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s/plugins/main/bridge"\n\t_ "%s/plugins/ipam/host-local"\n\t_ "%s/plugins/main/loopback"\n\t_ "%s/plugins/meta/portmap"\n)\n' $m $m $m $m >"$dir/tools.go"
  wrapper_module "$dir" cni "$m" "$CNI_PLUGINS_VERSION"
  mkdir -p "$out"
  local p start=$SECONDS
  log "compiling the cni plugins $CNI_PLUGINS_VERSION"
  for p in main/bridge ipam/host-local main/loopback meta/portmap; do
    (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$out/${p##*/}.tmp" "$m/plugins/$p")
    mv "$out/${p##*/}.tmp" "$out/${p##*/}"
  done
  log "built $out in $((SECONDS - start))s"
}

build_helm() {
  cached helm "$HELM_VERSION" && return
  local dir
  dir=$(work_dir helm "$HELM_VERSION")
  tools_file "$dir" helm.sh/helm/v3/cmd/helm
  wrapper_module "$dir" helm helm.sh/helm/v3 "$HELM_VERSION"
  # Helm's own Makefile stamps the Kubernetes version it was built against
  # (client-go v0.X.Y means 1.X); unstamped, `helm template` assumes 1.20.
  local cg major minor
  cg=$(cd "$dir" && go list -m -f '{{.Version}}' k8s.io/client-go)
  major=$(( $(echo "${cg#v}" | cut -d. -f1) + 1 ))
  minor=$(echo "$cg" | cut -d. -f2)
  local ld="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ld+=" -X $p.k8sVersionMajor=$major -X $p.k8sVersionMinor=$minor"
  done
  go_build helm "$HELM_VERSION" "$dir" helm.sh/helm/v3/cmd/helm "$ld"
}

# share_dir <name> <version>: where a module's data files (Stage YAML,
# CRDs) are kept beside its binary.
share_dir() {
  echo "$CACHE/share/$1-$2"
}

# module_dir <dir> <module>: the module's source in the module cache, as
# resolved by the wrapper module in <dir>.
module_dir() {
  (cd "$1" && go list -m -f '{{.Dir}}' "$2")
}

# kwok: simulated nodes for the scale benchmark (its Stages come from the
# module's kustomize/stage YAML: v0.8 has none built in).
build_kwok() {
  local share
  share=$(share_dir kwok "$KWOK_VERSION")
  cached kwok "$KWOK_VERSION" && [[ -f "$share/stages.yaml" ]] && return
  local dir src
  dir=$(work_dir kwok "$KWOK_VERSION")
  tools_file "$dir" sigs.k8s.io/kwok/cmd/kwok
  wrapper_module "$dir" kwok sigs.k8s.io/kwok "$KWOK_VERSION"
  src=$(module_dir "$dir" sigs.k8s.io/kwok)
  mkdir -p "$share"
  {
    for f in node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml \
      pod/fast/pod-ready.yaml pod/fast/pod-delete.yaml; do
      cat "$src/kustomize/stage/$f"
      echo "---"
    done
  } >"$share/stages.yaml"
  cached kwok "$KWOK_VERSION" || go_build kwok "$KWOK_VERSION" "$dir" sigs.k8s.io/kwok/cmd/kwok
}

# kubernetes-sigs/agent-sandbox's controller and its Sandbox CRD, for the
# side-by-side benchmark.
build_agent_sandbox() {
  local share
  share=$(share_dir agent-sandbox "$AGENT_SANDBOX_VERSION")
  cached agent-sandbox-controller "$AGENT_SANDBOX_VERSION" && [[ -f "$share/sandboxes.yaml" ]] && return
  local dir src
  dir=$(work_dir agent-sandbox "$AGENT_SANDBOX_VERSION")
  tools_file "$dir" sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller
  wrapper_module "$dir" agent-sandbox sigs.k8s.io/agent-sandbox "$AGENT_SANDBOX_VERSION"
  src=$(module_dir "$dir" sigs.k8s.io/agent-sandbox)
  mkdir -p "$share"
  cp "$src/k8s/crds/agents.x-k8s.io_sandboxes.yaml" "$share/sandboxes.yaml"
  cached agent-sandbox-controller "$AGENT_SANDBOX_VERSION" ||
    go_build agent-sandbox-controller "$AGENT_SANDBOX_VERSION" "$dir" \
      sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller \
      "-X sigs.k8s.io/agent-sandbox/internal/version.gitVersion=$AGENT_SANDBOX_VERSION"
}

build_registry() {
  cached registry "$GGCR_VERSION" && return
  local dir
  dir=$(work_dir registry "$GGCR_VERSION")
  cat >"$dir/main.go" <<'GO'
// An in-memory OCI registry on 127.0.0.1 for hangar's local stack and tests.
// -addr 127.0.0.1:0 picks a free port; the chosen one is printed as
// "listening on 127.0.0.1:<port>". With HANGAR_REGISTRY_USER and
// HANGAR_REGISTRY_PASSWORD set, every request needs basic auth (so the
// operator's registry credentials are exercised).
package main

import (
	"crypto/subtle"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	var h http.Handler = registry.New()
	user, pass := os.Getenv("HANGAR_REGISTRY_USER"), os.Getenv("HANGAR_REGISTRY_PASSWORD")
	if user != "" {
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u, p, ok := r.BasicAuth()
			if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 ||
				subtle.ConstantTimeCompare([]byte(p), []byte(pass)) != 1 {
				w.Header().Set("WWW-Authenticate", `Basic realm="hangar-test"`)
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			inner.ServeHTTP(w, r)
		})
	}
	fmt.Printf("listening on %s\n", ln.Addr())
	s := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(s.Serve(ln))
}
GO
  wrapper_module "$dir" registry github.com/google/go-containerregistry "$GGCR_VERSION"
  go_build registry "$GGCR_VERSION" "$dir" .
}

build_crane() {
  cached crane "$GGCR_VERSION" && return
  local dir
  dir=$(work_dir crane "$GGCR_VERSION")
  tools_file "$dir" github.com/google/go-containerregistry/cmd/crane
  wrapper_module "$dir" crane github.com/google/go-containerregistry "$GGCR_VERSION"
  go_build crane "$GGCR_VERSION" "$dir" github.com/google/go-containerregistry/cmd/crane
}

# pause: the real node's sandbox ("pause") image entrypoint. It holds a
# Pod's namespaces as PID 1 and reaps what is reparented to it; hangar
# builds its own so the node needs nothing from a public registry.
build_pause() {
  cached pause "$PAUSE_VERSION" && return
  local dir
  dir=$(work_dir pause "$PAUSE_VERSION")
  cat >"$dir/main.go" <<'GO'
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
GO
  (cd "$dir" && go mod init hangar.local/pause >/dev/null 2>&1)
  go_build pause "$PAUSE_VERSION" "$dir" .
}

CONTROL_PLANE=(etcd kube-apiserver helm registry crane)
REAL_NODE=(kube-controller-manager kube-scheduler kubelet containerd cni pause)
targets=()
for t in "${@:-control-plane}"; do
  case "$t" in
    control-plane) targets+=("${CONTROL_PLANE[@]}") ;;
    real-node) targets+=("${REAL_NODE[@]}") ;;
    test) targets+=("${CONTROL_PLANE[@]}" "${REAL_NODE[@]}") ;;
    *) targets+=("$t") ;;
  esac
done
for t in "${targets[@]}"; do
  exec 9>"$BIN/.lock-$t"
  flock 9
  start=$SECONDS
  case "$t" in
    etcd) build_etcd ;;
    kube-apiserver) build_kube kube-apiserver ;;
    kubelet | kube-controller-manager | kube-scheduler) build_kube "$t" ;;
    containerd) build_containerd ;;
    cni) build_cni ;;
    helm) build_helm ;;
    registry) build_registry ;;
    crane) build_crane ;;
    pause) build_pause ;;
    kwok) build_kwok ;;
    agent-sandbox) build_agent_sandbox ;;
    *) log "unknown target $t"; exit 2 ;;
  esac
  # A cached binary takes no time; one built records its cold seconds.
  ((SECONDS - start < 1)) || timing_record "go-$t" "$((SECONDS - start))"
  exec 9>&- 8>&-
done
echo "$BIN"
