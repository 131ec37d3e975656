"""The multi-turn tool-calling rollout: parsing, masks, limits, scheduling, and the real HF engine."""

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from protocol import DataProto
from trainer.algorithms import compute_grpo_outcome_advantage
from trainer.rewards.env_reward import EnvRewardManager
from trainer.tiny_model import build_char_tokenizer
from workers.agent_tasks.vault import CODE_CHARS, VaultEnvironment
from workers.config import multi_turn_config
from workers.rl_math.masked import last_valid_positions
from workers.rollout.agent import ParsedTurn, ToolCall, make_parser
from workers.rollout.agent.batch import conversation_batch
from workers.rollout.agent.loop import AgentLoop, TurnOutput
from workers.rollout.agent.rollout import AgentRollout
from workers.rollout.agent.scripted import ScriptedStream, ScriptedTurns
from workers.rollout.sampling import SamplingParams
from workers.training.actor_loss import actor_loss_from_log_probs

TOOLS_FILE = Path(__file__).with_name("agent_tools.py")
TOKENIZER = build_char_tokenizer()
EOS = TOKENIZER.eos_token_id
PAD = TOKENIZER.pad_token_id
PARAMS = SamplingParams(True, 1.0, 1.0, 0, 256, (EOS,), PAD)


def tools(*names):
    return [f"{TOOLS_FILE}:{name}" for name in names]


def make_agent(response_length=256, **multi_turn):
    config = multi_turn_config({"enable": True, "tools": tools("lookup"), **multi_turn})
    return AgentRollout(config, TOKENIZER, response_length, (EOS,))


def prompt_batch(rows):
    texts = [TOKENIZER.apply_chat_template([{"role": "user", "content": f"q{i}"}], tokenize=False, add_generation_prompt=True) for i in range(rows)]
    enc = TOKENIZER(texts, return_tensors="pt", padding=True)
    return {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask, "position_ids": (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)}


def call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def run_script(agent, script, rows=2, lockstep=False):
    generator = ScriptedTurns(TOKENIZER, EOS, script)
    generator.lockstep = lockstep
    out = agent.run(prompt_batch(rows), [{}] * rows, generator, PARAMS, call_seed=3, rank=0)
    return out, generator


def tool_texts(out, row):
    """The contents of the tool messages of one row, from its response tokens."""
    text = TOKENIZER.decode(out["responses"][row].tolist())
    return re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", text, re.DOTALL)


# ---- parsing ---------------------------------------------------------------------------------------------
def test_hermes_parser_reads_calls_and_reports_bad_ones():
    parser = make_parser("hermes")
    turn = parser.parse(f"let me look. {call('lookup', key='sky')} and {call('add', a=1, b=2)}", [])
    assert turn.calls == [ToolCall("lookup", {"key": "sky"}), ToolCall("add", {"a": 1, "b": 2})] and not turn.errors
    stringified = parser.parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', [])
    assert stringified.calls == [ToolCall("f", {"x": 1})]
    bad = parser.parse('<tool_call>{"name": "f", "arguments": {</tool_call><tool_call>[1]</tool_call><tool_call>{"name": "g"', [])
    assert bad.calls == [] and len(bad.errors) == 3
    assert "not valid JSON" in bad.errors[0] and "JSON object" in bad.errors[1]
    assert parser.parse("the answer is 4", []) == ParsedTurn()


def test_tiny_parser_calls_the_first_tool():
    parser = make_parser("tiny")
    assert parser.parse("ab!xy ", ["vault", "other"]).calls == [ToolCall("vault", {"arg": "xy"})]
    assert not parser.parse("abc", ["vault"]).wants_tools
    with pytest.raises(ValueError, match="valid formats"):
        make_parser("nope")


