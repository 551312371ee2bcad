"""The reward of the OpenAI Agents SDK example: 1.0 when the agent's answer holds the reference number."""

from __future__ import annotations

import re
from typing import Any


def reward(sample: Any) -> float:
    """``sample.text`` is the last line the agent printed."""
    return 1.0 if str(sample.task.answer) in re.findall(r"-?\d+", sample.text) else 0.0
