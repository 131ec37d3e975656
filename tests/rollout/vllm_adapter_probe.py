"""Run as a script (its own process: vLLM in-process creates a default torch.distributed group): starts a LoRA-enabled
vLLM engine on the CPU for a model folder and registers adapters through `register_adapter` as a weight sync does;
prints what the engine's LoRA manager holds after each registration and how its prompt log-probs compare with
PEFT's model carrying the same adapter."""

from __future__ import annotations

import json
import sys
from typing import Any

import torch


def _manager_state(worker: Any) -> dict[str, Any]:
    from workers.lora.vllm_adapter import ADAPTER_ID, lora_factors
    from workers.rollout.verify import WeightFingerprint

    adapters = worker.model_runner.lora_manager._adapter_manager
    registered = adapters.list_adapters()
    lora = registered.get(ADAPTER_ID)
    cached_sum = WeightFingerprint()  # vLLM's copy, as it stands now
    cached_sum.add(lora_factors(lora) if lora is not None else [])
    return {
        "registered": sorted(registered),
        "slots": [slot for slot in adapters.lora_index_to_id if slot is not None],
        "devices": sorted({t.device.type for t in lora_factors(lora)}) if lora is not None else [],
        "cached_sum": cached_sum.value,
    }


def main(model_path: str) -> None:
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams, TokensPrompt

    from tests.rollout.engine_probe import cpu_lora_llm
    from workers.lora.model import add_lora_adapters
    from workers.lora.spec import LoraSpec
    from workers.lora.vllm_adapter import adapter_request, register_adapter

    spec = LoraSpec.from_model_config({"lora_rank": 8, "lora_alpha": 16, "target_modules": "all-linear"})
    llm = cpu_lora_llm(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    add_lora_adapters(model, spec)
    prompt = list(range(3, 40))
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)

    def largest_gap() -> float:
        """Engine log-probs of the prompt with the adapter against PEFT's model's."""
        (output,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, lora_request=adapter_request(),
                                 use_tqdm=False)
        engine = torch.tensor([step[t].logprob for step, t in zip(output.prompt_logprobs[1:], prompt[1:])])
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0, :-1].float()
        reference = logits.log_softmax(-1).gather(-1, torch.tensor(prompt[1:])[:, None])[:, 0]
        return float((engine - reference).abs().max())

    def register(pairs: list[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        config = spec.adapter_config()
        try:
            (registered,) = llm.collective_rpc(lambda worker: register_adapter(worker.model_runner, pairs, config))
            taken = {"count": registered.tensors, "fingerprint": registered.fingerprint, "error": None}
        except Exception as raised:  # the probe reports it; the test decides
            taken = {"count": 0, "fingerprint": 0.0, "error": str(raised)}
        (state,) = llm.collective_rpc(_manager_state)
        return {**taken, **state}

    report = []
    for seed in (1, 2):  # two syncs: each adapter replaces the previous one
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:  # B starts at zero: give every factor an effect
                    param.normal_(std=0.05)
        pairs = [(name, param.detach()) for name, param in model.named_parameters() if "lora_" in name]
        state = register(pairs)  # before any request: the adapter is in its slot already
        report.append({**state, "tensors": len(pairs), "gap": largest_gap()})
    # An adapter naming a module vLLM cannot adapt (the embedding's factors) is refused.
    hidden = model.config.hidden_size
    extra = [("model.embed_tokens.lora_A.default.weight", torch.zeros(8, hidden)),
             ("model.embed_tokens.lora_B.default.weight", torch.zeros(hidden, 8))]
    report.append(register([*pairs, *extra]))
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
