#!/usr/bin/env bash
# The test command of actix-coordination: installs what is missing (etcd, protoc, a kube-apiserver
# built once from Debian's source and cached), starts a real etcd + kube-apiserver on loopback,
# runs the whole test suite against them and always stops them. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec scripts/test-cluster.sh run -- cargo test --all-features --workspace "$@"
