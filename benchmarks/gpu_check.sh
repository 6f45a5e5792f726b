#!/usr/bin/env bash
# One-shot GPU check of the KV kernels on a CUDA machine (under 5 minutes on an H200): Triton vs torch
# reference in fp16 (full grid), bf16 and fp32, the decode benchmark on Llama-2-13B's attention shape with
# its two goals (>= 70% of copy bandwidth, paged/contiguous <= 1.15), a small tile sweep, and `kvbench
# kernels` on CUDA. Results land in $OUT (default /tmp/kvbench-gpu-check): gpu_check.json, gpu_check.log,
# kernels_cli.json (+ pytest.log when KVBENCH_GPU_PYTEST=1 also runs tests/kernels compiled for the GPU;
# allow 4 more minutes).
#
#   bash benchmarks/gpu_check.sh            # from the repository root
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/kvbench-gpu-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0

# Import the checkout's kvbench/ directly instead of installing it: nothing is fetched.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py="python3"

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.memory --format=csv || true
$py -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"

status=0
timeout 220 $py benchmarks/gpu_check.py --out "$out" 2>&1 | tee "$out/gpu_check.log" || status=1
timeout 45 $py -c "from kvbench.cli import main; raise SystemExit(main(['kernels', '--json', '--out', '$out/kernels_cli.json', '--batch', '1,64', '--context', '2048', '--repeat', '5']))" \
    > /dev/null 2> "$out/kernels_cli.err" || { echo "kvbench kernels CLI failed (see kernels_cli.err)"; status=1; }
# The kernel test suite compiled for the GPU (fp32, many more compiles): only on request, it may not fit.
if [ "${KVBENCH_GPU_PYTEST:-0}" = 1 ]; then
    timeout 240 $py -m pytest tests/kernels -q -x -p no:cacheprovider 2>&1 | tee "$out/pytest.log" || status=1
fi
echo "gpu_check status: $status (files in $out)"
exit $status