# ---- masks and layout ------------------------------------------------------------------------------------
def test_tool_tokens_are_mask_holes_and_the_text_is_the_chat_template():
    agent = make_agent()
    answer_call = call("lookup", key="apple")
    out, _ = run_script(agent, lambda r: answer_call if r.turn == 0 else "it is red", rows=2)
    first = TOKENIZER(answer_call, add_special_tokens=False)["input_ids"] + [EOS]
    second = TOKENIZER("it is red", add_special_tokens=False)["input_ids"] + [EOS]
    for row in range(2):
        mask = out["response_mask"][row].tolist()
        length = int(out["attention_mask"][row, out["prompts"].shape[1] :].sum())
        bridge = length - len(first) - len(second)
        assert bridge > 0
        assert mask == [1] * len(first) + [0] * bridge + [1] * len(second) + [0] * (256 - length)
        # The engine's log-probs only on model tokens; the tool text is context (attention) but not trained.
        assert torch.equal(out["rollout_log_probs"][row] != 0, out["response_mask"][row].bool())
        assert out["attention_mask"][row, -256:].tolist() == [1] * length + [0] * (256 - length)
        # Prompt + response decode to what the chat template renders for the whole conversation (but the
        # newline the template puts after the last turn's EOS, which nobody generates).
        messages = [{"role": "user", "content": f"q{row}"}, {"role": "assistant", "content": answer_call},
                    {"role": "tool", "content": "red"}, {"role": "assistant", "content": "it is red"}]
        ids = out["input_ids"][row][out["attention_mask"][row].bool()].tolist()
        assert TOKENIZER.decode(ids) + "\n" == TOKENIZER.apply_chat_template(messages, tokenize=False)
    assert out["num_turns"].tolist() == [2, 2] and out["num_tool_calls"].tolist() == [1, 1]
    assert out["num_tool_errors"].sum() == 0 and out["truncated"].sum() == 0
    positions = out["position_ids"][0]
    assert torch.equal(positions[-256:], positions[-257] + torch.arange(1, 257))


def test_max_turns_ends_a_conversation_that_keeps_calling():
    out, _ = run_script(make_agent(response_length=512, max_turns=3), lambda r: call("lookup", key="sky"), rows=1)
    assert out["num_turns"].item() == 3 and out["hit_max_turns"].item() == 1
    assert out["num_tool_calls"].item() == 2  # the call of the last turn is not run: no turn is left to read it
    assert tool_texts(out, 0) == ["blue", "blue"]


def test_budget_truncates_tool_output_and_long_turns():
    agent = make_agent(response_length=64, tools=tools("flood"), tool_max_output_chars=10_000)
    out, _ = run_script(agent, lambda r: call("flood"), rows=1)
    assert out["truncated"].item() == 1 and out["num_turns"].item() == 1
    assert int(out["attention_mask"][0, -64:].sum()) == 64  # filled to the budget, not beyond
    assert out["response_mask"][0, -1].item() == 0  # the cut part is tool text
    long_turn, _ = run_script(make_agent(response_length=16), lambda r: "a" * 40, rows=1)
    assert long_turn["truncated"].item() == 1 and long_turn["response_mask"][0].sum() == 16


# ---- tool failures ---------------------------------------------------------------------------------------
def test_tool_errors_timeouts_and_floods_become_messages():
    names = ["explode", "hang", "flood", "missing", "async_echo", "async_hang"]
    agent = make_agent(tools=tools("explode", "hang", "flood", "async_echo", "async_hang"), tool_timeout_s=0.5, tool_max_output_chars=80)
    arguments = {"async_echo": {"text": "hi"}}

    def script(request):
        return call(names[request.row], **arguments.get(names[request.row], {})) if request.turn == 0 else "done"

    start = time.perf_counter()
    out, _ = run_script(agent, script, rows=len(names))
    assert time.perf_counter() - start < 5  # the hanging tools cost their time limit, not their 30 s
    messages = [tool_texts(out, row)[0] for row in range(len(names))]
    assert "raised ValueError: tool exploded on purpose" in messages[0]
    assert "timed out after 0.5 s" in messages[1] and "timed out" in messages[5]
    assert messages[2].startswith("x" * 80) and "output cut: 100000 chars, limit 80" in messages[2]
    assert "unknown tool 'missing'" in messages[3] and "available" in messages[3]
    assert messages[4] == "echo hi"
    assert out["num_tool_errors"].tolist() == [1, 1, 0, 1, 0, 1]
    assert out["num_tool_timeouts"].tolist() == [0, 1, 0, 0, 0, 1]
    assert out["num_outputs_cut"].tolist() == [0, 0, 1, 0, 0, 0]
    assert out["num_turns"].tolist() == [2] * 6  # every conversation went on to its answer


