#!/usr/bin/env bash
# The test command of actix-coordination: installs what is missing (etcd, protoc, a kube-apiserver
# built once from Debian's source and cached), starts a real etcd + kube-apiserver on loopback,
# runs the whole test suite against them and always stops them. Extra arguments go to `cargo test`.
# `--no-fail-fast`: every test binary runs even when an earlier one fails; the exit status is still
# non-zero if any test failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec scripts/test-cluster.sh run -- cargo test --no-fail-fast --all-features --workspace "$@"
