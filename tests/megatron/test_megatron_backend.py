"""`MegatronBackend` against the HF model it was loaded from (fp32, megatron-core on CPU over gloo, real
Ray workers): response log-probs and entropies, a training step's gradient norm and the weights after one
Adam step (streamed back out through the TP gather and PP broadcast) agree across TP / PP / SP / DP splits."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tests.megatron.workers import ADAM_EPS
from trainer.memory_plan.residency import role_memory
from trainer.memory_plan.setup import ModelRole
from trainer.memory_plan.shape import ModelShape, read_model_config
from trainer.memory_plan.terms import Trainability

pytest.importorskip("megatron.core", reason="install the [megatron] extra")

LR = 1e-2
PROMPT, RESPONSE = 6, 5


def _model(folder, tied: bool) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=tied, dtype="float32",
        pad_token_id=0,  # HF gives the pad row no gradient from lookups; the engine must do the same
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(folder)
    return model


def _batch(common_pad: bool = True) -> dict:
    torch.manual_seed(1)
    ids = torch.randint(0, 100, (4, PROMPT + RESPONSE))
    mask = torch.ones_like(ids)
    if common_pad:  # a column every row pads: not run (MegatronBackend)
        mask[:, :1] = 0
    mask[0, :3] = 0  # left-padded prompts
    mask[3, :2] = 0
    mask[2, -2:] = 0  # a response that ended early
    ids[1, 2] = ids[3, 7] = 0  # the pad token at real positions
    return {"input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT:], "response_mask": mask[:, PROMPT:]}


def _hf_reference(model: Qwen2ForCausalLM, batch: dict, extra_loss=None) -> dict:
    """The HF model's log-probs, entropies, gradient norm and weights after one Adam step over two micro-batches;
    `extra_loss(attention_mask of the rows)`, if given, is added to each micro-batch's loss after its forward."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)

    def response_log_probs(rows):
        logits = model(input_ids=ids[rows], attention_mask=mask[rows], position_ids=positions[rows]).logits[:, -RESPONSE - 1 : -1]
        log_softmax = torch.log_softmax(logits, -1)
        entropy = -(log_softmax.exp() * log_softmax).sum(-1)
        return log_softmax.gather(-1, batch["responses"][rows, :, None]).squeeze(-1), entropy

    with torch.no_grad():
        log_probs, entropy = response_log_probs(slice(None))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, eps=ADAM_EPS, weight_decay=0.0)
    for rows in (slice(0, 2), slice(2, 4)):
        lp, _ = response_log_probs(rows)
        rmask = batch["response_mask"][rows].float()
        loss = -(lp * rmask).sum() / rmask.sum()
        if extra_loss is not None:
            loss = loss + extra_loss(mask[rows])
        (loss / 2).backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    optimizer.step()
    return {"log_probs": log_probs, "entropy": entropy, "grad_norm": grad_norm, "weights": model.state_dict()}


@pytest.mark.parametrize(
    "tp, pp, sp, dp, tied",
    [(2, 1, True, 1, True), (1, 2, False, 1, False), (2, 2, True, 1, True), (1, 1, False, 2, False)],
    ids=["tp2-sp-tied", "pp2", "tp2-pp2-sp", "dp2-distributed-optimizer"],
)
def test_engine_matches_the_hf_model(megatron_probes, tmp_path, tp, pp, sp, dp, tied):
    hf = _hf_reference(_model(tmp_path, tied), _batch())
    with megatron_probes(tp * pp * dp) as group:
        outputs = group.run(str(tmp_path), tp, pp, sp, dp > 1, _batch(), LR)
    (result,) = [o for o in outputs if o is not None]
    # The memory plan's per-GPU weights are this rank's (the last stage's) parameters exactly.
    role = ModelRole("actor", ModelShape.from_config(read_model_config(str(tmp_path))), "lm", 4, "megatron", Trainability(full=True),
                     tp=tp, pp=pp)
    assert role_memory(role, tp * pp * dp).weights // 4 == result["local_params"]
    valid = _batch()["response_mask"].bool()
    torch.testing.assert_close(result["log_probs"][valid], hf["log_probs"][valid], atol=2e-6, rtol=0)
    torch.testing.assert_close(result["entropy"][valid], hf["entropy"][valid], atol=2e-6, rtol=0)
    assert result["grad_norm"] == pytest.approx(hf["grad_norm"], rel=1e-5)
    expected = {k: v for k, v in hf["weights"].items() if not (tied and k == "lm_head.weight")}
    assert result["weights"].keys() == expected.keys()
    for name, tensor in expected.items():
        # Adam's first step moves every weight by ~lr; the two implementations agree far closer than that.
        torch.testing.assert_close(result["weights"][name], tensor, atol=2e-4, rtol=0, msg=name)


def test_the_columns_every_row_pads_on_the_left_are_counted_over_all_micro_batches():
    from protocol import DataProto
    from workers.megatron.rows_forward import common_left_padding

    def micro(mask_rows):
        mask = torch.tensor(mask_rows)
        return DataProto.from_dict({"input_ids": torch.zeros_like(mask), "attention_mask": mask})

    first = micro([[0, 0, 1, 1], [0, 0, 0, 1]])
    second = micro([[0, 1, 1, 0], [0, 0, 1, 1]])
    assert common_left_padding([first]) == 2
    assert common_left_padding([first, second]) == 1  # one width for every micro-batch of the call
    assert common_left_padding([micro([[1, 1, 0, 0]])]) == 0
    assert common_left_padding(list(DataProto.from_dict(_batch()).split(2))) == 1  # the batch the engine tests run


def test_token_budget_micro_batches_fill_the_budget_with_padded_rows_across_pipeline_stages(megatron_probes, tmp_path):
    """use_dynamic_bsz with megatron: as many rows as fit the budget at the pass's run width (the batch's 11
    positions less its one common pad column), split evenly; uneven micro-batches cross the pipeline (each shape
    sent first) and give the log-probs of one whole micro-batch."""
    _model(tmp_path, tied=False)
    four = _batch()
    batch = {k: torch.cat([v, v[:1]]) for k, v in four.items()}  # 5 rows
    with megatron_probes(2) as group:
        (result,) = [o for o in group.token_budget_passes(str(tmp_path), 2, batch, 25) if o is not None]
    assert result["rows"] == [2, 2, 1]  # 25 // 10 = 2 rows a micro-batch
    valid = batch["response_mask"].bool()
    torch.testing.assert_close(result["budgeted"][valid], result["whole"][valid], atol=1e-6, rtol=0)
    assert result["grad_norm"] > 0