def test_bad_tool_specs_name_the_problem():
    with pytest.raises(ValueError, match="path/to/file.py:name"):
        make_agent(tools=["no_colon_here:"])
    with pytest.raises(AttributeError, match="defines no 'nothing'"):
        make_agent(tools=tools("nothing"))
    with pytest.raises(ValueError, match="either `environment` or `tools`"):
        make_agent(environment="workers.agent_tasks.vault:VaultEnvironment")


# ---- scheduling ------------------------------------------------------------------------------------------
def test_a_slow_tool_does_not_stall_the_other_conversations():
    agent = make_agent(tools=tools("slow", "lookup"), max_turns=4)

    def script(request):
        if request.turn >= 2 or (request.row == 0 and request.turn == 1):
            return "done"
        return call("slow", seconds=1.5) if request.row == 0 else call("lookup", key="sky")

    start = time.perf_counter()
    out, generator = run_script(agent, script, rows=4)
    assert out["num_turns"].tolist() == [2, 3, 3, 3]
    slow_row_back = next(t for t, requests in generator.rounds if any(r.row == 0 and r.turn == 1 for r in requests))
    others_done = max(t for t, requests in generator.rounds if any(r.row > 0 and r.turn == 2 for r in requests))
    assert others_done < start + 1.0 < slow_row_back  # the others finished all their turns meanwhile

    _, lockstep = run_script(agent, script, rows=4, lockstep=True)
    assert all(len({r.turn for r in requests}) == 1 for _, requests in lockstep.rounds)  # one turn per round


class StepEngine:
    """A continuously batching engine in plain Python: a turn finishes `3 + row` steps after it went in."""

    def __init__(self):
        self.running = []  # [request, steps left]
        self.cancelled = 0

    def submit(self, request):
        self.running.append([request, 3 + request.row])

    def step(self):
        for entry in self.running:
            entry[1] -= 1
        done = [r for r, left in self.running if left == 0]
        self.running = [entry for entry in self.running if entry[1] > 0]
        return [(r, TurnOutput([EOS])) for r in done]

    def in_flight(self):
        return len(self.running)

    def cancel_all(self):
        self.cancelled += len(self.running)
        self.running.clear()


class HoldingEngine(StepEngine):
    """Holds row 3's first turn until a later turn joined the engine (row 1's second turn comes after a tool
    thread, whose timing varies under load; a few seconds at most, then it lets go)."""

    def __init__(self):
        super().__init__()
        self.later_turn_seen = False
        self.held_steps = 0

    def submit(self, request):
        self.later_turn_seen = self.later_turn_seen or request.turn > 0
        super().submit(request)

    def step(self):
        for entry in self.running:
            if entry[0].row == 3 and entry[0].turn == 0 and not self.later_turn_seen and self.held_steps < 5000:
                entry[1] += 1  # the base step takes it back off: this turn waits
                self.held_steps += 1
                time.sleep(0.001)
        return super().step()


def test_streaming_and_rounds_build_the_same_batch():
    agent = make_agent(tools=tools("lookup", "explode"), max_turns=4)

    def script(request):
        return ["hi " + call("lookup", key="sky"), call("explode"), "bye"][min(request.turn, 2)] if request.row % 2 else "plain"

    rounds, _ = run_script(agent, script, rows=4)
    stream = ScriptedStream(TOKENIZER, EOS, script, HoldingEngine())
    streamed = agent.run(prompt_batch(4), [{}] * 4, stream, PARAMS, call_seed=3, rank=0)
    for key in ("responses", "response_mask", "attention_mask", "num_turns", "num_tool_calls", "num_tool_errors"):
        assert torch.equal(rounds[key], streamed[key]), key
    assert streamed["num_turns"].tolist() == [1, 3, 1, 3]
    assert sum(1 for _, r, in_flight in stream.submissions if r.turn > 0 and in_flight > 0) >= 1


def test_a_failed_streaming_rollout_cancels_its_requests():
    agent = make_agent(max_turns=4)
    engine = StepEngine()

    def script(request):
        # Row 0's first turn ends first (step 3), while rows 1 and 2 are still in the engine (steps 4 and 5): the
        # failure finds them there whatever the tool threads' timing (a failure on a later turn raced them).
        if request.row == 0 and request.turn == 0:
            raise RuntimeError("script failed")
        return call("lookup", key="sky")

    with pytest.raises(RuntimeError, match="script failed"):
        agent.run(prompt_batch(3), [{}] * 3, ScriptedStream(TOKENIZER, EOS, script, engine), PARAMS, call_seed=3, rank=0)
    assert engine.cancelled >= 1 and engine.in_flight() == 0


