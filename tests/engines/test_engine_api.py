"""The engine API on a real Ray cluster with vLLM (CPU build): the quick-start flow, LoRA with merged
export, residency, and the errors users hit first."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from examples import engine_lora, engine_quickstart
from workers.engines import InferenceEngine, NeedParallel, TrainEngine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from trainer.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("engine") / "model", seed=0))


def _shutdown(result):
    result["train"].shutdown()
    result["infer"].shutdown()


def test_quickstart_flow_trains_syncs_and_changes_generation(ray_cluster, model_path):
    result = engine_quickstart.run(model_path, steps=5)
    try:
        losses = result["losses"]
        assert losses[-1] < 0.7 * losses[0], losses
        # After the sync the engine scores the probe exactly as the trained module does (fp32).
        assert result["sync"]["rollout/sync_logprob_max_diff"] <= 1e-3
        assert result["after"] != result["before"]
        train = result["train"]
        assert train.sync_path == "gloo"  # CPU: the broadcast over gloo
        with pytest.raises(AttributeError, match=r"TinyPolicy has no public method 'train_stpe'; its own methods: .*'train_step'"):
            train.train_stpe
        train.meta()
        with pytest.raises(RuntimeError, match=r"released with .meta\(\); call .cuda\(\) first"):
            train.train_step(NeedParallel([[1, 2, 3]]), 1.0)
        train.cuda()  # re-materialized from the checkpoint: the loss is back where training started
        fresh = train.train_step(NeedParallel([p + [40, 41, 42, 43, 44, 45, 46, 47] for p in [[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16], [17, 18, 19, 20]]]), 1.0)[0]
        assert fresh == pytest.approx(losses[0], rel=1e-4)
    finally:
        _shutdown(result)


def test_lora_trains_and_the_engine_gets_merged_weights(ray_cluster, model_path):
    result = engine_lora.run(model_path, steps=5)
    try:
        train = result["train"]
        assert result["losses"][-1] < result["losses"][0]
        assert result["sync"]["rollout/sync_logprob_max_diff"] <= 1e-3  # engine == LoRA forward
        state, exported = train.state_dict(), train.state_dict(exported=True)
        hf_names = [n for n, _ in AutoModelForCausalLM.from_pretrained(model_path).named_parameters()]
        assert sorted(exported) == sorted(hf_names)  # base names only, no adapter factors
        scaling = 2.0  # lora_alpha / r
        for prefix in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
            a, b = state[f"{prefix}.lora_A.default.weight"], state[f"{prefix}.lora_B.default.weight"]
            assert b.abs().max() > 0  # the adapter trained
            manual = state[f"{prefix}.base_layer.weight"] + scaling * (b @ a)
            torch.testing.assert_close(exported[f"{prefix}.weight"], manual)
        # Frozen base weights did not move; untouched modules export as they are.
        original = AutoModelForCausalLM.from_pretrained(model_path).state_dict()
        torch.testing.assert_close(state["model.layers.0.self_attn.q_proj.base_layer.weight"], original["model.layers.0.self_attn.q_proj.weight"])
        torch.testing.assert_close(exported["model.layers.0.self_attn.k_proj.weight"], original["model.layers.0.self_attn.k_proj.weight"])
        assert result["after"] != result["before"]
    finally:
        _shutdown(result)


def test_hf_executor_receives_trained_weights(ray_cluster, model_path):
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    infer = InferenceEngine(model_path, executor="hf").build()
    with init_empty_weights():
        policy = engine_quickstart.TinyPolicy(AutoConfig.from_pretrained(model_path))
    train = TrainEngine(policy).build(colocate_with=infer)
    try:
        prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
        greedy = {"temperature": 0.0, "max_tokens": 8}
        before = infer.generate(prompts, greedy)[0]
        for _ in range(4):
            train.train_step(NeedParallel([p + [40, 41, 42, 43, 44, 45, 46, 47] for p in prompts]), 1.0)
            train.optimizer_step()
        infer.meta().cuda()  # released and reloaded from the folder: the sync must bring the trained weights
        sync = train.p2p_weight_sync(infer)
        assert sync["rollout/sync_logprob_max_diff"] <= 1e-3
        after = infer.generate(prompts, greedy)[0]
        assert [r["token_ids"] for r in after] != [r["token_ids"] for r in before]
        assert all(len(r["log_probs"]) == len(r["token_ids"]) == 8 for r in after)
    finally:
        train.shutdown()
        infer.shutdown()


def test_engines_name_what_is_wrong(ray_cluster, model_path):
    with pytest.raises(TypeError, match="must subclass workers.engines.TrainModule"):
        TrainEngine(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"executor 'megatron' is not available; valid: \['fsdp2'\]"):
        TrainEngine(engine_lora.lora_policy(model_path), executor="megatron")
    with pytest.raises(ValueError, match=r"executor 'sglang' is not available; valid: \['vllm', 'hf'\]"):
        InferenceEngine(model_path, executor="sglang")
    with pytest.raises(RuntimeError, match="call build"):
        InferenceEngine(model_path).generate([[1, 2]])


def test_vision_language_module_trains_and_syncs_verified_to_an_hf_engine(ray_cluster, tmp_path):
    """One tiny VLM, the example's train engine and one hf engine (a single module build for both checks)."""
    from transformers import AutoConfig, Qwen2VLForConditionalGeneration

    from examples import engine_vlm
    from workers.vision.models import probe_vocab_size

    model_path = str(engine_vlm.build_tiny_vlm(tmp_path / "vlm"))
    result = engine_vlm.run(model_path, steps=4)
    train, infer = result["train"], None
    try:
        # (1) The module trains with its processor on the workers.
        assert train.missing_parameters == []  # every weight came from the checkpoint (renamed by the HF loader)
        # The first step's loss equals the same step on the checkpoint loaded directly on the driver (by the
        # transformers class: a subclass's own from_pretrained misses Qwen2-VL's checkpoint renames).
        reference = engine_vlm.TinyVLPolicy(AutoConfig.from_pretrained(model_path))
        loaded = Qwen2VLForConditionalGeneration.from_pretrained(model_path, dtype=torch.float32)
        reference.load_state_dict(loaded.state_dict())
        reference.on_weights_materialized()
        expected = reference.train_step([(0, "red"), (1, "green"), (2, "blue"), (0, "red")])
        assert result["losses"][0] == pytest.approx(expected, rel=1e-4)
        assert result["losses"][-1] < result["losses"][0]

        # (2) The trained weights sync verified to an hf engine. Qwen2VLConfig keeps vocab_size in its text_config:
        # the trainer's probe reads the language model's vocabulary (below the vision tokens), and the hf executor
        # loads the folder as image-text-to-text. (The engine loads the folder: its probe is the initial weights'.)
        probe_vocab = probe_vocab_size(AutoConfig.from_pretrained(model_path))
        infer = InferenceEngine(model_path, executor="hf").build()
        before = infer.log_probs_of_probe(probe_vocab)[0]
        sync = train.p2p_weight_sync(infer)
        assert train.sync_path == "gloo"
        assert sync["rollout/sync_logprob_max_diff"] <= 1e-3  # the engine scores the probe as the trainer does
        assert (infer.log_probs_of_probe(probe_vocab)[0] - before).abs().max() > 1e-3  # and the trained weights arrived
        (generated,) = infer.generate([[5, 6, 7, 8]], {"temperature": 0.0, "max_tokens": 6})[0]  # text prompts on a VLM
        assert len(generated["token_ids"]) == len(generated["log_probs"]) == 6
    finally:
        train.shutdown()
        if infer is not None:
            infer.shutdown()
