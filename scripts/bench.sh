#!/usr/bin/env bash
# Every benchmark of BENCHMARKS.md in one command: installs what is missing, starts a private real
# etcd + kube-apiserver (target/bench-cluster, separate from the test cluster so that no test
# traffic is counted), runs the benches against them and in memory, and always stops the servers.
#
# Usage:
#   scripts/bench.sh            everything (about 45 minutes on 2 cores)
#   scripts/bench.sh quick      fewer rounds and shorter windows (about 12 minutes)
#   scripts/bench.sh chaos      the 600 s chaos runs of docs/chaos/RESULTS.md (about 25 minutes)
#
# Output: the console, and one log per bench under target/bench-results/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode=${1:-full}
case $mode in
    full | quick | chaos) ;;
    --inner) ;;
    *)
        sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
esac

if [[ $mode != --inner ]]; then
    exec scripts/test-cluster.sh run target/bench-cluster -- "$0" --inner "$mode"
fi

mode=$2
out=target/bench-results
mkdir -p "$out"
export CARGO_TERM_COLOR=never

if [[ $mode == quick ]]; then
    export BENCH_HANDOFF_ROUNDS=${BENCH_HANDOFF_ROUNDS:-50} BENCH_FAILOVER_ROUNDS=${BENCH_FAILOVER_ROUNDS:-10}
    export BENCH_KILL_ROUNDS=${BENCH_KILL_ROUNDS:-5} BENCH_PAUSE_ROUNDS=${BENCH_PAUSE_ROUNDS:-1}
    export BENCH_WINDOW_SECS=${BENCH_WINDOW_SECS:-20}
fi

bench() { # LOG-NAME CARGO-ARGS...
    local log=$out/$1.log
    shift
    echo "=== cargo bench $* ($(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg))" | tee "$log"
    cargo bench "$@" 2>&1 | tee -a "$log"
}

if [[ $mode == chaos ]]; then
    for backend in etcd kubernetes; do
        echo "=== chaos $backend, 600 s" | tee "$out/chaos-$backend.log"
        CHAOS_SECONDS=600 CHAOS_SEED=${CHAOS_SEED:-20261122} \
            cargo test --all-features --test chaos "chaos_$backend" -- --nocapture 2>&1 |
            tee -a "$out/chaos-$backend.log"
    done
    exit 0
fi

if [[ $mode == quick ]]; then
    BENCH_GUARD_ROUNDS=${BENCH_GUARD_ROUNDS:-30} bench guard --bench guard -- --check
else
    bench guard --bench guard -- --check
fi
bench handoff-memory --bench handoff -- memory handoff failover
bench handoff-kubernetes --all-features --bench handoff -- kubernetes all
bench handoff-etcd --all-features --bench handoff -- etcd all
if [[ $mode == quick ]]; then
    bench scale-memory --bench scale -- memory 10000
    bench scale-kubernetes --all-features --bench scale -- kubernetes 200
    bench scale-etcd --all-features --bench scale -- etcd 2000
    bench in-memory --bench in_memory -- --warm-up-time 1 --measurement-time 3
else
    bench scale-memory --bench scale -- memory 100000
    bench scale-kubernetes --all-features --bench scale -- kubernetes 1000
    bench scale-etcd --all-features --bench scale -- etcd 10000
    bench in-memory --bench in_memory
fi
echo "=== done; logs in $out/"
