"""The engine-API examples on a GPU, with the path each weight sync took and its verification.

    python -m benchmarks.engine_examples [--workdir /tmp/engine_examples] [--out results/engine_examples.json]

Runs `examples.engine_quickstart` and `examples.engine_lora` on a random-init Qwen2 of the 0.5B shape
(train engine colocated with the vLLM engine: CUDA IPC), the quick start again with the train engine on its
own GPU when there are two (NCCL broadcast), and `examples.engine_vlm` on its tiny vision-language model.
Each sync is verified against the trainer's log-probs of a probe batch.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks.gpu_grpo_step import build_model
from examples import engine_lora, engine_quickstart, engine_vlm


def _timed(name: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    start = time.perf_counter()
    result = run()
    row: dict[str, Any] = {"example": name, "wall_s": round(time.perf_counter() - start, 2),
                           "loss_first": result["losses"][0], "loss_last": result["losses"][-1]}
    train = result["train"]
    if "infer" in result:
        row.update({"sync_path": train.sync_path, **result["sync"], "greedy_changed": result["after"] != result["before"]})
        result["infer"].shutdown()
    train.shutdown()
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/tmp/engine_examples")
    parser.add_argument("--out", default="results/engine_examples.json")
    args = parser.parse_args()
    from single_controller.ray.local_cluster import init_local_ray, prepend_pythonpath

    work = Path(args.workdir)
    model = work / "model_0.5B"
    if not model.is_dir():
        build_model(model)
    vlm = work / "tiny_vlm"
    if not vlm.is_dir():
        engine_vlm.build_tiny_vlm(vlm)
    gpus = torch.cuda.device_count()
    init_local_ray(num_cpus=8, num_gpus=gpus, runtime_env={"env_vars": {"PYTHONPATH": prepend_pythonpath(os.getcwd())}})
    rows = [
        _timed("quickstart (colocated)", lambda: engine_quickstart.run(str(model))),
        _timed("lora (colocated)", lambda: engine_lora.run(str(model))),
    ]
    if gpus >= 2:
        rows.append(_timed("quickstart (own GPU)", lambda: engine_quickstart.run(str(model), colocate=False)))
    rows.append(_timed("vlm", lambda: engine_vlm.run(str(vlm))))
    result = {"device": torch.cuda.get_device_name(0) if gpus else "cpu", "gpus": gpus, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
