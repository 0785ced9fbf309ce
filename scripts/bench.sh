#!/usr/bin/env bash
# Every benchmark of BENCHMARKS.md in one command: installs what is missing, starts a private real
# etcd + kube-apiserver (target/bench-cluster, separate from the test cluster so that no test
# traffic is counted), runs the benches against them and in memory, and always stops the servers.
#
# Usage:
#   scripts/bench.sh            everything (about 80 minutes on 2 cores); then merges the results
#                               into benches/data/results.jsonl and regenerates BENCHMARKS.md
#   scripts/bench.sh quick      fewer rounds and shorter windows (about 20 minutes); writes a
#                               preview, target/bench-results/BENCHMARKS.quick.md, not BENCHMARKS.md
#   scripts/bench.sh chaos      the 600 s chaos runs of docs/chaos/RESULTS.md (about 35 minutes: one
#                               each on etcd, Kubernetes, a three-member etcd cluster; CHAOS_BACKENDS)
#   scripts/bench.sh chaos-long at least 1,000 faults per backend (CHAOS_FAULTS), the three backends
#                               at once (about 100 minutes on 2 cores); prints the table of
#                               docs/chaos/RESULTS.md (scripts/chaos-summary.py)
#   scripts/bench.sh rollouts   rolling updates with real processes (tests/rollout.rs): 100 per
#                               backend with the handover policy and 100 without (ROLLOUTS), etcd
#                               and Kubernetes (about 5 minutes); prints the table of BENCHMARKS.md
#                               ("Rolling updates", scripts/rollout-report.py)
#   scripts/bench.sh chaos-sharded  sharded nodes (examples/sharded_node.rs, 16 shards): at least
#                               300 faults per backend (CHAOS_FAULTS), etcd and Kubernetes at once
#                               (about 40 minutes on 2 cores); every shard checked on its own;
#                               prints the table of docs/chaos/RESULTS.md
#   scripts/bench.sh churn      sharded nodes under a seeded churn of joins, SIGTERMs, SIGKILLs and
#                               SIGSTOPs (tests/sharded_processes/churn.rs): CHURN_SECS (300) per
#                               backend and seed, for each of CHURN_SEEDS ("37 1 3"), etcd and
#                               Kubernetes one after the other (about 35 minutes); prints the spans
#                               without a worker of each run; a span past TTL + 1 s fails it
#   scripts/bench.sh model      the model check of the Kubernetes bound-record protocol in its large
#                               configuration (tests/protocol_model.rs, release build: 338M states,
#                               43 min and 6 GB on 2 cores), then every rule removal of the CI configuration;
#                               prints the states explored (no server needed: it runs without one)
#
# Every bench runs with --check: the script goes on after a bench that missed a target or failed,
# and exits with status 1 at the end if any did (a documented known miss does not count).
# Output: the console, one log per bench and the results (results.jsonl) in target/bench-results/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode=${1:-full}
case $mode in
    full | quick | chaos | chaos-long | chaos-sharded | rollouts | churn | model) ;;
    --inner) ;;
    *)
        sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
esac

if [[ $mode == model ]]; then
    # No server: the model is the protocol's, with the store in it.
    export CARGO_TERM_COLOR=never
    mkdir -p target/bench-results
    log=target/bench-results/model.log
    echo "=== model: the large configuration, then the rule removals ($(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), load $(cut -d' ' -f1-3 /proc/loadavg))" | tee "$log"
    status=0
    cargo test --release --all-features --test protocol_model -- --include-ignored --nocapture 2>&1 | tee -a "$log" || status=1
    grep -E '^protocol model|violated after' "$log"
    exit $status
fi

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
    export BENCH_SHARDED_ROUNDS=${BENCH_SHARDED_ROUNDS:-2}
    export BENCH_IDLE_WINDOW_SECS=${BENCH_IDLE_WINDOW_SECS:-30} BENCH_FLEET_WINDOW_SECS=${BENCH_FLEET_WINDOW_SECS:-30}
    export BENCH_LARGE_WINDOW_SECS=${BENCH_LARGE_WINDOW_SECS:-60}
fi

export BENCH_RESULTS_FILE=$PWD/$out/results.jsonl

