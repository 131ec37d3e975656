"""Routing replay (actor.router_replay.mode R2 / R3) on megatron-core's MoE layers against the Hugging Face model the
weights came from (fp32, CPU over gloo, real Ray workers): a recording pass returns the experts the HF routers choose
at every real position and every layer, whichever pipeline stage routed them and however sequence parallelism split
the tokens; comparing with them counts no difference; replaying a table with one layer's choices moved counts that
layer (and those after it where they choose otherwise) as differing, as the HF model's hooks do, and gives the HF
model's log-probs and gradient norm under the same replayed table, also when the layers run again in the backward
(model.enable_gradient_checkpointing: each recomputed router replays what its forward did, micro-batch by
micro-batch through the pipeline schedule)."""

import pytest
import torch

from tests.megatron.moe_models import qwen3_moe
from tests.megatron.test_megatron_backend import PROMPT, RESPONSE, _batch
from workers.routing_replay.hooks import NOT_RECORDED, RouterChoices
from workers.routing_replay.token_order import TokenOrder

pytest.importorskip("megatron.core", reason="install the [megatron] extra")

LAYERS, EXPERTS = 4, 4  # tests/megatron/moe_models.py
MOVED_LAYER = 1


def _response_log_probs(model, batch: dict, rows: slice) -> torch.Tensor:
    ids, mask = batch["input_ids"][rows], batch["attention_mask"][rows]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -RESPONSE - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, batch["responses"][rows, :, None]).squeeze(-1)


def _order(batch: dict, rows: slice) -> TokenOrder:
    return TokenOrder(batch["attention_mask"][rows].bool(), packed=False, sequence_parallel=None)


def _hf_side(model, batch: dict) -> dict:
    """The HF routers' own choices, then log-probs and a two-micro-batch gradient norm with one layer's moved."""
    choices = RouterChoices(model)
    everything = slice(None)
    with torch.no_grad(), choices.recording():
        _response_log_probs(model, batch, everything)
    (call,) = choices.recorded_calls()
    chosen = _order(batch, everything).to_positions(call)
    moved = chosen.clone()
    layer = moved[:, :, MOVED_LAYER]
    recorded = layer[..., 0] != NOT_RECORDED
    layer[recorded] = (layer[recorded] + 1) % EXPERTS  # a rotated pair of distinct experts is another pair
    with torch.no_grad(), choices.replaying(_order(batch, everything).to_forward(moved)):
        replayed = _response_log_probs(model, batch, everything)
    # The moved layer differs at every token it routes, and the later layers, fed other experts' outputs, at some.
    share = choices.pop_mismatch()
    for rows in (slice(0, 2), slice(2, 4)):
        with choices.replaying(_order(batch, rows).to_forward(moved[rows])):
            mask = batch["response_mask"][rows].float()
            (-(_response_log_probs(model, batch, rows) * mask).sum() / mask.sum() / 2).backward()
    router_grad = model.model.layers[MOVED_LAYER].mlp.gate.weight.grad
    assert router_grad is not None and router_grad.abs().sum() > 0  # a replayed choice still trains the router
    assert choices.pop_mismatch() == share
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    return {"chosen": chosen, "moved": moved, "replayed": replayed, "share": share, "grad_norm": grad_norm}


@pytest.mark.parametrize(
    "tp, pp, ep, dp, norm_topk_prob, recompute, etp",
    # tp2-etp1-ep2: attention over TP 2 (sequence parallel), whole experts over EP 2 on the same ranks (verl's folding).
    [(2, 1, 1, 1, False, False, None), (1, 2, 2, 2, True, True, None), (2, 1, 2, 1, True, False, 1)],
    ids=["tp2-sequence-parallel-unnormalised-topk", "pp2-ep2-recomputed-layers", "tp2-etp1-ep2"],
)
def test_megatron_routers_record_compare_and_replay_as_the_hf_model(megatron_probes, tmp_path, tp, pp, ep, dp,
                                                                    norm_topk_prob, recompute, etp):
    model = qwen3_moe(tmp_path, norm_topk_prob=norm_topk_prob)
    batch = _batch(common_pad=False)  # with routing tracked every column runs; this batch's routings differ widely
    hf = _hf_side(model, batch)
    assert (hf["chosen"] != NOT_RECORDED).any(-1).any(-1).sum() == batch["attention_mask"].sum()  # real tokens only
    with megatron_probes(tp * pp * dp) as group:
        outputs = group.replay_routing(str(tmp_path), tp, pp, ep, batch, hf["chosen"], hf["moved"], recompute, etp)
    (result,) = [o for o in outputs if o is not None]
    # Every stage's layers, every TP rank's shard of the sequence: the HF routers' expert sets, NOT_RECORDED at padding.
    recorded = result["recorded"]
    assert recorded.dtype == torch.int16 and recorded.shape == (4, PROMPT + RESPONSE, LAYERS, 2)
    assert torch.equal(recorded.sort(-1).values, hf["chosen"].sort(-1).values)
    assert result["compared"] == {"router_replay/mismatch_pass": 0.0}
    # As many token-layer routings differ as in the HF model (one layer's all, later layers' some), counted over
    # every stage's layers and every TP rank's tokens.
    assert hf["share"] > 1 / LAYERS
    assert result["replay_share"] == {"router_replay/mismatch_pass": pytest.approx(hf["share"])}
    assert result["update_share"] == {"router_replay/mismatch_update": pytest.approx(hf["share"])}
    valid = batch["response_mask"].bool()
    assert not torch.allclose(result["replay_log_probs"][valid], result["live_log_probs"][valid], atol=1e-3)
    torch.testing.assert_close(result["replay_log_probs"][valid], hf["replayed"][valid], atol=2e-6, rtol=0)
    assert result["grad_norm"] == pytest.approx(hf["grad_norm"], rel=1e-5)
