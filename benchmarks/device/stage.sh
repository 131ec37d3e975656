#!/usr/bin/env bash
# Stage what the GPU suite needs on the GPU machine (no network there) as four carries, each of which fits one
# device call beside the project's tree (64 MiB together): run from the project's root, about 5 minutes.
#   .vllm1/c.so.xz            vLLM 0.26.0's main kernel library (56 MB as xz)
#   .vllm2/                   the rest of vLLM (vllm_rest.tar.xz), the packages it imports, FlashAttention 3
#   .devwhl/                  ray, tensordict, hydra, ... (../shared/device/bundle.sh), megatron-core, liger-kernel
#   .vllmmoe/moe.so.xz        vLLM's fused-MoE kernels (the MoE cases; vllm_stage.sh leaves them out)
# Then benchmarks/device/suite_calls.sh gives the device calls in order (V1, V2, W, MO).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
for d in .vllmmoe; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
../shared/device/vllm_stage.sh
../shared/device/bundle.sh megatron-core==0.19.2 > /dev/null
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .devwhl liger-kernel==0.8.5 2> >(grep -v '^WARNING: Location' >&2 || true)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# .vllm1 as vllm_stage.sh leaves it is over 60 MiB, which with the tree exceeds a call: its biggest library travels
# alone and the rest of vLLM moves to .vllm2.
xz -dc .vllm1/vllm.tar.xz | tar xf - -C "$tmp"
xz -T2 -6 -c "$tmp/vllm/_C_stable_libtorch.abi3.so" > "$tmp/c.so.xz"
rm "$tmp/vllm/_C_stable_libtorch.abi3.so" .vllm1/vllm.tar.xz
mv "$tmp/c.so.xz" .vllm1/
(cd "$tmp" && tar cf - vllm vllm-*.dist-info | xz -T2 -6) > .vllm2/vllm_rest.tar.xz
rm -rf "$tmp"/*
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d "$tmp" vllm==0.26.0 2> >(grep -v '^WARNING: Location' >&2 || true)
mkdir -p .vllmmoe
unzip -p "$tmp"/vllm-0.26.0-*.whl vllm/_moe_C_stable_libtorch.abi3.so | xz -T2 -6 > .vllmmoe/moe.so.xz
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
for d in .vllm1 .vllm2 .devwhl .vllmmoe; do
  size=$(du -sb "$d" | cut -f1)
  echo "$d $((size >> 20)) MiB + tree $((tree >> 20)) MiB = $(((size + tree) >> 20)) MiB of 64"
done