failed=()
bench() { # LOG-NAME CARGO-ARGS...
    local log=$out/$1.log name=$1
    shift
    echo "=== cargo bench $* ($(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg))" | tee "$log"
    if ! cargo bench "$@" 2>&1 | tee -a "$log"; then
        failed+=("$name")
        echo "=== $name FAILED (a target missed, or an error: see $log)" | tee -a "$log"
    fi
}

if [[ $mode == chaos ]]; then
    for backend in ${CHAOS_BACKENDS:-etcd kubernetes etcd_cluster}; do
        echo "=== chaos $backend, 600 s" | tee "$out/chaos-$backend.log"
        CHAOS_SECONDS=600 CHAOS_SEED=${CHAOS_SEED:-20261122} \
            cargo test --all-features --test chaos -- --exact "chaos_$backend" --nocapture 2>&1 |
            tee -a "$out/chaos-$backend.log"
    done
    exit 0
fi

if [[ $mode == chaos-long ]]; then
    log=$out/chaos-long.log
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    git diff --quiet HEAD 2>/dev/null || commit="$commit+changes"
    echo "=== chaos-long: ${CHAOS_FAULTS:-1000} faults per backend ($(date -u +%FT%TZ), commit $commit, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee "$log"
    status=0
    CHAOS_FAULTS=${CHAOS_FAULTS:-1000} CHAOS_SECONDS=${CHAOS_SECONDS:-0} CHAOS_SEED=${CHAOS_SEED:-20261124} \
        cargo test --all-features --test chaos -- --exact chaos_etcd chaos_kubernetes chaos_etcd_cluster \
        --test-threads=3 --nocapture 2>&1 | tee -a "$log" || status=1
    # The run directories this run made, named in the summaries it printed.
    mapfile -t dirs < <(grep -o 'timeline: [^ ]*/target/chaos/[^/ ]*' "$log" | sed 's/^timeline: //' | sort -u)
    python3 scripts/chaos-summary.py "${dirs[@]}" | tee -a "$log" || status=1
    exit $status
fi

rollouts() {
    local log=$out/rollouts.log
    echo "=== rollouts: ${ROLLOUTS:-100} per backend and policy ($(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), load $(cut -d' ' -f1-3 /proc/loadavg))" | tee "$log"
    rm -f target/rollout/results.jsonl
    local status=0
    ROLLOUTS=${ROLLOUTS:-100} cargo test --all-features --test rollout -- --nocapture --test-threads=1 2>&1 |
        grep -v ' rollout [0-9]*: leader before' | tee -a "$log" || status=1
    python3 scripts/rollout-report.py target/rollout/results.jsonl | tee -a "$log" || status=1
    return $status
}

if [[ $mode == rollouts ]]; then
    rollouts
    exit $?
fi

if [[ $mode == churn ]]; then
    log=$out/churn.log
    echo "=== churn: ${CHURN_SECS:-300} s per backend and seed, seeds ${CHURN_SEEDS:-37 1 3} ($(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), load $(cut -d' ' -f1-3 /proc/loadavg))" | tee "$log"
    status=0
    for seed in ${CHURN_SEEDS:-37 1 3}; do
        CHURN_SECS=${CHURN_SECS:-300} CHURN_SEED=$seed cargo test --all-features --test sharded_processes \
            -- churn_leaves --test-threads=1 --nocapture 2>&1 | tee -a "$log" || status=1
    done
    grep -E '^(etcd|kubernetes): churn of' "$log"
    exit $status
fi

if [[ $mode == chaos-sharded ]]; then
    log=$out/chaos-sharded.log
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    git diff --quiet HEAD 2>/dev/null || commit="$commit+changes"
    echo "=== chaos-sharded: ${CHAOS_FAULTS:-300} faults per backend ($(date -u +%FT%TZ), commit $commit, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee "$log"
    status=0
    CHAOS_FAULTS=${CHAOS_FAULTS:-300} CHAOS_SECONDS=${CHAOS_SECONDS:-0} CHAOS_SEED=${CHAOS_SEED:-20261126} \
        cargo test --all-features --test chaos -- --exact chaos_sharded_etcd chaos_sharded_kubernetes \
        --test-threads=2 --nocapture 2>&1 | tee -a "$log" || status=1
    mapfile -t dirs < <(grep -o 'timeline: [^ ]*/target/chaos/[^/ ]*' "$log" | sed 's/^timeline: //' | sort -u)
    python3 scripts/chaos-summary.py "${dirs[@]}" | tee -a "$log" || status=1
    exit $status
