"""Example tools for `rollout.multi_turn.tools` (docs/agents.md):

    actor_rollout_ref.rollout.multi_turn.tools='["examples/agents/calculator.py:calculate"]'
"""

from __future__ import annotations

import ast
import operator

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.USub: operator.neg, ast.UAdd: operator.pos}


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_value(node.operand))
    raise ValueError(f"only numbers and + - * / are allowed, got {type(node).__name__}")


def calculate(expression: str) -> str:
    """Value of an arithmetic expression, e.g. "12 + 7 * 3" (parsed, never evaluated as Python)."""
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    result = _value(ast.parse(expression, mode="eval").body)
    return str(int(result) if float(result).is_integer() else round(result, 6))
