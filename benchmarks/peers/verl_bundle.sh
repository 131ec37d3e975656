#!/usr/bin/env bash
# Build .peerwhl/ for the GPU machine: the verl 0.9.1 wheel (no dependencies) and the packages verl's
# main_ppo (FSDP2 actor, hybrid vLLM rollout, the v1 trainer with TransferQueue) imports that neither the
# GPU image, nor ../shared/device/vllm_stage.sh's .vllm2, nor ../shared/device/bundle.sh's .devwhl carry.
# Found by importing verl's run path against vLLM 0.26's source with only those packages visible.
# tensordict is pinned to 0.10.0 (verl 0.9.1 declares <=0.10; with the project's 0.15, three of verl's own
# tensordict tests fail: NonTensorData concatenation keeps every value instead of the first), so .peerwhl
# is installed into its own folder, /tmp/verl_site, which only verl's process puts first on PYTHONPATH.
# .peerwhl/trl/ holds TRL's side: trl 1.16.0 (it accepts vLLM 0.22-0.31, so the staged 0.26.0) and the two
# packages its GRPOTrainer imports that the GPU image lacks, datasets and multiprocess (dill comes with .vllm2;
# accelerate, pandas, pyarrow, xxhash, requests are in the image); installed into /tmp/trl_site.
#
# Usage, from the project's root:  benchmarks/peers/verl_bundle.sh     (about 1 minute; ~6 MB)
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
grep -qx '/.peerwhl/' "$exclude" 2>/dev/null || echo '/.peerwhl/' >> "$exclude"
out=.peerwhl
rm -rf "$out"; mkdir -p "$out"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
quiet() { grep -v '^WARNING: Location' >&2 || true; }
python3 -m pip download -q --no-deps "${plat[@]}" -d "$out" \
  verl==0.9.1 tensordict==0.10.0 'pyvers<0.2,>=0.1' torchdata==0.11.0 TransferQueue==0.1.11 \
  'datasets>=4.7' 'multiprocess<0.70.20' orjson uvicorn model-hosting-container-standards jmespath loguru \
  pylatexenc codetiming 2> >(quiet)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$out/trl" trl==1.16.0 'datasets>=4.7' 'multiprocess<0.70.20' 2> >(quiet)
du -sh "$out" "$out/trl"
cat <<'EOT'
On the GPU machine (after the vLLM and .devwhl calls), name .peerwhl in carry and start with
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/verl_site .peerwhl/*.whl &&
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/trl_site .peerwhl/trl/*.whl || exit;
then `python3 -m benchmarks.peers.verl_gpu` gives verl PYTHONPATH=/tmp/verl_site:... and TRL /tmp/trl_site:...
EOT
