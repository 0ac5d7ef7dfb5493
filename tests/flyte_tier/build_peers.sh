#!/usr/bin/env bash
# Builds the real peers of the flyte test tier from their published Go modules, once per machine,
# into a cache keyed by version (never into the repository):
#   $CACHE/flytepropeller-v1.16.8/flytepropeller, kubectl-flyte
#                                FlytePropeller (the controller the sandbox's `flyte start` embeds) and its
#                                own CLI; flyteadmin is not built: the Go module proxy serves no version of
#                                github.com/flyteorg/flyte/flyteadmin (nor datacatalog), so neither the
#                                single binary nor flyteadmin can be built from published modules
#   $CACHE/helm-v4.3.2/helm      Helm, to render the released charts
# CACHE is $DDLSCALE_PEERS_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/ddlscale-peers.
# Usage: build_peers.sh [--built] [flytepropeller|helm|all]
#   prints each peer's path (building it first where needed; exits 2 where Go is missing);
#   --built: prints the path only if already built, else exits 1 saying so (builds nothing)
set -euo pipefail
FLYTE_VERSION=v1.16.8
HELM_VERSION=v4.3.2
cache="${DDLSCALE_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddlscale-peers}"
built_only=0
if [ "${1:-}" = "--built" ]; then built_only=1; shift; fi
what="${1:-all}"
if [ "$built_only" = 1 ]; then
  case "$what" in
    flytepropeller) dir="$cache/flytepropeller-$FLYTE_VERSION"; [ -x "$dir/flytepropeller" ] && [ -x "$dir/kubectl-flyte" ] && { echo "$dir"; exit 0; } ;;
    helm) [ -x "$cache/helm-$HELM_VERSION/helm" ] && { echo "$cache/helm-$HELM_VERSION/helm"; exit 0; } ;;
    *) echo "build_peers: --built takes one peer: flytepropeller or helm" >&2; exit 64 ;;
  esac
  echo "build_peers: $what $([ "$what" = helm ] && echo "$HELM_VERSION" || echo "$FLYTE_VERSION") is not built on this machine (bash tests/flyte_tier/build_peers.sh $what builds it, once)" >&2
  exit 1
fi

command -v go >/dev/null 2>&1 || { echo "build_peers: no Go toolchain on PATH (Go 1.26 builds Flyte $FLYTE_VERSION)" >&2; exit 2; }
mkdir -p "$cache"

# One build at a time per machine and version (pytest workers and CI may ask together).
locked() {  # locked NAME CMD...: runs CMD under an exclusive lock on $cache/NAME.lock
  local name="$1"; shift
  exec {fd}>"$cache/$name.lock"
  flock "$fd"
  "$@"
  exec {fd}>&-
}

build_flytepropeller() {
  local dir="$cache/flytepropeller-$FLYTE_VERSION"
  [ -x "$dir/flytepropeller" ] && [ -x "$dir/kubectl-flyte" ] && { echo "$dir"; return 0; }
  local start=$SECONDS work
  work="$(mktemp -d "$cache/flytepropeller-build.XXXXXX")"
  echo "build_peers: building FlytePropeller $FLYTE_VERSION (flytepropeller, kubectl-flyte) from its Go module (first time on this machine: 10-30 min on 2 cores)" >&2
  # FlytePropeller's go.mod, as released, pins every dependency; `go install` refuses it for its local
  # replace lines. A wrapper module takes its requirements, asks for each Flyte module it uses at the
  # tag instead of the local folders, and repeats its one non-local replace.
  local propmod
  propmod="$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "github.com/flyteorg/flyte/flytepropeller@$FLYTE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')"
  [ -n "$propmod" ] || { echo "build_peers: the Go module proxy did not serve github.com/flyteorg/flyte/flytepropeller@$FLYTE_VERSION" >&2; return 3; }
  {
    echo "module ddlscale.invalid/flytepeer"
    echo
    sed -n '/^go /p' "$propmod"
    echo
    echo "require ("
    for sub in flyteidl flyteplugins flytepropeller flytestdlib; do
      echo "	github.com/flyteorg/flyte/$sub $FLYTE_VERSION"
    done
    echo ")"
    echo
    awk '/^require \(/{inblock=1} inblock{print} /^\)/{inblock=0}' "$propmod" | grep -v -e 'github.com/flyteorg/flyte/' -e 'github.com/kubeflow/spark-operator '
    echo
    awk '/^replace \(/{inblock=1; next} inblock && /^\)/{inblock=0} inblock' "$propmod" | grep -v '=> \.' | sed 's/^\s*/replace /'
  } >"$work/go.mod"
  mkdir -p "$work/flytepropeller" "$work/kubectl-flyte"
  # The plugins the sandbox enables (container, sidecar, k8s-array, echo; the connector plugin is built into
  # the task handler). flytepropeller/plugins also registers Spark, Ray, Dask and the kubeflow operators,
  # whose operator modules the proxy does not all serve (kubeflow/spark-operator at the pinned commit).
  cat >"$work/flytepropeller/main.go" <<'GO'
// FlytePropeller's controller (flytepropeller/cmd/controller at the tag), in a module of its own, with the
// task plugins the Flyte sandbox enables.
package main

import (
	"github.com/flyteorg/flyte/flytepropeller/cmd/controller/cmd"

	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/plugins/array/k8s"
	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/plugins/k8s/pod"
	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/plugins/testing"
)

func main() {
	cmd.Execute()
}
GO
  cat >"$work/kubectl-flyte/main.go" <<'GO'
// FlytePropeller's own CLI (flytepropeller/cmd/kubectl-flyte at the tag): compiles a workflow closure
// into a FlyteWorkflow object and creates it, as flyteadmin does for an execution.
package main

import (
	"fmt"
	"os"

	"github.com/flyteorg/flyte/flytepropeller/cmd/kubectl-flyte/cmd"
	"github.com/flyteorg/flyte/flytestdlib/contextutils"
	"github.com/flyteorg/flyte/flytestdlib/promutils/labeled"
)

func init() {
	labeled.SetMetricKeys(contextutils.ProjectKey, contextutils.DomainKey, contextutils.WorkflowIDKey,
		contextutils.TaskIDKey)
}

func main() {
	if err := cmd.NewFlyteCommand().Execute(); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
}
GO
  (cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o bin/ ./flytepropeller ./kubectl-flyte >&2)
  mkdir -p "$dir"
  for binary in flytepropeller kubectl-flyte; do mv "$work/bin/$binary" "$dir/$binary.new" && mv "$dir/$binary.new" "$dir/$binary"; done
  rm -rf "$work"
  echo "build_peers: FlytePropeller $FLYTE_VERSION built in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s: $dir" >&2
  echo "$dir"
}

build_helm() {
  local out="$cache/helm-$HELM_VERSION/helm" start=$SECONDS
  [ -x "$out" ] && { echo "$out"; return 0; }
  echo "build_peers: building Helm $HELM_VERSION from its Go module" >&2
  mkdir -p "$(dirname "$out")"
  GOBIN="$(dirname "$out")" CGO_ENABLED=0 go install -trimpath "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
  echo "build_peers: Helm $HELM_VERSION built in $(( SECONDS - start )) s: $out" >&2
  echo "$out"
}

case "$what" in
  flytepropeller) locked flytepropeller build_flytepropeller ;;
  helm) locked helm build_helm ;;
  all) locked helm build_helm; locked flytepropeller build_flytepropeller ;;
  *) echo "build_peers: unknown peer '$what'; allowed: flytepropeller, helm, all" >&2; exit 64 ;;
esac
