#!/usr/bin/env bash
# The GPU suite's part one on a one-GPU machine in five device calls made back to back (the machine is given back
# 30 s after a call, /tmp with it), after benchmarks/device/stage.sh:
#   1. carry [".vllm1"]    benchmarks/device/suite_calls.sh V1
#   2. carry [".vllm2"]    benchmarks/device/suite_calls.sh V2
#   3. carry [".devwhl"]   SUITE_COMMIT=<commit> benchmarks/device/suite_calls.sh W     (half the dense cases)
#   4. carry [".vllmmoe"]  SUITE_COMMIT=<commit> benchmarks/device/suite_calls.sh MO    (the mixture-of-experts cases, the other half)
#   5.                     SUITE_COMMIT=<commit> benchmarks/device/suite_calls.sh A     (the other cases that run alone)
#   later, on the same machine:  benchmarks/device/suite_calls.sh R <case> ...     (JOBS, LIMIT from the environment)
# For other runs after V1 and V2: D (carry .devwhl) installs the wheels, M (carry .vllmmoe) the fused-MoE kernels.
# Each suite call writes its JSON, its log and a tar of the failed commands' logs and every case's metrics to $OUT.
set -uo pipefail
mode=$1; shift
site=/tmp/site
suite_env() {
  export VLLM_USE_FLASHINFER_SAMPLER=0 RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
    PYTHONPATH=$PWD SUITE_COMMIT=${SUITE_COMMIT:-unknown} CUDA_VISIBLE_DEVICES=0
}
# Part one in three calls of at most ~9 minutes: W the second half of the dense cases and the first that runs alone
# (the engine examples, the longest); MO the cases on the tiny mixture of experts (they need vLLM's fused-MoE kernels,
# staged in that call) with the first half of the dense ones; A the other cases that run alone, one after another.
part_one_cases() {
  python3 - "$1" <<'PY'
import sys
from benchmarks.gpu_cases import cases
part_one = cases("one")
moe = {c.name for c in part_one if "tiny_moe" in " ".join(c.command_lines())}
alone = [c.name for c in part_one if c.alone]
dense = [c.name for c in part_one if c.name not in moe and not c.alone]
shared = [c.name for c in part_one if c.name in moe and not c.alone]
first_dense = max(0, (len(dense) - len(shared)) // 2)
calls = {"W": dense[first_dense:] + alone[:1], "MO": shared + dense[:first_dense], "A": alone[1:]}
print(" ".join(calls[sys.argv[1]]))
PY
}
suite() {  # suite <tag> <jobs> <limit_s> <case> ...
  local tag=$1 jobs=$2 limit=$3; shift 3
  suite_env
  timeout "$limit" python3 -m benchmarks.gpu_suite --part one --jobs "$jobs" --out "$OUT/gpu_suite_one_${tag}.json" \
    --workdir /tmp/gpu_suite --only "$@" 2>&1 | tee "$OUT/suite_${tag}.log" | grep -E '^\[gpu_suite\]|cases passed| one '
  python3 - "$OUT/logs_${tag}.tar.xz" <<'PY'
import sys, tarfile
from pathlib import Path
with tarfile.open(sys.argv[1], "w:xz") as tar:
    for case in Path("/tmp/gpu_suite").iterdir():
        for log in case.glob("command_*.log"):
            if "Traceback" in log.read_text(errors="replace"):
                tar.add(log, arcname=f"{case.name}/{log.name}")
        for metrics in [*case.rglob("metrics.jsonl"), *case.glob("history.json")]:
            tar.add(metrics, arcname=f"{case.name}/{metrics.relative_to(case)}")
PY
}
unxz_to() { python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$1" "$2"; }
case $mode in
V1) mkdir -p $site/vllm && unxz_to .vllm1/c.so.xz $site/vllm/_C_stable_libtorch.abi3.so ;;
V2) python3 -c "import tarfile; tarfile.open('.vllm2/vllm_rest.tar.xz').extractall('$site')" &&
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $site .vllm2/*.whl &&
    unxz_to .vllm2/fa3.so.xz $site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so &&
    echo $site > "$(python3 -c 'import site; print(site.getsitepackages()[0])')/zz_site.pth" && du -sh $site ;;
D) python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $site .devwhl/*.whl ;;
M) unxz_to .vllmmoe/moe.so.xz $site/vllm/_moe_C_stable_libtorch.abi3.so ;;
W) python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $site .devwhl/*.whl || exit 1
   suite_env
   python3 -c "import vllm, ray, megatron.core, liger_kernel; print('vllm', vllm.__version__, 'ray', ray.__version__)" || exit 1
   nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
   # shellcheck disable=SC2046
   suite w "${JOBS:-6}" "${LIMIT:-560}" $(part_one_cases W) ;;
MO) unxz_to .vllmmoe/moe.so.xz $site/vllm/_moe_C_stable_libtorch.abi3.so || exit 1
   suite_env
   # shellcheck disable=SC2046
   suite mo "${JOBS:-6}" "${LIMIT:-570}" $(part_one_cases MO) ;;
A) # shellcheck disable=SC2046
   suite_env; suite a 1 "${LIMIT:-570}" $(part_one_cases A) ;;
R) suite r "${JOBS:-4}" "${LIMIT:-560}" "$@" ;;
*) echo "mode: V1, V2, W, MO, A, R, D or M (got '$mode')"; exit 2 ;;
esac
