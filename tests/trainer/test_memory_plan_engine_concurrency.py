"""The plan's note on a vLLM engine's concurrency: how many sequences of max_model_len tokens its KV cache holds at
once, beside how many one step gives each engine; where they do not fit, the setting it names holds them all.
(That vLLM sizes its cache by the same bytes per sequence: tests/rollout/test_vllm_rollout.py.)"""

import json

import pytest

from benchmarks.model_shapes import QWEN2_14B
from trainer.config_loader import load_config
from trainer.memory_plan import build_plan
from trainer.memory_plan.engine_concurrency import engine_concurrency
from trainer.memory_plan.engine_profile import SAMPLER_BYTES_PER_LOGIT, SAMPLER_FIXED_BYTES
from trainer.memory_plan.setup import plan_setup
from trainer.preflight import check_memory

GIB = 1 << 30
H100 = 79.1  # GiB an 80 GB H100 reports


@pytest.fixture(scope="module")
def model_14b(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2_14b")
    (folder / "config.json").write_text(json.dumps({**QWEN2_14B, "model_type": "qwen2"}))
    return str(folder)


def grpo_14b(model: str, *extra: str):
    """The `14b-4gpu` comparison's batch (32 prompts x 8 responses, 512 + 1024 tokens, FSDP over four GPUs,
    16K-token micro-batches, checkpointing), the optimizer's state offloaded as on 80 GB GPUs."""
    return load_config([
        f"actor_rollout_ref.model.path={model}", "trainer.n_gpus_per_node=4", "data.train_batch_size=32",
        "actor_rollout_ref.rollout.n=8", "data.max_prompt_length=512", "data.max_response_length=1024",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true", "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768", *extra,
    ])


def concurrency(cfg, gib: float | None = H100):
    return engine_concurrency(plan_setup(cfg, on_gpu=True), int(gib * GIB) if gib else None)


def note(cfg, gib: float = H100) -> str:
    (found,) = [n for n in build_plan(cfg, int(gib * GIB)).notes if n.startswith("the vLLM engine's KV cache")]
    return found


def test_a_sequence_takes_every_layers_keys_and_values_and_the_cache_what_the_budget_leaves(model_14b):
    found = concurrency(grpo_14b(model_14b, "actor_rollout_ref.rollout.gpu_memory_utilization=0.45"))
    # 48 layers x (keys, values) x 8 KV heads x 128 x bf16, for 1536 tokens (96 whole blocks of 16)
    assert found.sequence_bytes == 48 * 2 * 8 * 128 * 2 * 1536
    weights = 2 * 14_770_033_664  # the 14B shape's parameters in bf16
    # vLLM's start-up profile on an 80 GB GPU: its sampler over 1024 requests x the 152 064-entry vocabulary
    # (larger than the forward over 16 384 tokens), and the CUDA graphs' 0.5 GiB
    profile = 1024 * 152_064 * SAMPLER_BYTES_PER_LOGIT + SAMPLER_FIXED_BYTES + GIB // 2
    assert found.kv_bytes == pytest.approx(0.45 * H100 * GIB - weights - profile, abs=1)
    assert found.at_once == 17 and found.per_step == 64 and found.waves == 4


def test_an_engine_short_of_cache_is_told_the_utilization_that_holds_the_step(model_14b):
    text = note(grpo_14b(model_14b, "actor_rollout_ref.rollout.gpu_memory_utilization=0.45"))
    assert "17 sequences of 1536 tokens at once; a step gives each engine 64: it generates them in about 4 waves" in text
    suggested = text.split("actor_rollout_ref.rollout.gpu_memory_utilization=")[1].split(" ")[0]
    assert suggested == "0.65"
    fixed = grpo_14b(model_14b, f"actor_rollout_ref.rollout.gpu_memory_utilization={suggested}")
    assert note(fixed).endswith("a step gives each engine 64 (all at once)")
    smaller = grpo_14b(model_14b, "actor_rollout_ref.rollout.gpu_memory_utilization=0.6")
    assert concurrency(smaller).waves > 1  # the suggestion is the least step of 0.05 that holds them


def test_a_default_max_num_seqs_is_named_as_cache_its_start_up_profile_takes(model_14b):
    """vLLM's start-up profile samples for max_num_seqs requests (1024 by default on an 80 GB GPU); the note says
    how much more cache the step's own count would leave, and that count does give the cache those bytes."""
    short = "actor_rollout_ref.rollout.gpu_memory_utilization=0.6"
    text = note(grpo_14b(model_14b, short))
    assert text.endswith("also actor_rollout_ref.rollout.max_num_seqs=64 (vLLM's default 1024) gives its KV cache 0.8 "
                         "GiB more: vLLM's start-up profile then samples for that many requests")
    default, capped = (concurrency(grpo_14b(model_14b, short, *extra))
                       for extra in ((), ("actor_rollout_ref.rollout.max_num_seqs=64",)))
    # the sampler over 1024 requests x the vocabulary gives way to the forward over 16 384 tokens: a 14B's three MLP
    # widths (13 824) and four hidden widths (5 120) in bf16 per token
    forward = 16384 * (3 * 13_824 + 4 * 5_120) * 2
    assert capped.kv_bytes - default.kv_bytes == 1024 * 152_064 * SAMPLER_BYTES_PER_LOGIT + SAMPLER_FIXED_BYTES - forward
    assert "max_num_seqs" not in note(grpo_14b(model_14b, short, "actor_rollout_ref.rollout.max_num_seqs=64"))


def test_a_budget_that_leaves_no_sequence_is_a_problem_and_its_note_says_vllm_will_not_start(model_14b):
    cfg = grpo_14b(model_14b, "actor_rollout_ref.rollout.gpu_memory_utilization=0.39")
    (problem,) = build_plan(cfg, int(H100 * GIB)).problems
    assert problem == (
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.39 gives the vLLM engine 30.8 GiB per GPU, less than its "
        "weights (27.5 GiB) plus its start-up profile's peak and CUDA graphs (3.2 GiB) plus one sequence of "
        "max_model_len=1536 in its KV cache; vLLM refuses to start: raise it to at least 0.40"
    )
    assert "0 sequences of 1536 tokens at once; a step gives each engine 64: vLLM refuses to start" in note(cfg)
    assert build_plan(grpo_14b(model_14b, "actor_rollout_ref.rollout.gpu_memory_utilization=0.40"), int(H100 * GIB)).problems == []


def test_a_tensor_parallel_engine_serves_its_ranks_rows_with_half_the_weights_and_cache_per_gpu(model_14b):
    one, two = (
        concurrency(grpo_14b(model_14b, "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
                             f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}"))
        for tp in (1, 2)
    )
    assert two.per_step == 2 * one.per_step == 128
    assert two.sequence_bytes == one.sequence_bytes // 2
    assert two.at_once > 2 * one.at_once and two.waves == 1


def test_separate_engines_split_the_step_and_a_fixed_cache_is_told_its_size(model_14b):
    separate = ("actor_rollout_ref.rollout.placement=separate", "actor_rollout_ref.rollout.num_engines=2")
    found = concurrency(grpo_14b(model_14b, *separate, "actor_rollout_ref.rollout.kv_cache_gib=4"))
    assert found.per_step == 128 and found.kv_bytes == 4 * GIB and found.at_once == 4 * GIB // found.sequence_bytes
    text = note(grpo_14b(model_14b, *separate, "actor_rollout_ref.rollout.kv_cache_gib=4"))
    size = text.split("actor_rollout_ref.rollout.kv_cache_gib=")[1].split(" ")[0]
    assert float(size) >= 128 * found.sequence_bytes / GIB
    enough = grpo_14b(model_14b, *separate, f"actor_rollout_ref.rollout.kv_cache_gib={size}")
    assert concurrency(enough).waves == 1


def test_max_num_seqs_below_a_steps_sequences_splits_them_even_where_the_cache_holds_them(model_14b):
    roomy = ("actor_rollout_ref.rollout.gpu_memory_utilization=0.65",)
    capped = grpo_14b(model_14b, *roomy, "actor_rollout_ref.rollout.max_num_seqs=16")
    found = concurrency(capped)
    assert found.at_once >= 64 and found.running == 16 and found.waves == 4
    assert note(capped).endswith("actor_rollout_ref.rollout.max_num_seqs=16 runs at most that many at once: it generates "
                                 "them in about 4 waves of full-length responses; raise it to 64 or leave it null (vLLM's default)")
    assert concurrency(grpo_14b(model_14b, *roomy, "actor_rollout_ref.rollout.max_num_seqs=64")).waves == 1


def test_no_estimate_without_a_vllm_engine_on_gpus_of_known_size(model_14b):
    assert concurrency(grpo_14b(model_14b), gib=None) is None
    assert concurrency(grpo_14b(model_14b, "actor_rollout_ref.rollout.name=hf")) is None
    assert engine_concurrency(plan_setup(grpo_14b(model_14b), on_gpu=False), int(H100 * GIB)) is None


def test_a_gpu_run_whose_engines_generate_in_waves_starts_with_a_warning_saying_what_holds_them(model_14b, capsys):
    on_h100 = ("trainer.device=cuda", f"trainer.gpu_memory_gib={H100}")
    check_memory(grpo_14b(model_14b, *on_h100, "actor_rollout_ref.rollout.gpu_memory_utilization=0.45"))
    captured = capsys.readouterr()
    assert captured.out.startswith("memory plan: fits: ")
    (warning,) = [line for line in captured.err.splitlines() if line.startswith("warning: ")]
    assert warning.startswith("warning: memory plan: the vLLM engine's KV cache: about 4.8 GiB per GPU, 17 sequences")
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.65" in warning
    check_memory(grpo_14b(model_14b, *on_h100, "actor_rollout_ref.rollout.gpu_memory_utilization=0.65"))
    assert capsys.readouterr().err == ""
