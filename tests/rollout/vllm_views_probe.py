"""Run as a script (its own process: vLLM in-process creates a default torch.distributed group): starts a LoRA-enabled
vLLM engine on the CPU for a model folder, reads its weights as `checkpoint_views` names them, and prints, per
parameter of the Hugging Face model, whether the engine holds a view of that name with its shape and values."""

from __future__ import annotations

import json
import sys


def main(model_path: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from tests.rollout.engine_probe import cpu_lora_llm
    from workers.rollout.vllm_base_views import checkpoint_views, keep_plain_cpu_weights

    keep_plain_cpu_weights()
    llm = cpu_lora_llm(model_path)
    (views,) = llm.collective_rpc(lambda worker: {
        name: tensor.clone() for name, tensor in checkpoint_views(worker.model_runner.get_model()).items()
    })
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    report = {}
    for name, param in model.named_parameters():
        view = views.get(name)
        if view is None:
            report[name] = "missing"
        elif tuple(view.shape) != tuple(param.shape):
            report[name] = f"shape {tuple(view.shape)} in the engine, {tuple(param.shape)} in the model"
        else:
            report[name] = "equal" if torch.equal(view, param.detach()) else "values differ"
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
