#!/bin/bash
# The seeds' compile race on the GPU (issue 23 item 5), beside the recipe lanes:
# bench/traces/compile_race.py with 3 threads, each try on its own cold inductor
# cache, then on the warm cache the first cold try left, with --serial-first (each
# thread's first call, where dynamo traces and inductor compiles, one after another;
# then all at once) and, for comparison, without it (all threads trace at once).
# A try past 150 s gets SIGABRT (PYTHONFAULTHANDLER=1 prints every thread's stack).
#   bash bench/recipes_gpu/race.sh OUT.txt
out=${1:?usage: race.sh OUT.txt}
here=$(cd "$(dirname "$0")/../traces" && pwd)
try() {  # NAME CACHE ARGS...
    local name=$1 cache=$2; shift 2
    local t0=$SECONDS
    TORCHINDUCTOR_CACHE_DIR=$cache TRITON_CACHE_DIR=$cache/triton PYTHONFAULTHANDLER=1 \
        timeout -s ABRT -k 15 150 python3 "$here/compile_race.py" --threads 3 "$@" > "/tmp/race_$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc seconds=$((SECONDS - t0)) $(grep -E '^race:' "/tmp/race_$name.log" || echo 'race: no result (hung or died)')" \
        | tee -a "$out"
    grep -m1 -E 'FAILED' "/tmp/race_$name.log" | cut -c1-200 | tee -a "$out"
}
rm -rf /tmp/race_c1 /tmp/race_c2 /tmp/race_c3
for i in 1 2 3; do try "cold_serial_$i" "/tmp/race_c$i" --serial-first; done
for i in 1 2 3; do try "warm_serial_$i" /tmp/race_c1 --serial-first; done
for i in 1 2 3; do try "warm_concurrent_$i" /tmp/race_c1; done