fi

# This run's results only (an earlier run's file is kept beside it).
if [[ -s $BENCH_RESULTS_FILE ]]; then
    mv "$BENCH_RESULTS_FILE" "$out/results-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
fi

if [[ $mode == quick ]]; then
    BENCH_GUARD_ROUNDS=${BENCH_GUARD_ROUNDS:-30} bench guard --bench guard -- --check
else
    bench guard --bench guard -- --check
fi
bench handoff-memory --bench handoff -- memory handoff transfer failover --check
bench handoff-kubernetes --all-features --bench handoff -- kubernetes all --check
bench handoff-etcd --all-features --bench handoff -- etcd all --check
bench handoff-etcd-cluster --all-features --bench handoff -- etcd-cluster handoff failover kill --check
bench sharded-kubernetes --all-features --bench sharded -- kubernetes --check
bench sharded-etcd --all-features --bench sharded -- etcd --check
bench fleet-etcd --all-features --bench fleet -- etcd --check
bench fleet-kubernetes --all-features --bench fleet -- kubernetes --check
# 16 nodes × 4,096 shards (issue 37), about 10 minutes each; the quick run a smaller window.
bench fleet-large-kubernetes --all-features --bench fleet -- kubernetes large --check
bench fleet-large-etcd --all-features --bench fleet -- etcd large --check
if [[ $mode == quick ]]; then
    bench scale-memory --bench scale -- memory 10000 --check
    bench scale-kubernetes --all-features --bench scale -- kubernetes 200 --check
    bench scale-etcd --all-features --bench scale -- etcd 2000 --check
    bench in-memory --bench in_memory -- --warm-up-time 1 --measurement-time 3
    BENCH_ROUTING_ROUNDS=${BENCH_ROUTING_ROUNDS:-2} \
        bench routing --features web --bench routing -- --warm-up-time 1 --measurement-time 3
    bench metrics-off --bench metrics -- --warm-up-time 1 --measurement-time 3
    bench metrics-on --features metrics --bench metrics -- --warm-up-time 1 --measurement-time 3
else
    bench scale-memory --bench scale -- memory 100000 --check
    bench scale-kubernetes --all-features --bench scale -- kubernetes 1000 --check
    SCALE_TTL_SECS=30 SCALE_RENEWAL_SECS=10 \
        bench scale-kubernetes-30s --all-features --bench scale -- kubernetes 1000 --check
    bench scale-etcd --all-features --bench scale -- etcd 10000 --check
    bench scale-etcd-1000 --all-features --bench scale -- etcd 1000 --check
    bench group-watch --all-features --bench group_watch -- kubernetes etcd --check
    bench in-memory --bench in_memory
    bench routing --features web --bench routing
    bench metrics-off --bench metrics
    bench metrics-on --features metrics --bench metrics
fi
# Rolling updates (tests/rollout.rs; their own table, scripts/rollout-report.py).
if [[ $mode == quick ]]; then
    ROLLOUTS=${ROLLOUTS:-10} rollouts || failed+=(rollouts)
else
    rollouts || failed+=(rollouts)
fi

# The tables: a full run updates benches/data/results.jsonl, BENCHMARKS.md and the README's
# "Measured" sentence; a quick run (fewer rounds) only writes a preview beside its results.
if [[ ! -s $BENCH_RESULTS_FILE ]]; then
    echo "=== no results written" >&2
    failed+=(results)
elif [[ $mode == quick ]]; then
    cp benches/data/results.jsonl "$out/data-quick.jsonl"
    python3 scripts/bench-report.py --merge "$BENCH_RESULTS_FILE" --data "$out/data-quick.jsonl" \
        --out "$out/BENCHMARKS.quick.md" --readme-out "$out/README.quick.md" || failed+=(report)
else
    python3 scripts/bench-report.py --merge "$BENCH_RESULTS_FILE" || failed+=(report)
fi

if ((${#failed[@]})); then
    echo "=== FAILED: ${failed[*]}; logs and results in $out/" >&2
    exit 1
fi
echo "=== done, every target met (or a documented known miss); logs and results in $out/"
