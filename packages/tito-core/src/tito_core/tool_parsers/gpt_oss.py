"""gpt-oss (OpenAI harmony) output: channels for reasoning, tool calls and the answer.

The model continues the generation prompt ``<|start|>assistant`` with one or more messages::

    <|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
    <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>

The recipient ``to=...`` may also come before the channel (``assistant to=functions.NAME<|channel|>commentary
json<|message|>``, as the official template renders calls). ``analysis`` is reasoning, a ``commentary``
message with a ``functions.*`` recipient is a tool call, ``final`` (and ``commentary`` without a recipient,
a preamble) is content. tito removes the stop token (``<|call|>`` / ``<|return|>``) before parsing, so the
last message may end at the end of the text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from tito_core.conversation import ToolSpec
from tito_core.tool_parsers._common import call_with_json_arguments, snippet, valid_name
from tito_core.tool_parsers.base import ParsedOutput, ToolCall, malformed_call

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
CONSTRAIN = "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
_TERMINATORS = (END, CALL, RETURN)
_WORD = r"([^\s<]+)"
_RECIPIENT = re.compile(r"(?:^|\s)to=" + _WORD)
_CHANNEL = re.compile(re.escape(CHANNEL) + _WORD)
_CONSTRAIN = re.compile(re.escape(CONSTRAIN) + _WORD)
FUNCTIONS = "functions."


class _Message(NamedTuple):
    raw: str
    channel: str | None
    recipient: str | None
    content_type: str | None
    body: str
    terminator: str | None


def _messages(text: str) -> list[_Message]:
    """Split ``text`` into harmony messages (the first one continues the generation prompt's header)."""
    out: list[_Message] = []
    pos, n = 0, len(text)
    while pos < n:
        header_end = text.find(MESSAGE, pos)
        if header_end == -1:
            out.append(_Message(text[pos:], None, None, None, text[pos:], None))
            break
        header = text[pos:header_end]
        if header.startswith(START):
            header = header[len(START) :]
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header.replace(CHANNEL, " ").replace(CONSTRAIN, " "))
        constrain = _CONSTRAIN.search(header)
        content_type = constrain.group(1) if constrain else None
        if content_type is None and channel is not None:
            after = header[channel.end() :].replace(CONSTRAIN, " ").split()
            rest = [word for word in after if not word.startswith("to=")]
            content_type = rest[0] if rest else None
        body_start = header_end + len(MESSAGE)
        ends = [(at, term) for term in _TERMINATORS if (at := text.find(term, body_start)) != -1]
        if ends:
            at, term = min(ends)
            stop: int = at + len(term)
            terminator: str | None = term
        else:
            at, stop, terminator = n, n, None
        out.append(
            _Message(
                raw=text[pos:stop],
                channel=channel.group(1) if channel else None,
                recipient=recipient.group(1) if recipient else None,
                content_type=content_type,
                body=text[body_start:at],
                terminator=terminator,
            )
        )
        pos = stop
    return out


class GptOssToolParser:
    """Strict parser for gpt-oss harmony output.

    A tool call is a ``commentary`` message addressed ``to=functions.NAME`` whose body is one JSON
    object, ended by ``<|call|>`` (or by the end of the text, where tito removed that stop token). A
    call on another channel, to a recipient outside ``functions.``, with a content type other than
    ``json``, ended by ``<|end|>`` / ``<|return|>``, or with invalid arguments is malformed, keeping its
    exact raw text; nothing is repaired. ``analysis`` messages are reasoning and never hold calls;
    ``final`` messages and recipient-less ``commentary`` preambles are content. Text that is not a
    harmony message at all is content.
    """

    name = "gpt_oss"

    def parse(self, text: str, tools: Sequence[ToolSpec] | None = None) -> ParsedOutput:
        """Split ``text`` into reasoning (analysis), content (final, preambles) and tool calls."""
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[ToolCall] = []
        for message in _messages(text):
            if message.recipient is not None:
                calls.append(self._call(message))
            elif message.channel == "analysis":
                if message.body.strip():
                    reasoning.append(message.body.strip("\n"))
            elif message.body.strip():
                content.append(message.body.strip())
        return ParsedOutput(
            content="\n\n".join(content), reasoning="\n\n".join(reasoning) if reasoning else None, calls=calls
        )

    @staticmethod
    def _call(message: _Message) -> ToolCall:
        recipient = message.recipient or ""
        name = recipient[len(FUNCTIONS) :] if recipient.startswith(FUNCTIONS) else None
        if name is not None and not valid_name(name):
            return malformed_call(message.raw, f"invalid tool name in recipient {snippet(recipient)}")
        if name is None:
            return malformed_call(
                message.raw, f"unknown recipient {snippet(recipient)}: only functions.NAME tools can be called"
            )
        if message.channel != "commentary":
            return malformed_call(
                message.raw,
                f"tool calls must go to the commentary channel, got {snippet(message.channel or 'none')}",
                name,
            )
        if message.terminator not in (CALL, None):
            return malformed_call(message.raw, f"tool call ended with {message.terminator}, expected {CALL}", name)
        if message.content_type not in (None, "json"):
            return malformed_call(
                message.raw, f"tool call content type must be json, got {snippet(message.content_type)}", name
            )
        return call_with_json_arguments(message.raw, name, message.body)
