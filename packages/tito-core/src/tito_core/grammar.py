"""Grammars for constrained decoding: forced tool calls (Strands' ``tool_choice``) and structured answers as EBNF.

The grammar text uses the EBNF dialect of xgrammar and llama.cpp's GBNF (``root ::= "a" rule*``), which
vLLM's ``structured_outputs.grammar`` and SGLang's ``ebnf`` sampling parameter both read. A tool parser
that can constrain its own call syntax implements :class:`GrammarToolParser`; the JSON parts of a call come
from the tool's input schema through :func:`schema_rule`.

Generated JSON is canonical (``json.dumps`` separators ``", "`` and ``": "``, keys in schema order), so a
constrained call is one the strict parsers read back unchanged. The schema is followed for structure and
types (objects and their properties, arrays, strings, numbers, enums, ``anyOf``, ``$ref``); value bounds
(``minimum``, ``maxLength``, ``pattern``, ``format``) are not enforced by the grammar.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from tito_core._suggest import did_you_mean
from tito_core.conversation import ToolSpec
from tito_core.errors import ConfigError

__all__ = [
    "Ebnf",
    "answer_grammar",
    "GrammarToolParser",
    "ToolChoiceError",
    "forced_tools",
    "input_schema",
    "json_call_grammar",
    "literal",
    "one_call_of",
    "schema_rule",
    "tool_call_grammar",
    "tool_choice_option",
]


class ToolChoiceError(ConfigError):
    """A ``tool_choice`` that cannot be honoured.

    An unknown form or tool, no tools offered, or a parser or backend that cannot constrain decoding.
    """


@runtime_checkable
class GrammarToolParser(Protocol):
    """A tool parser that can give the grammar of its own call syntax."""

    name: str

    def call_grammar(self, tools: Sequence[ToolSpec]) -> str:
        """EBNF (``root`` rule first) admitting exactly one call, in this parser's format, to one of ``tools``."""
        ...


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def literal(text: str) -> str:
    """``text`` as an EBNF string literal."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# The canonical JSON of an unconstrained value (no whitespace but the json.dumps separators).
_JSON_RULES = {
    "json_value": "json_object | json_array | json_string | json_number | json_bool | json_null",
    "json_object": '"{" ( json_string ": " json_value ( ", " json_string ": " json_value )* )? "}"',
    "json_array": '"[" ( json_value ( ", " json_value )* )? "]"',
    # right-recursive: xgrammar computes masks inside a string ~2000x faster than for `"\"" char* "\""`
    "json_string": '"\\"" json_chars',
    "json_chars": '"\\"" | [^"\\\\\\x00-\\x1f] json_chars | "\\\\" json_escape json_chars',
    "json_escape": '["\\\\/bfnrt] | "u" json_hex json_hex json_hex json_hex',
    "json_hex": "[0-9a-fA-F]",
    "json_integer": '"-"? ( "0" | [1-9] [0-9]* )',
    "json_number": 'json_integer ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?',
    "json_bool": '"true" | "false"',
    "json_null": '"null"',
}
_USES = {
    "json_value": ("json_object", "json_array", "json_string", "json_number", "json_bool", "json_null"),
    "json_object": ("json_string", "json_value"),
    "json_array": ("json_value",),
    "json_string": ("json_chars",),
    "json_chars": ("json_escape",),
    "json_escape": ("json_hex",),
    "json_number": ("json_integer",),
}
_SCALARS = {
    "string": "json_string",
    "integer": "json_integer",
    "number": "json_number",
    "boolean": "json_bool",
    "null": "json_null",
}
_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_]+")
_RULE_HEAD = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_-]*)\s*::=(.*)$")


class Ebnf:
    """One grammar under construction: named rules, the shared JSON rules added when used."""

    def __init__(self) -> None:
        self._rules: dict[str, str] = {}
        self._json: set[str] = set()
        self.refs: dict[int, dict[str, str]] = {}  # by id() of the schema document: $ref -> rule name

    def json(self, name: str) -> str:
        """The name of a shared JSON rule (``json_value``, ``json_string``, ...), added with what it uses."""
        todo = [name]
        while todo:
            rule = todo.pop()
            if rule not in self._json:
                self._json.add(rule)
                todo.extend(_USES.get(rule, ()))
        return name

    def reserve(self, hint: str) -> str:
        """A fresh rule name from ``hint`` (defined later with :meth:`define`)."""
        base = _NAME_CHARS.sub("_", hint).strip("_").lower()[:48].rstrip("_") or "r"  # deep hints: unique by number
        if not base[0].isalpha():
            base = "r_" + base
        name, n = base, 1
        while name in self._rules or name in _JSON_RULES or name == "root":
            n += 1
            name = f"{base}_{n}"
        self._rules[name] = ""
        return name

    def define(self, name: str, body: str) -> str:
        """Set the body of a reserved rule; returns its name."""
        self._rules[name] = body
        return name

    def rule(self, hint: str, body: str) -> str:
        """A new rule named from ``hint``; returns its name."""
        return self.define(self.reserve(hint), body)

    def shared(self, name: str, body: str) -> str:
        """A rule defined once per grammar under a fixed ``name`` (later calls reuse it)."""
        if self._rules.get(name) not in (None, body):
            raise ValueError(f"rule {name!r} is already defined differently")
        self._rules[name] = body
        return name

    def include(self, grammar: str, hint: str) -> str:
        """Add the rules of another grammar; returns the name its ``root`` rule gets here.

        The grammar has one rule a line (``name ::= body``), a body possibly continued on the lines after it.

        Raises:
            ConfigError: It defines one of the shared JSON rules otherwise than this module does.
        """
        rules: dict[str, str] = {}
        name = ""
        for line in grammar.splitlines():
            head = _RULE_HEAD.match(line)
            if head:
                name = head.group(1)
                rules[name] = head.group(2).strip()
            elif line.strip() and name:
                rules[name] += " " + line.strip()
        if "root" not in rules:
            raise ConfigError(f"a grammar to include has no root rule: {grammar[:80]!r}")
        for rule, body in rules.items():
            if rule in _JSON_RULES:
                if body != _JSON_RULES[rule]:
                    raise ConfigError(f"the grammar defines {rule!r} otherwise than tito's shared JSON rules")
                self.json(rule)
            elif rule != "root":
                if rule in self._rules:
                    raise ConfigError(f"the grammar's rule {rule!r} is already defined here")
                self._rules[rule] = body
        return self.rule(hint, rules["root"])

    def text(self, root: str) -> str:
        """The grammar, ``root`` rule first."""
        lines = [f"root ::= {root}"]
        lines += [f"{name} ::= {body}" for name, body in self._rules.items()]
        lines += [f"{name} ::= {body}" for name, body in _JSON_RULES.items() if name in self._json]
        return "\n".join(lines) + "\n"


def _alternatives(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else "( " + " | ".join(items) + " )"


class _SchemaConverter:
    def __init__(self, ebnf: Ebnf, root: Mapping[str, Any]) -> None:
        self.ebnf = ebnf
        self.root = root
        self.refs = ebnf.refs.setdefault(id(root), {})

    def value(self, schema: Any, hint: str) -> str:
        """An EBNF expression for the JSON values ``schema`` admits."""
        if schema is True or not isinstance(schema, Mapping) or not schema:
            return self.ebnf.json("json_value")
        if "$ref" in schema:
            return self._ref(str(schema["$ref"]))
        if "const" in schema:
            return literal(_dump(schema["const"]))
        if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
            return _alternatives([literal(_dump(v)) for v in schema["enum"]])
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                return _alternatives([self.value(option, f"{hint}_{i}") for i, option in enumerate(options)])
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1:
            return self.value(all_of[0], hint)
        kind = schema.get("type")
        if isinstance(kind, list) and kind:
            return _alternatives([self.value({**schema, "type": k}, f"{hint}_{k}") for k in kind])
        if kind == "object" or (kind is None and "properties" in schema):
            return self._object(schema, hint)
        if kind == "array":
            return self._array(schema, hint)
        return self.ebnf.json(_SCALARS.get(str(kind), "json_value"))

    def _ref(self, ref: str) -> str:
        if ref in self.refs:
            return self.refs[ref]
        target: Any = self.root
        if not ref.startswith("#/"):
            raise ConfigError(f"tool schema $ref {ref!r} is not local (#/...); the grammar cannot follow it")
        for part in ref[2:].split("/"):
            if not isinstance(target, Mapping) or part not in target:
                raise ConfigError(f"tool schema $ref {ref!r} points to nothing")
            target = target[part]
        name = self.refs[ref] = self.ebnf.reserve("def_" + ref.rsplit("/", 1)[-1])
        self.ebnf.define(name, self.value(target, name))
        return name

    def _object(self, schema: Mapping[str, Any], hint: str) -> str:
        props = schema.get("properties")
        if not isinstance(props, Mapping) or not props:
            if schema.get("additionalProperties") is False:
                return literal("{}")
            return self.ebnf.json("json_object")
        required = set(schema.get("required") or ())
        # Properties in schema order, optional ones skippable: first(i) writes properties i.. when none was
        # written yet, after(i) when one was (so each needs its ", "). Linear in the number of properties.
        first, after = "", ""
        for i, (key, sub) in reversed(list(enumerate(props.items()))):
            value = self._named(self.value(sub, f"{hint}_{key}"), f"{hint}_{key}")  # an optional pair is written twice
            pair = f"{literal(_dump(str(key)) + ': ')} {value}"
            tail = f" {after}" if after else ""
            if key in required:
                new_after, new_first = f'", " {pair}{tail}', f"{pair}{tail}"
            else:
                new_after = f'( ", " {pair} )?{tail}'
                new_first = f"( {pair}{tail} | {first} )" if first else f"( {pair}{tail} )?"
            after = self.ebnf.rule(f"{hint}_after{i}", new_after)
            first = self.ebnf.rule(f"{hint}_first{i}", new_first)
        return f'"{{" {first} "}}"'

    def _array(self, schema: Mapping[str, Any], hint: str) -> str:
        item = self._named(self.value(schema.get("items"), f"{hint}_item"), f"{hint}_item")  # written twice
        min_items = schema.get("minItems")
        if isinstance(min_items, int) and min_items >= 1:
            return f'"[" {item} ( ", " {item} )* "]"'
        return f'"[" ( {item} ( ", " {item} )* )? "]"'

    def _named(self, expression: str, hint: str) -> str:
        """``expression`` as a rule of its own unless it is one already (written twice in its parent, once here).

        Copied inline, an array's item nested n arrays deep was written 2**n times (a tool schema 20 arrays deep
        made a 37 MB grammar; one 60 deep took the gateway's memory).
        """
        return expression if _NAME.fullmatch(expression) else self.ebnf.rule(hint, expression)


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def schema_rule(ebnf: Ebnf, schema: Any, hint: str, *, document: Mapping[str, Any] | None = None) -> str:
    """An EBNF expression (a rule name or a literal) for the canonical JSON values ``schema`` admits.

    ``document`` is the schema that ``$ref``s resolve in (``schema`` itself when None).
    """
    root = document if document is not None else schema if isinstance(schema, Mapping) else {}
    return _SchemaConverter(ebnf, root).value(schema, hint)


def answer_grammar(schema: Any, *, call: str | None = None) -> str:
    """The grammar of a structured answer: one canonical JSON value that ``schema`` admits.

    With ``call`` (the grammar of a tool call, :func:`tool_call_grammar`), that call is admitted instead of the
    answer: a model offered tools may still call one before it answers.
    """
    ebnf = Ebnf()
    tool_call = ebnf.include(call, "tool_call") if call is not None else None  # first: its rule names are kept
    answer = schema_rule(ebnf, schema, "answer")
    if tool_call is None:
        return ebnf.text(answer)
    return ebnf.text(f"{tool_call} | {ebnf.rule('answer', answer)}")


def input_schema(spec: ToolSpec) -> dict[str, Any]:
    """The JSON schema of a tool's input (Strands wraps it as ``{"json": {...}}``)."""
    schema: Any = spec.get("inputSchema") or {}
    if isinstance(schema, Mapping) and "json" in schema:
        schema = schema["json"]
    return dict(schema) if isinstance(schema, Mapping) else {}