# ---- environments, rewards and losses --------------------------------------------------------------------
def test_environment_reward_on_the_last_model_token():
    agent = make_agent(tools=[], environment="workers.agent_tasks.vault:VaultEnvironment", format="tiny")

    def script(request):  # call, then copy the code from the tool message
        return "!" if request.turn == 0 else TOKENIZER.decode(request.context).split("tool\n")[-1][:1]

    out, _ = run_script(agent, script, rows=4)
    assert out["env_reward"].tolist() == [1.0] * 4
    data = DataProto.from_dict({k: v for k, v in out.items()}, non_tensors={"data_source": np.array(["synthetic/tool_vault"] * 4, dtype=object)})
    scores, metrics = EnvRewardManager(_NoFallback())(data)
    last = last_valid_positions(out["response_mask"])
    assert torch.equal(scores.nonzero()[:, 1], last) and metrics["env/mean"] == 1.0
    assert out["response_mask"][0, last[0] + 1 :].sum() == 0 and out["response_mask"][0, : last[0]].sum() > 0


class _NoFallback:
    tokenizer = None

    def __call__(self, data):
        raise AssertionError("every row has an environment reward")


def test_vault_reward_shaping():
    env = VaultEnvironment()
    env.reset({}, seed=5)
    assert env.reward(env.code) == 0.0  # right answer without a call
    env.step(ToolCall("vault", {}))
    wrong = next(c for c in CODE_CHARS if c != env.code)
    assert (env.reward(env.code + "x"), env.reward(wrong), env.reward("z")) == (1.0, pytest.approx(0.3), 0.2)


def test_holes_are_never_trained():
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 1]])
    advantages, _ = compute_grpo_outcome_advantage(torch.tensor([[0, 0, 0, 0, 1.0, 0], [0, 0, 0, 0, 0, 0.0]]), mask, ["a", "a"])
    assert torch.all(advantages[mask == 0] == 0) and torch.all(advantages[0, mask[0] == 1] > 0)
    assert last_valid_positions(mask).tolist() == [4, 5]
    cfg = {"loss_agg_mode": "token-mean", "entropy_coeff": 0.01, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2,
           "clip_ratio_c": 3.0, "use_kl_loss": True, "kl_loss_type": "low_var_kl", "kl_loss_coef": 0.1,
           "policy_loss": {"loss_mode": "vanilla"}}
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        log_probs = torch.randn(2, 6, requires_grad=True)
        entropy = torch.rand(2, 6, requires_grad=True)
        micro = DataProto.from_dict({"response_mask": mask, "old_log_probs": torch.randn(2, 6), "advantages": advantages,
                                     "ref_log_prob": torch.randn(2, 6)})
        loss, _ = actor_loss_from_log_probs(log_probs, entropy, micro, torch.device("cpu"), {**cfg, "loss_agg_mode": mode})
        loss.backward()
        assert torch.all(log_probs.grad[mask == 0] == 0) and torch.all(entropy.grad[mask == 0] == 0)
        assert log_probs.grad[mask == 1].abs().sum() > 0


# ---- the real HF engine ----------------------------------------------------------------------------------
class AlwaysCall:
    """Every turn calls the first tool, whatever the random model wrote."""

    def parse(self, text, tool_names):
        return ParsedTurn(calls=[ToolCall(tool_names[0], {"key": "sky"})])


