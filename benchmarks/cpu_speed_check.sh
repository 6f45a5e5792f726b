#!/usr/bin/env bash
# Engine speed on this CPU against vLLM's CPU engine, at fp32 and bf16, every row of the README's "Engine speed
# on a CPU" tables in one go, so that a machine of another kind (one with AMX, say) is measured the same way:
# bench_real_shapes.py on the SmolLM2 and TinyLlama shapes (or a real checkpoint), 16x128/64 and 50x128/128,
# each precision; on a CPU with AMX the same again with KVBENCH_AMX=0 (the AVX-512 path that CPUs without AMX
# take). Each run's output, with lscpu and the load before and after it, lands in $OUT (default
# /tmp/kvbench-cpu-check) as one file per run; the last lines of each are a table ready to paste. Keep the
# machine quiet while it runs: figures by wall clock are only worth something on an idle machine.
#
#   VLLM_PYTHON=/path/to/vllm-venv/bin/python bash benchmarks/cpu_speed_check.sh [--checkpoint DIR] [--rounds N]
#   bash benchmarks/cpu_speed_check.sh --workloads 2x16x4 --rounds 1     # a quick look that everything runs
#
# Without VLLM_PYTHON vLLM is left out (kvbench and transformers only). On a 2-core Zen 4, with vLLM and 2 rounds,
# each precision took 30-40 minutes (SmolLM2 both workloads 12-15, TinyLlama 16 requests 12-24); the TinyLlama
# 50-request rows (paged and vLLM only), which take longer still, run only with FULL=1.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/kvbench-cpu-check}"
mkdir -p "$out"
checkpoint=""
rounds=2
workloads=""  # each shape's own default (the README's rows)
while [ $# -gt 0 ]; do
    case "$1" in
        --checkpoint) checkpoint="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --workloads) workloads="$2"; shift 2 ;;
        *) echo "error: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
if [ -n "$checkpoint" ] && [ ! -f "$checkpoint/config.json" ]; then
    echo "error: --checkpoint $checkpoint has no config.json" >&2
    exit 2
fi
vllm=()
if [ -n "${VLLM_PYTHON:-}" ]; then
    "$VLLM_PYTHON" -c "import vllm" 2>/dev/null || { echo "error: $VLLM_PYTHON cannot import vllm" >&2; exit 2; }
    vllm=(--vllm-python "$VLLM_PYTHON")
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

amx_modes=(default)
if grep -q amx_tile /proc/cpuinfo; then
    amx_modes=(default off)
fi

status=0
measure() {  # name, then bench_real_shapes.py's arguments
    local name="$1"; shift
    local file="$out/$name.txt"
    {
        date -u
        lscpu | grep -E '^(Model name|CPU family|Model:|CPU\(s\)|Thread|Core|L1d|L2|L3)'
        grep -o -w -E 'amx_tile|amx_bf16|avx512_bf16|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
        echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
        echo "+ ${AMX_ENV:-}python3 benchmarks/bench_real_shapes.py $*"
    } > "$file"
    echo "== $name"
    python3 benchmarks/bench_real_shapes.py "$@" 2>&1 | tee -a "$file" | tail -n 12
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "$name failed (see $file)"; status=1; }
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$file"
}

# the real checkpoint when given, else SmolLM2's shape with random weights
if [ -n "$checkpoint" ]; then
    small=(checkpoint --shapes checkpoint --checkpoint "$checkpoint")
else
    small=(smollm2 --shapes smollm2)
fi
for amx in "${amx_modes[@]}"; do
    unset KVBENCH_AMX  # the default mode is the CPU's own choice, whatever the caller's environment says
    AMX_ENV=""
    suffix=""
    if [ "$amx" = off ]; then
        export KVBENCH_AMX=0
        AMX_ENV="KVBENCH_AMX=0 "
        suffix="_amx_off"
    fi
    for dtype in fp32 bf16; do
        common=(--dtype "$dtype" --clock wall --rounds "$rounds" "${vllm[@]}")
        measure "${small[0]}_${dtype}${suffix}" "${common[@]}" "${small[@]:1}" \
            --workloads "${workloads:-16x128x64,50x128x128}"
        measure "tinyllama16_${dtype}${suffix}" "${common[@]}" --shapes tinyllama --workloads "${workloads:-16x128x64}"
        if [ "${FULL:-0}" = 1 ]; then
            measure "tinyllama50_${dtype}${suffix}" "${common[@]}" --shapes tinyllama \
                --workloads "${workloads:-50x128x128}" --engines "paged${VLLM_PYTHON:+,vllm}"
        fi
    done
done
echo "cpu_speed_check status: $status (files in $out)"
exit $status
