"""Routing replay (actor.router_replay.mode R2 / R3) on a Hugging Face mixture of experts: the routers' hooks record,
replay and compare expert choices; a replayed choice changes the output yet trains the router; the batch's
per-position table maps to a padded or packed forward's token order and back; the tables built from HF generate's
calls and from vLLM's per-request arrays line up with `input_ids`; the settings are checked before anything starts."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import CheckpointError
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3MoeForCausalLM

from protocol import DataProto
from trainer.tiny_model import build_char_tokenizer
from trainer.tiny_moe import ACTIVE_EXPERTS, EXPERTS, build_tiny_moe_config
from workers.config import actor_rollout_ref_config
from workers.packing.layout import PackedRows
from workers.packing.ulysses import SequenceParallel
from workers.routing_replay.hooks import NOT_RECORDED, RouterChoices
from workers.routing_replay.rollout_tables import engine_table, generation_table
from workers.routing_replay.token_order import ROUTED_EXPERTS, TokenOrder, without_routing_table

LAYERS = 2  # the tiny model's depth


def tiny_moe(norm_topk_prob: bool = True) -> Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    config = build_tiny_moe_config(build_char_tokenizer())
    config.norm_topk_prob = norm_topk_prob
    return Qwen3MoeForCausalLM(config).eval()


def padded_batch() -> dict[str, torch.Tensor]:
    """Three rows of 12 positions: a left-padded prompt, a full row, a right-padded response."""
    torch.manual_seed(1)
    ids = torch.randint(3, 90, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[2, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)}


def logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).logits


@pytest.mark.parametrize("norm_topk_prob", [True, False], ids=["renormalised", "raw-softmax"])
def test_replaying_the_recorded_choice_reproduces_the_forward(norm_topk_prob):
    model, batch = tiny_moe(norm_topk_prob), padded_batch()
    choices = RouterChoices(model)
    assert choices.layers == list(range(LAYERS))
    order = TokenOrder(batch["attention_mask"].bool(), packed=False, sequence_parallel=None)
    with torch.no_grad():
        live = logits(model, batch)
        with choices.recording():
            logits(model, batch)
        (call,) = choices.recorded_calls()
        assert call.shape == (3 * 12, LAYERS, ACTIVE_EXPERTS)
        table = order.to_positions(call)
        assert table.dtype == torch.int16 and table.shape == (3, 12, LAYERS, ACTIVE_EXPERTS)
        assert bool((table[~batch["attention_mask"].bool()] == NOT_RECORDED).all())
        with choices.replaying(order.to_forward(table)):
            replayed = logits(model, batch)
    # The weights are recomputed by the router's own rule (renormalised or not): bit for bit the live forward.
    assert torch.equal(replayed, live)
    assert choices.pop_mismatch() == 0.0


def test_a_replayed_choice_changes_the_output_and_the_router_still_learns():
    model, batch = tiny_moe(), padded_batch()
    choices = RouterChoices(model)
    order = TokenOrder(batch["attention_mask"].bool(), packed=False, sequence_parallel=None)
    with torch.no_grad(), choices.recording():
        live = logits(model, batch)
    table = order.to_positions(choices.recorded_calls()[0])
    other = table.clone()
    recorded = other != NOT_RECORDED
    other[recorded] = (other[recorded] + 1) % EXPERTS  # every token to a different expert set
    model.train()
    with choices.replaying(order.to_forward(other)):
        replayed = logits(model, batch)
        replayed.square().mean().backward()
    real = batch["attention_mask"].bool()
    assert (replayed.detach() - live)[real].abs().max() > 1e-3
    assert choices.pop_mismatch() == 1.0
    assert choices.pop_mismatch() is None  # read once: nothing compared since
    # Only the choice is replayed: the routers' weights get a gradient through the recomputed expert weights.
    assert all(layer.mlp.gate.weight.grad.abs().sum() > 0 for layer in model.model.layers)


def test_comparing_counts_without_changing_the_forward():
    model, batch = tiny_moe(), padded_batch()
    choices = RouterChoices(model)
    order = TokenOrder(batch["attention_mask"].bool(), packed=False, sequence_parallel=None)
    with torch.no_grad():
        with choices.recording():
            live = logits(model, batch)
        table = order.to_positions(choices.recorded_calls()[0])
        table[0, 5:7] = (table[0, 5:7] + 1) % EXPERTS  # 2 of the 31 real tokens, in both layers
        with choices.comparing(order.to_forward(table)):
            compared = logits(model, batch)
    assert torch.equal(compared, live)
    assert choices.pop_mismatch() == pytest.approx(4 / (31 * LAYERS))


def test_a_table_of_other_tokens_is_refused():
    model, batch = tiny_moe(), padded_batch()
    choices = RouterChoices(model)
    with pytest.raises(RuntimeError, match=r"router of layer 0 chose \(36, 2\) .* recorded routing .* \(35, 2, 2\)"):
        with torch.no_grad(), choices.replaying(torch.zeros(35, LAYERS, ACTIVE_EXPERTS, dtype=torch.long)):
            logits(model, batch)


def test_a_dense_model_is_named():
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(ValueError, match=r"Qwen2ForCausalLM declares no mixture-of-experts router.*mode=disabled"):
        RouterChoices(Qwen2ForCausalLM(config))


def test_the_packed_order_holds_the_real_tokens_row_by_row():
    batch = padded_batch()
    table = torch.arange(3 * 12).view(3, 12, 1, 1).expand(3, 12, LAYERS, ACTIVE_EXPERTS).to(torch.int16)
    order = TokenOrder(batch["attention_mask"].bool(), packed=True, sequence_parallel=None)
    forward = order.to_forward(table)
    rows = PackedRows.from_padded(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    # The packed row's tokens are these positions, in this order.
    assert torch.equal(batch["input_ids"].flatten()[forward[:, 0, 0]], rows.input_ids[0])
    back = order.to_positions(forward)
    real = batch["attention_mask"].bool()
    assert torch.equal(back[real], table[real]) and bool((back[~real] == NOT_RECORDED).all())


def test_each_sequence_parallel_rank_replays_its_shard_of_the_packed_row():
    batch = padded_batch()
    table = torch.arange(3 * 12).view(3, 12, 1, 1).expand(3, 12, LAYERS, ACTIVE_EXPERTS).to(torch.int16)
    whole = TokenOrder(batch["attention_mask"].bool(), packed=True, sequence_parallel=None).to_forward(table)
    shards = [
        TokenOrder(batch["attention_mask"].bool(), True, SequenceParallel(group=None, size=2, rank=rank)).to_forward(
            table
        )
        for rank in range(2)
    ]
    # 31 real tokens over two ranks: 16 each, the last shard ending with one padding token the live router routes.
    assert [len(shard) for shard in shards] == [16, 16]
    assert torch.equal(torch.cat(shards)[:31], whole)
    assert bool((shards[1][-1] == NOT_RECORDED).all())


def test_hf_generate_calls_line_up_with_the_padded_positions():
    # Prefill of 2 rows x 3 prompt positions, then two decode steps: positions 0..4 were run; 5 (the last sampled
    # token) was not.
    prefill = torch.tensor([[1, 2], [3, 4], [5, 6], [1, 3], [2, 4], [3, 5]]).view(6, 1, 2).expand(6, LAYERS, 2)
    steps = [torch.tensor([[7, 0], [6, 1]]).view(2, 1, 2).expand(2, LAYERS, 2) for _ in range(2)]
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    table = generation_table([prefill, *steps], mask)
    assert table.shape == (2, 6, LAYERS, 2) and table.dtype == torch.int16
    assert table[0, :, 0].tolist() == [[-1, -1], [3, 4], [5, 6], [7, 0], [7, 0], [-1, -1]]
    assert table[1, :, 0].tolist() == [[1, 3], [2, 4], [3, 5], [6, 1], [6, 1], [-1, -1]]


def test_vllm_arrays_line_up_with_the_left_padded_prompts():
    # Row 0: a 2-token prompt (left-padded to 3) and a 3-token response: vLLM ran 2 + 3 - 1 tokens. Row 1: 3 + 1.
    routed = [torch.arange(4 * LAYERS * 2).view(4, LAYERS, 2).numpy(), torch.full((3, LAYERS, 2), 5).numpy()]
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    table = engine_table(routed, prompt_mask, response_length=3)
    assert table.shape == (2, 6, LAYERS, 2)
    assert table[0, :, 0, 0].tolist() == [-1, 0, 4, 8, 12, -1]
    assert table[1, :, 0, 0].tolist() == [5, 5, 5, -1, -1, -1]
    with pytest.raises(RuntimeError, match=r"no expert choices for 1 of 2 responses \(rows \[1\]\).*"
                                            "enable_return_routed_experts"):
        engine_table([routed[0], None], prompt_mask, response_length=3)


def test_an_asynchronous_groups_turns_carry_their_experts_into_the_table():
    # rollout.async_training: vLLM hands a streamed request's experts over with its finished output only, covering
    # every token it ran from the context's first (a turn resumed after a weight update ran its earlier tokens as
    # prompt, so its last request covers the whole turn). Row 0: prompt of 2 (left-padded to 3), 3 tokens sampled;
    # row 1: prompt of 3, 1 token sampled (EOS).
    from protocol import DataProto
    from workers.rollout.sampling import SamplingParams
    from workers.rollout.stream.episodes import GroupFactory

    factory = GroupFactory(SamplingParams(True, 1.0, 1.0, 0, 3, (2,), 0), None)
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    mask = (ids != 0).long()
    rows = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})
    group = factory.group("uid", rows, [0, 1])
    ran = ([11, 12, 13], [2])
    for episode, tokens, experts in zip(group.episodes, ran, (torch.arange(4), torch.full((3,), 5))):
        episode.job.extend(tokens, [-0.5] * len(tokens), version=0)
        episode.job.routed_experts = experts.view(-1, 1, 1).expand(-1, LAYERS, 2).numpy()
        episode.after_turn(episode.job)
    out = factory.batch(group)
    table = out.batch[ROUTED_EXPERTS]
    assert table.shape == (2, 6, LAYERS, 2) and table.dtype == torch.int16
    assert table[0, :, 1, 0].tolist() == [-1, 0, 1, 2, 3, -1]  # the last sampled token was never run
    assert table[1, :, 1, 0].tolist() == [5, 5, 5, -1, -1, -1]
    assert torch.equal(out.batch["input_ids"][0, 3:], torch.tensor(ran[0]))


def _config(**sections) -> dict:
    return actor_rollout_ref_config({"model": {"path": "m"}, **sections})


def test_the_settings_are_checked_before_anything_starts():
    assert _config()["actor"]["router_replay"]["mode"] == "disabled"
    assert _config(actor={"router_replay": {"mode": "R2"}})["rollout"]["enable_rollout_routing_replay"] is False
    replays = {"actor": {"router_replay": {"mode": "R3"}}}
    with pytest.raises(ValueError, match=r"mode=R3 replays the experts the rollout chose: set "
                                         r"rollout.enable_rollout_routing_replay=true"):
        _config(**replays)
    _config(**replays, rollout={"enable_rollout_routing_replay": True})
    with pytest.raises(ValueError, match=r"mode=R2 replays the experts the trainer's own log-prob pass chose"):
        _config(actor={"router_replay": {"mode": "R2"}}, rollout={"enable_rollout_routing_replay": True})
    with pytest.raises(ValueError, match=r"router_replay.mode' must be one of \['disabled', 'R2', 'R3'\].*got 'r3'"):
        _config(actor={"router_replay": {"mode": "r3"}})
    # The multi-turn agent loop's turns record their experts too.
    multi_turn = _config(rollout={"enable_rollout_routing_replay": True, "multi_turn": {"enable": True}})
    assert multi_turn["rollout"]["multi_turn"]["enable"] is True
    # Megatron's routers replay too (workers/megatron/router_replay.py).
    assert _config(actor={"strategy": "megatron", "router_replay": {"mode": "R2"}})["actor"]["router_replay"]["mode"] == "R2"


def test_vllm_is_asked_for_its_choices_on_a_gpu_and_refused_on_cpu():
    from workers.rollout.vllm_options import routing_options

    assert routing_options({"enable_rollout_routing_replay": False}, torch.device("cpu")) == {}
    records = {"enable_rollout_routing_replay": True}
    assert routing_options(records, torch.device("cuda")) == {"enable_return_routed_experts": True}
    with pytest.raises(ValueError, match=r"needs a GPU: vLLM's CPU backend does not return .* rollout.name='hf'"):
        routing_options(records, torch.device("cpu"))


def _replayed_gradients(checkpointing: bool, backward_inside: bool) -> list[torch.Tensor]:
    model, batch = tiny_moe(), padded_batch()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    choices = RouterChoices(model)
    order = TokenOrder(batch["attention_mask"].bool(), packed=False, sequence_parallel=None)
    with torch.no_grad(), choices.recording():
        logits(model, batch)
    table = order.to_positions(choices.recorded_calls()[0])
    recorded = table != NOT_RECORDED
    table[recorded] = (table[recorded] + 3) % EXPERTS
    with choices.replaying(order.to_forward(table)):
        loss = logits(model, batch).square().mean()
        if backward_inside:
            loss.backward()
    if not backward_inside:
        loss.backward()
    return [parameter.grad for parameter in model.parameters()]


def test_checkpointed_layers_replay_in_the_backward_too():
    # A checkpointed layer routes again when the backward recomputes it: with the replay held through the backward
    # (as FSDPBackend.forward_backward holds it) the gradients are those of the plain forward, also when this is the
    # first replayed forward (the hook's one-time check of the router's weighting saves nothing the recompute would
    # not). A recompute routed live sends the tokens to other experts: torch refuses it.
    plain = _replayed_gradients(checkpointing=False, backward_inside=True)
    held = _replayed_gradients(checkpointing=True, backward_inside=True)
    for a, b in zip(plain, held):
        torch.testing.assert_close(a, b)
    with pytest.raises(CheckpointError, match="different number of tensors was saved"):
        _replayed_gradients(checkpointing=True, backward_inside=False)


def test_roles_that_route_live_are_sent_the_batch_without_its_table():
    table = torch.zeros(3, 12, LAYERS, ACTIVE_EXPERTS, dtype=torch.int16)
    batch = DataProto.from_dict({**padded_batch(), ROUTED_EXPERTS: table})
    sent = without_routing_table(batch)
    assert ROUTED_EXPERTS not in sent.batch.keys()
    assert ROUTED_EXPERTS in batch.batch.keys()  # the actor's later calls still have it
    assert sent.batch["input_ids"].data_ptr() == batch.batch["input_ids"].data_ptr()  # shared, not copied
    assert sorted(sent.batch.keys()) == ["attention_mask", "input_ids", "position_ids"]
    plain = DataProto.from_dict(padded_batch())
    assert without_routing_table(plain) is plain
