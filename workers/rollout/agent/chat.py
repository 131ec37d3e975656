"""Token pieces the rollout inserts between model turns, rendered by the model's own chat template.

After a model turn that called tools, the conversation continues with: the rest of the assistant turn's
end marker (the model already produced the EOS when it stopped), the tool messages, and the header of the
next assistant turn. All of it is environment text (mask 0).
"""

from __future__ import annotations

from typing import Any

PROBE = "PROBE"  # placeholder content, located in the rendered text to cut out the template's pieces


class ChatBridge:
    def __init__(self, tokenizer: Any, eos_token_ids: tuple[int, ...], tool_role: str = "tool") -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.tool_role = tool_role
        rendered = self._render([{"role": "assistant", "content": PROBE}], generation_prompt=False)
        self.end_of_turn = rendered[rendered.rindex(PROBE) + len(PROBE) :]
        self.eos_text = tokenizer.decode(list(eos_token_ids[:1]))
        self.base = self._render([{"role": "user", "content": PROBE}], generation_prompt=False)

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def ended_turn(self, tokens: list[int]) -> bool:
        return bool(tokens) and tokens[-1] in self.eos_token_ids

    def after_model_turn(self, ended_with_eos: bool) -> str:
        """What closes the model's turn: the end-of-turn marker minus the EOS the model already wrote."""
        if ended_with_eos and self.end_of_turn.startswith(self.eos_text):
            return self.end_of_turn[len(self.eos_text) :]
        return self.end_of_turn

    def tool_messages(self, contents: list[str]) -> str:
        """Tool messages plus the next assistant header, as the template renders them after a user turn."""
        messages = [{"role": "user", "content": PROBE}] + [{"role": self.tool_role, "content": c} for c in contents]
        full = self._render(messages, generation_prompt=True)
        if not full.startswith(self.base):
            raise ValueError("the chat template renders earlier messages differently once tool messages follow")
        return full[len(self.base) :]

    def between_turns(self, ended_with_eos: bool, contents: list[str]) -> list[int]:
        return self.encode(self.after_model_turn(ended_with_eos) + self.tool_messages(contents))
