#!/usr/bin/env bash
# Builds the real peers of the flyte test tier from their published Go modules, once per machine,
# into a cache keyed by version (never into the repository):
#   $CACHE/flyte-v1.16.8/flyte   Flyte's single binary (flyteadmin + FlytePropeller + data proxy),
#                                the `flyte start` the sandbox and the flyte-binary chart run
#   $CACHE/helm-v4.3.2/helm      Helm, to render the released charts
# CACHE is $DDLSCALE_PEERS_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/ddlscale-peers.
# Usage: build_peers.sh [flyte|helm|all]   (prints each binary's path; exits 2 where Go is missing)
set -euo pipefail
FLYTE_VERSION=v1.16.8
HELM_VERSION=v4.3.2
cache="${DDLSCALE_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddlscale-peers}"
what="${1:-all}"

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

build_flyte() {
  local out="$cache/flyte-$FLYTE_VERSION/flyte"
  [ -x "$out" ] && { echo "$out"; return 0; }
  local start=$SECONDS work
  work="$(mktemp -d "$cache/flyte-build.XXXXXX")"
  echo "build_peers: building Flyte $FLYTE_VERSION's single binary from its Go modules (first time on this machine: 20-40 min on 2 cores)" >&2
  # The root module's go.mod, as released, pins every dependency; `go install` refuses it for its
  # local replace lines. A wrapper module takes its requirements, asks for each Flyte module at the
  # tag instead of the local folders, and repeats the one non-local replace (robfig/cron).
  local rootmod
  rootmod="$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "github.com/flyteorg/flyte@$FLYTE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')"
  {
    echo "module ddlscale.invalid/flytepeer"
    echo
    sed -n '/^go /p' "$rootmod"
    echo
    echo "require ("
    echo "	github.com/flyteorg/flyte $FLYTE_VERSION"
    for sub in datacatalog flyteadmin flyteidl flyteplugins flytepropeller flytestdlib; do
      echo "	github.com/flyteorg/flyte/$sub $FLYTE_VERSION"
    done
    echo ")"
    echo
    # The root's own require blocks, less the Flyte modules it took from local folders.
    awk '/^require \(/{inblock=1} inblock{print} /^\)/{inblock=0}' "$rootmod" | grep -v 'github.com/flyteorg/flyte/'
    echo
    grep -E '^\s*github.com/robfig/cron/v3 => ' "$rootmod" | sed 's/^\s*/replace /'
  } >"$work/go.mod"
  cat >"$work/main.go" <<'GO'
// The entry point of Flyte's single binary (cmd/main.go at the tag), in a module of its own.
package main

import (
	"github.com/flyteorg/flyte/cmd/single"
	_ "github.com/flyteorg/flyte/flytepropeller/plugins"
	"github.com/golang/glog"
)

func main() {
	glog.V(2).Info("Starting Flyte")
	if err := single.Execute(); err != nil {
		panic(err)
	}
}
GO
  (cd "$work" && GOFLAGS=-mod=mod go mod tidy >&2 && CGO_ENABLED=0 go build -trimpath -o flyte . >&2)
  mkdir -p "$(dirname "$out")"
  mv "$work/flyte" "$out.new" && mv "$out.new" "$out"
  rm -rf "$work"
  echo "build_peers: Flyte $FLYTE_VERSION built in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s: $out" >&2
  echo "$out"
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
  flyte) locked flyte build_flyte ;;
  helm) locked helm build_helm ;;
  all) locked helm build_helm; locked flyte build_flyte ;;
  *) echo "build_peers: unknown peer '$what'; allowed: flyte, helm, all" >&2; exit 64 ;;
esac