def tool_choice_option(value: Any) -> dict[str, Any] | None:
    """Normalise a model's ``tool_choice`` option to Strands' form (None for "auto").

    Raises:
        ToolChoiceError: Not ``"auto"``, ``"any"`` / ``"required"``, None or one of Strands' dict forms.

    """
    if value is None or value == "auto":
        return None
    if value in ("any", "required"):
        return {"any": {}}
    if isinstance(value, Mapping) and len(value) == 1:
        if "auto" in value:
            return None
        if "any" in value:
            return {"any": {}}
        spec = value.get("tool")
        if isinstance(spec, Mapping) and isinstance(spec.get("name"), str) and spec["name"]:
            return {"tool": {"name": spec["name"]}}
    raise ToolChoiceError(
        "tool_choice must be 'auto', 'any' (or 'required'), {'auto': {}}, {'any': {}} or "
        f"{{'tool': {{'name': NAME}}}}, got {value!r}"
    )


def forced_tools(tool_specs: Sequence[ToolSpec] | None, tool_choice: Any) -> list[ToolSpec] | None:
    """The tools one of which must be called, from a Strands ``tool_choice``; None when nothing is forced.

    ``{"auto": {}}`` (or None) forces nothing; ``{"any": {}}`` forces a call to one of the offered tools;
    ``{"tool": {"name": NAME}}`` a call to that tool.

    Raises:
        ToolChoiceError: An unknown form, a forced call with no tools offered, or an unknown tool name.

    """
    if tool_choice is None or (isinstance(tool_choice, Mapping) and "auto" in tool_choice):
        return None
    if not isinstance(tool_choice, Mapping) or not ({"any", "tool"} & tool_choice.keys()):
        raise ToolChoiceError(
            "tool_choice must be {'auto': {}}, {'any': {}} or {'tool': {'name': NAME}}, "
            f"got {tool_choice!r}"
        )
    if not tool_specs:
        raise ToolChoiceError(f"tool_choice {tool_choice!r} forces a tool call, but no tools were offered")
    if "any" in tool_choice:
        return list(tool_specs)
    spec = tool_choice["tool"]
    name = spec.get("name") if isinstance(spec, Mapping) else None
    names = [s["name"] for s in tool_specs]
    if name not in names:
        raise ToolChoiceError(
            f"tool_choice names the tool {name!r}, which is not offered (tools: {', '.join(names)})"
            + did_you_mean(str(name), names)
        )
    return [s for s in tool_specs if s["name"] == name]