def test_hf_turns_log_probs_match_the_trainers_on_model_tokens(tiny_assets):
    from transformers import AutoModelForCausalLM

    from workers.fsdp.sequences import response_log_probs_and_entropy
    from workers.rollout.agent.engines import HFTurns

    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).eval()
    agent = make_agent(response_length=64, max_turns=3, max_tokens_per_turn=6)
    prompts = prompt_batch(4)
    loop = AgentLoop(HFTurns(model, PARAMS, torch.device("cpu"), synced=False), AlwaysCall(), agent.bridge, agent.settings)
    conversations = loop.run([row[m.bool()].tolist() for row, m in zip(prompts["input_ids"], prompts["attention_mask"])],
                             [agent.new_environment() for _ in range(4)])
    out = conversation_batch(prompts, conversations, 64, PAD)
    assert out["num_turns"].tolist() == [3] * 4 and out["num_tool_calls"].tolist() == [2] * 4
    mask = out["response_mask"].bool()
    holes = (~mask) & out["attention_mask"][:, -64:].bool()
    assert holes.any(dim=1).all() and mask.sum() > 0
    with torch.no_grad():
        recomputed, _ = response_log_probs_and_entropy(model, DataProto.from_dict(out), torch.device("cpu"), 1.0, False)
    gap = (recomputed - out["rollout_log_probs"]).abs()[mask]
    assert gap.max() < 1e-4, gap.max()  # positions and attention over the holes are what the trainer sees


def test_hf_turns_record_the_experts_of_every_token_the_conversation_ran():
    # Routing replay (R3) on a multi-turn rollout: each turn's generate runs the whole conversation so far, and the
    # latest turn's choices cover every position but its own last sampled token (and a tool message after it).
    from transformers import Qwen3MoeForCausalLM

    from trainer.tiny_moe import EXPERTS, build_tiny_moe_config
    from workers.rollout.agent.engines import HFTurns
    from workers.routing_replay.hooks import NOT_RECORDED, RouterChoices
    from workers.routing_replay.token_order import ROUTED_EXPERTS, TokenOrder

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(build_tiny_moe_config(TOKENIZER)).eval()
    choices = RouterChoices(model)
    agent = make_agent(response_length=64, max_turns=3, max_tokens_per_turn=6)
    prompts = prompt_batch(4)
    turns = HFTurns(model, PARAMS, torch.device("cpu"), synced=False, routing=choices)
    loop = AgentLoop(turns, AlwaysCall(), agent.bridge, agent.settings)
    contexts = [row[m.bool()].tolist() for row, m in zip(prompts["input_ids"], prompts["attention_mask"])]
    conversations = loop.run(contexts, [agent.new_environment() for _ in range(4)])
    out = conversation_batch(prompts, conversations, 64, PAD)
    assert out["num_turns"].tolist() == [3] * 4
    table, mask = out[ROUTED_EXPERTS], out["attention_mask"].bool()
    assert table.dtype == torch.int16 and table.shape[:2] == mask.shape
    recorded = (table != NOT_RECORDED).all(dim=(2, 3))
    for row, conversation in enumerate(conversations):
        ran = len(conversation.prompt) + len(conversation.response) - 1  # the last turn's last token never ran
        assert recorded[row].sum() == ran and not (recorded[row] & ~mask[row]).any()
    # The trainer's forward over the whole conversation chooses what the turns chose, token for token.
    order = TokenOrder(mask, packed=False, sequence_parallel=None)
    batch = {key: out[key] for key in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad(), choices.comparing(order.to_forward(table)):
        model(**batch)
    assert choices.pop_mismatch() == 0.0
    table[recorded] = (table[recorded].long() + 1).remainder(EXPERTS).to(torch.int16)  # every choice moved: all differ
    with torch.no_grad(), choices.comparing(order.to_forward(table)):
        model(**batch)
    assert choices.pop_mismatch() == 1.0


def test_a_turn_cut_by_the_budget_keeps_the_experts_of_the_tokens_kept():
    # An engine returns the experts of every token it ran ([context + sampled - 1, layers, k], vLLM's per-request
    # array); a turn cut to the response budget keeps those of its context and of the kept tokens but the last.
    from workers.rollout.agent.loop import Conversation

    agent = make_agent(response_length=4)
    loop = AgentLoop(ScriptedTurns(TOKENIZER, EOS, lambda request: ""), AlwaysCall(), agent.bridge, agent.settings)
    conversation = Conversation(0, [5, 6, 7], agent.new_environment())
    routed = torch.arange(3 + 6 - 1).view(-1, 1, 1).expand(-1, 2, 2)  # 6 sampled tokens after a 3-token context
    loop.after_turn(conversation, TurnOutput([9] * 6, [-0.1] * 6, routed_experts=routed))
    assert conversation.truncated and len(conversation.response) == 4
    assert conversation.routing[:, 0, 0].tolist() == list(range(3 + 4 - 1))
