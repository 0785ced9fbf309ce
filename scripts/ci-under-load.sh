#!/usr/bin/env bash
# Runs the CI (or any command) several times while busy processes keep every core of the machine
# busy, to show that the suite passes on a loaded machine (load 5-8 is common where it runs).
#
# Usage:
#   scripts/ci-under-load.sh [RUNS] [-- CMD ARGS...]
#
# RUNS defaults to 3, CMD to `bash .ci/run`. BUSY (default: the number of cores) is how many busy
# processes run beside it, at normal priority. Each run's output goes to
# target/ci-under-load/run-N.log; the summary (exit status, duration, load average at the end of
# each run) to target/ci-under-load/summary.txt. Exits non-zero if any run failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

runs=3
if [[ $# -gt 0 && $1 != "--" ]]; then
    runs=$1
    shift
fi
[[ ${1:-} == "--" ]] && shift
cmd=("$@")
[[ ${#cmd[@]} -eq 0 ]] && cmd=(bash .ci/run)
busy=${BUSY:-$(nproc)}

out=target/ci-under-load
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"

pids=()
stop_busy() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait "${pids[@]}" 2>/dev/null || true
}
trap stop_busy EXIT
for _ in $(seq "$busy"); do
    # A process that never sleeps: one core's worth of load each.
    sh -c 'while :; do :; done' &
    pids+=($!)
done
echo "[ci-under-load] $busy busy processes (pids ${pids[*]}); $runs run(s) of: ${cmd[*]}" | tee -a "$summary"

failed=0
for n in $(seq "$runs"); do
    start=$(date +%s)
    if "${cmd[@]}" >"$out/run-$n.log" 2>&1; then status=0; else status=$?; fi
    took=$(($(date +%s) - start))
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    line="run $n: exit $status in ${took}s (load average at the end: $load; log: $out/run-$n.log)"
    echo "[ci-under-load] $line" | tee -a "$summary"
    if [[ $status -ne 0 ]]; then
        failed=1
        grep -E '^test .* FAILED$|panicked at|^error' "$out/run-$n.log" | head -20 | sed 's/^/    /' | tee -a "$summary"
    fi
done
exit "$failed"