def one_call_of(tools: Sequence[ToolSpec], call: Callable[[Ebnf, ToolSpec], str]) -> str:
    """A grammar admitting one call to one of ``tools``; ``call`` gives the EBNF expression of a call to one tool."""
    if not tools:
        raise ToolChoiceError("a tool-call grammar needs at least one tool")
    ebnf = Ebnf()
    calls = [ebnf.rule(f"call_{spec['name']}", call(ebnf, spec)) for spec in tools]
    return ebnf.text(" | ".join(calls))


def json_call_grammar(tools: Sequence[ToolSpec], arguments_key: str, *, before: str = "", after: str = "") -> str:
    """One call written as the JSON object ``{"name": NAME, "<arguments_key>": ARGS}``.

    ``before`` and ``after`` surround it (hermes: ``"arguments"`` inside the tool-call tags; Llama 3: bare
    ``"parameters"``).
    """

    def call(ebnf: Ebnf, spec: ToolSpec) -> str:
        head = f'{before}{{"name": {_dump(spec["name"])}, {_dump(arguments_key)}: '
        args = schema_rule(ebnf, input_schema(spec), f"{spec['name']}_args")
        return f"{literal(head)} {args} {literal('}' + after)}"

    return one_call_of(tools, call)


def tool_call_grammar(parser: object, tools: Sequence[ToolSpec]) -> str:
    """The grammar of one call to one of ``tools`` in ``parser``'s format.

    Raises:
        ToolChoiceError: The parser cannot give a grammar for its call syntax.

    """
    if not isinstance(parser, GrammarToolParser):
        name = getattr(parser, "name", type(parser).__name__)
        raise ToolChoiceError(
            f"the {name!r} tool parser cannot constrain tool calls (it gives no grammar), so tool_choice "
            "cannot force a call; use a parser with call_grammar() (hermes, qwen_xml, llama3_json) or "
            "leave tool_choice unset"
        )
    return parser.call_grammar(tools)
