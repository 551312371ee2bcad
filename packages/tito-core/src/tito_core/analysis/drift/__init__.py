"""The train/sample mismatch, measured: logprob gaps, and what a text-based stack would train on instead.

Two questions about a recorded rollout, answered without torch (the logprobs a trainer recomputes are
given by the caller, e.g. :func:`tito_transformers.scoring.token_logprobs`):

* **Logprob gap** (:func:`logprob_gap`): the recorded (sampler's) logprobs against the trainer's
  recomputed ones, as mean / max absolute difference and the k3 estimate of KL(sampler || trainer),
  over any selection of positions (all trained tokens, tool-call tokens, constrained turns).
* **Retokenization drift** (:func:`text_stack_view`, :func:`compare_ids`): the conversation a text-based
  stack holds at the end of the rollout (assistant text and tool calls parsed from the outputs, tool
  results as messages) re-rendered with the chat template and tokenized again, compared with the ids the
  engine actually consumed and produced: which spans differ, why (:data:`DriftCategory`), and how many
  loss-mask positions no longer line up.

The text stack is rebuilt from the trajectory itself, the way such a stack gets its messages: each
output is decoded and parsed by the same tool parser, tool results are read back out of the recorded
prompt segments, and the messages go through the same conversion tito applies to Strands messages.
"""

from __future__ import annotations

from .compare import DRIFT_CATEGORIES, DriftCategory, DriftSpan, IdComparison, compare_ids
from .logprobs import LogprobGap, logprob_gap
from .regions import output_regions
from .text_stack import TextStackView, text_stack_view
from .text_stack import text_stack_messages as text_stack_messages

__all__ = [
    "DRIFT_CATEGORIES",
    "DriftCategory",
    "DriftSpan",
    "IdComparison",
    "LogprobGap",
    "TextStackView",
    "compare_ids",
    "logprob_gap",
    "output_regions",
    "text_stack_view",
]
