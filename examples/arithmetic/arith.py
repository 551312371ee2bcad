"""The arithmetic example of `tito rollout`: a calculator tool, a checkable reward, and the model it runs on.

    tito rollout --config examples/arithmetic/tito.toml --dataset examples/arithmetic/tasks.jsonl \
        --output rollouts.jsonl

``tito.toml`` names these objects by import path (``arith:calculator``); the config file's directory is
importable, so this file needs no installing.
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any, Literal

from strands import tool

_OPERATORS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ValueError("only numbers and + - * / are allowed")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses, e.g. "(3 + 4) * 12".

    Args:
        expression: The expression to evaluate.
    """
    value = _evaluate(ast.parse(expression, mode="eval"))
    return str(int(value)) if float(value).is_integer() else str(value)


@tool
def compute(a: int, op: Literal["+", "-", "*"], b: int) -> int:
    """One step of arithmetic: a + b, a - b or a * b.

    Args:
        a: The left operand.
        op: The operation.
        b: The right operand.
    """
    return int(_OPERATORS[{"+": ast.Add, "-": ast.Sub, "*": ast.Mult}[op]](a, b))


def reward(sample: Any) -> float:
    """1.0 when the last number in the agent's final answer is the task's answer, else 0.0."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", sample.text.replace(",", ""))
    return 1.0 if numbers and float(numbers[-1]) == float(sample.task.answer) else 0.0


def prepare() -> dict[str, Any]:
    """Build SmolLM2-135M-Instruct offline (once, cached) and point the config at it, with its tool template."""
    from tito_transformers.models import build_smollm2
    from tito_transformers.templates import smollm2_tools

    model_dir = str(build_smollm2())
    return {"tokenizer": model_dir, "backend_options": {"model_path": model_dir}, "chat_template": smollm2_tools()}
