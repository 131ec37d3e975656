"""The memory plan under Ulysses sequence parallelism: k GPUs share each micro-batch's tokens, so each GPU's
activations and logits are those of a k-th of them, while the sharded model state and the HF generation
(which splits prompts over every GPU) stay as they are."""

from __future__ import annotations

import json

import pytest

from trainer.config_loader import load_config
from trainer.memory_plan import build_plan, misfit_message, render_plan
from trainer.memory_plan.setup import Batching

GIB = 1 << 30
QWEN_1_5B = dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, intermediate_size=8960, tie_word_embeddings=True)
SP = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("plan_1_5b")
    (path / "config.json").write_text(json.dumps(QWEN_1_5B))
    return str(path)


def long_sequences(model: str, *extra: str, prompts: int = 4, micro_rows: int = 2):
    """Two GPUs, `prompts` x 1 response of 1024 + 15360 = 16K tokens, micro-batches of `micro_rows` sequences
    (per data-parallel rank, or per group of GPUs sharing them)."""
    return load_config([
        f"actor_rollout_ref.model.path={model}", "trainer.n_gpus_per_node=2", "data.max_prompt_length=1024",
        "data.max_response_length=15360", f"data.train_batch_size={prompts}", "actor_rollout_ref.rollout.n=1",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_rows}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro_rows}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro_rows}",
        "actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.actor.old_log_prob_pass=always", *extra,
    ])


def test_batching_splits_a_micro_batch_over_the_group():
    fixed = Batching.of(4, 2, False, 0, 100, 50, sequence_parallel=2)
    assert (fixed.rows, fixed.tokens, fixed.response_tokens) == (2, 150, 100)  # 300 tokens over 2 GPUs
    assert Batching.of(4, 2, False, 0, 100, 50) == Batching(2, 300, 100)
    odd = Batching.of(1, 1, False, 0, 100, 51, sequence_parallel=2)
    assert odd.tokens == 76  # 151 tokens padded to 152
    # A token budget is per GPU: the group's micro-batch holds k x the budget.
    dynamic = Batching.of(8, 1, True, 400, 100, 50, sequence_parallel=2)
    assert (dynamic.tokens, dynamic.response_tokens) == (400, 400)
    assert Batching.of(8, 1, True, 400, 100, 50).tokens == 400


def test_activations_and_logits_per_gpu_drop_with_k(model_dir):
    one = build_plan(long_sequences(model_dir), 80 * GIB)
    two = build_plan(long_sequences(model_dir, f"{SP}=2"), 80 * GIB)
    for phase in ("old_log_prob", "ref_log_prob", "update_actor"):
        base, split = one.row(phase).parts, two.row(phase).parts
        if phase == "update_actor":
            assert split["activations"] == pytest.approx(base["activations"] / 2, rel=1e-3), phase
            assert split["logits"] < base["logits"], phase  # the chunk's logits stay; the per-token part halves
        else:  # no grad: the larger of the layers' transient and the head's logits is the pass's peak
            assert 0 in (split["activations"], split["logits"]) and 0 in (base["activations"], base["logits"])
            assert split["activations"] + split["logits"] < base["activations"] + base["logits"], phase
        for column in ("weights", "grads", "optimizer"):  # sharded over both GPUs either way
            assert split[column] == base[column], (phase, column)
    assert two.row("generate").total == one.row("generate").total  # generation does not use it
    # Micro-batches of two 16K sequences: 32K tokens on one 80 GiB GPU do not fit, 16K on each of two do.
    assert one.row("update_actor").total > 80 * GIB > two.row("update_actor").total
    assert one.fits() is False and two.fits() is True
    full_logits = "actor_rollout_ref.model.logits_chunk_tokens=0"
    whole = build_plan(long_sequences(model_dir, full_logits), None).row("update_actor").parts["logits"]
    halved = build_plan(long_sequences(model_dir, full_logits, f"{SP}=2"), None).row("update_actor").parts["logits"]
    # A GPU's half of the packed row (16384 tokens) may be all response tokens, of the 2 x 15360 at k=1.
    assert halved == pytest.approx(whole * 16384 / 30720, rel=1e-3)
    text = render_plan(two)
    assert "note: Ulysses sequence parallelism (actor 2 GPUs per sequence)" in text
    assert "micro-batches of 16384 tokens per GPU (update)" in text


def test_rows_per_group_follow_the_data_parallel_groups(model_dir):
    """2 sequences on 2 GPUs, micro-batches of 2 rows: k=1 holds one sequence per GPU (its data-parallel share),
    k=2 one group of both sequences split over both GPUs: the same tokens per GPU."""
    one = build_plan(long_sequences(model_dir, prompts=2), None)
    two = build_plan(long_sequences(model_dir, f"{SP}=2", prompts=2), None)
    one_update = one.row("update_actor").parts["activations"]
    assert two.row("update_actor").parts["activations"] == pytest.approx(one_update, rel=1e-3)


def test_a_misfit_suggests_ulysses(model_dir):
    message = misfit_message(build_plan(long_sequences(model_dir), 80 * GIB))
    assert "does not fit" not in message and "try " in message
    assert "ulysses_sequence_parallel_size" in message
