"""The Rust-backend shortcut for encode / decode gives exactly what the tokenizer's own methods give."""

from __future__ import annotations

import copy
from array import array
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tito_core.render import shared_renderer
from tito_core.render.codec import BUSY_TOKENIZER_MESSAGES, is_busy_tokenizer
from tito_core.render.renderer import ChatRenderer

SPECIALS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "<|endoftext|>", "\n", " ", "\t"]
texts = st.lists(st.one_of(st.text(max_size=40), st.sampled_from(SPECIALS)), max_size=12).map("".join)


@pytest.fixture(params=["qwen3", "qwen25"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_tokenizer")


def test_qwen_tokenizers_take_the_shortcut(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    assert renderer._rust_encode is not None
    assert renderer._rust_decode is not None


@given(text=texts)
def test_encode_matches_the_tokenizer(qwen3_tokenizer: Any, qwen25_tokenizer: Any, text: str) -> None:
    for tokenizer in (qwen3_tokenizer, qwen25_tokenizer):
        assert ChatRenderer(tokenizer).encode(text) == tokenizer.encode(text, add_special_tokens=False)


@given(data=st.data())
def test_decode_matches_the_tokenizer(qwen3_tokenizer: Any, data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(0, len(qwen3_tokenizer) - 1), max_size=50))
    renderer = ChatRenderer(qwen3_tokenizer)
    expected = qwen3_tokenizer.decode(ids, skip_special_tokens=False)
    assert renderer.decode(ids) == expected
    assert renderer.decode(array("i", ids)) == expected


def test_a_backend_with_truncation_keeps_to_the_tokenizer_methods(qwen3_tokenizer: Any) -> None:
    tokenizer = copy.deepcopy(qwen3_tokenizer)
    tokenizer.backend_tokenizer.enable_truncation(max_length=4)
    renderer = ChatRenderer(tokenizer)
    assert renderer._rust_encode is None
    text = "one two three four five six seven"
    assert renderer.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert len(renderer.encode(text)) > 4  # transformers turns the backend's truncation off


def test_a_tokenizer_without_a_rust_backend_keeps_to_its_methods(qwen3_tokenizer: Any) -> None:
    class Wrapped:
        """A tokenizer object that only offers the public methods (e.g. a remote-code tokenizer)."""

        chat_template = qwen3_tokenizer.chat_template
        eos_token_id = qwen3_tokenizer.eos_token_id
        all_special_ids = qwen3_tokenizer.all_special_ids

        def __init__(self) -> None:
            self.encoded: list[str] = []

        def encode(self, text: str, add_special_tokens: bool) -> list[int]:
            self.encoded.append(text)
            ids: list[int] = qwen3_tokenizer.encode(text, add_special_tokens=add_special_tokens)
            return ids

        def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
            text: str = qwen3_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
            return text

        def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
            return qwen3_tokenizer.apply_chat_template(*args, **kwargs)

    wrapped = Wrapped()
    renderer = ChatRenderer(wrapped)  # type: ignore[arg-type]
    assert (renderer._rust_encode, renderer._rust_decode) == (None, None)
    assert renderer.encode("hello") == qwen3_tokenizer.encode("hello", add_special_tokens=False)
    assert wrapped.encoded == ["hello"]


def test_models_share_one_renderer_per_tokenizer_and_template(qwen3_tokenizer: Any, qwen25_tokenizer: Any) -> None:
    first = shared_renderer(qwen3_tokenizer, template_kwargs={"enable_thinking": False})
    assert shared_renderer(qwen3_tokenizer, template_kwargs={"enable_thinking": False}) is first
    assert shared_renderer(qwen3_tokenizer) is not first
    assert shared_renderer(qwen25_tokenizer, template_kwargs={"enable_thinking": False}) is not first
    assert shared_renderer(qwen3_tokenizer, chat_template="{{ 'x' }}") is not shared_renderer(qwen3_tokenizer)
    with pytest.raises(TypeError):
        first.template_kwargs["enable_thinking"] = True  # type: ignore[index]


async def test_long_texts_are_tokenized_on_a_worker_thread(qwen3_tokenizer: Any) -> None:
    import threading

    from tito_core.render import codec as chat

    renderer = ChatRenderer(qwen3_tokenizer)
    threads: list[str] = []
    rust_encode, rust_decode = renderer._rust_encode, renderer._rust_decode
    assert rust_encode is not None and rust_decode is not None

    def encode(text: str) -> list[int]:
        threads.append(threading.current_thread().name)
        return rust_encode(text)

    def decode(ids: list[int]) -> str:
        threads.append(threading.current_thread().name)
        return rust_decode(ids)

    renderer._rust_encode, renderer._rust_decode = encode, decode
    long_text = "word " * chat.OFFLOAD_CHARS
    ids = await renderer.aencode(long_text)
    assert ids == qwen3_tokenizer.encode(long_text, add_special_tokens=False)
    assert await renderer.adecode(array("i", ids)) == long_text
    assert await renderer.aencode("short") == qwen3_tokenizer.encode("short", add_special_tokens=False)
    assert threads[0].startswith("tito-tokenize") and threads[1].startswith("tito-tokenize")
    assert threads[2] == threading.current_thread().name  # short: inline


async def test_a_busy_tokenizer_falls_back_to_the_calling_thread(qwen3_tokenizer: Any) -> None:
    from tito_core.render import codec as chat

    renderer = ChatRenderer(qwen3_tokenizer)

    def busy(text: str) -> list[int]:
        raise RuntimeError("Already borrowed")

    renderer._rust_encode = busy
    text = "word " * chat.OFFLOAD_CHARS
    assert await renderer.aencode(text) == qwen3_tokenizer.encode(text, add_special_tokens=False)


async def test_other_runtime_errors_of_the_worker_are_not_taken_for_a_busy_tokenizer(qwen3_tokenizer: Any) -> None:
    from tito_core.render import codec as chat

    renderer = ChatRenderer(qwen3_tokenizer)

    def broken(text: str) -> list[int]:
        raise RuntimeError("something else went wrong")

    renderer._rust_encode = broken
    with pytest.raises(RuntimeError, match="something else went wrong"):
        await renderer.aencode("word " * chat.OFFLOAD_CHARS)


def _tokenizers_borrow_error() -> RuntimeError:
    """The installed tokenizers library's own borrow error: a split re-entered from inside its own callback."""
    from tokenizers import PreTokenizedString

    pretokenized = PreTokenizedString("a b")
    raised: list[RuntimeError] = []

    def split_again(index: int, piece: Any) -> list[Any]:
        try:
            pretokenized.split(lambda i, p: [p])
        except RuntimeError as exc:
            raised.append(exc)
        return [piece]

    pretokenized.split(split_again)
    assert raised, "tokenizers let a split re-enter itself: find another way to provoke its borrow error"
    return raised[0]


def test_a_real_borrow_error_of_the_installed_tokenizers_is_taken_for_a_busy_tokenizer() -> None:
    # An upgrade of tokenizers (or of the PyO3 it is built with) that rewords the error fails here, instead of
    # turning every busy tokenizer into a crash.
    error = _tokenizers_borrow_error()
    assert str(error) in BUSY_TOKENIZER_MESSAGES
    assert is_busy_tokenizer(error)
    assert not is_busy_tokenizer(RuntimeError("something else went wrong"))
    assert not is_busy_tokenizer(ValueError(str(error)))


def test_every_tokenizers_message_of_the_table_is_in_the_installed_library() -> None:
    import pathlib

    import tokenizers

    binaries = [p.read_bytes() for p in pathlib.Path(tokenizers.__file__).parent.glob("tokenizers*.so")]
    binaries += [p.read_bytes() for p in pathlib.Path(tokenizers.__file__).parent.glob("tokenizers*.pyd")]
    assert binaries, "no compiled tokenizers module found"
    for message, why in BUSY_TOKENIZER_MESSAGES.items():
        if why.startswith("tokenizers:"):
            assert any(message.encode() in b for b in binaries), message


async def test_a_pool_stopped_by_interpreter_shutdown_falls_back_to_the_calling_thread(
    qwen3_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import concurrent.futures.thread

    from tito_core.render import codec as chat

    with pytest.raises(RuntimeError) as stopped:  # the standard library's own message, as the table spells it
        monkeypatch.setattr(concurrent.futures.thread, "_shutdown", True)
        concurrent.futures.ThreadPoolExecutor(max_workers=1).submit(int)
    assert is_busy_tokenizer(stopped.value)
    renderer = ChatRenderer(qwen3_tokenizer)
    text = "word " * chat.OFFLOAD_CHARS
    assert await renderer.aencode(text) == qwen3_tokenizer.encode(text, add_special_tokens=False)


def test_long_texts_leave_the_gil_to_other_threads(qwen3_tokenizer: Any) -> None:
    """While Rust tokenizes a long text on a worker thread, Python code (the event loop) runs on.

    With a switch interval far longer than the encode, a thread waiting for the GIL gets it during the encode only
    if the encode released it; so whether this thread counts at all before the encode ends tells, whatever the
    machine's load (a single ``backend.encode`` holds the GIL: this thread would count nothing).
    """
    import sys
    import threading
    import time

    renderer = ChatRenderer(qwen3_tokenizer)
    text = "amber12 basalt37 cobalt99 dune7, " * 20_000  # ~200k tokens: a few hundred milliseconds of Rust
    started, done = threading.Event(), threading.Event()

    def tokenize() -> None:
        started.set()
        renderer.encode(text)
        done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)  # no forced switch during the test: the GIL changes hands only where it is released
    try:
        worker = threading.Thread(target=tokenize)
        worker.start()
        started.wait()
        count = 0
        while not done.is_set():
            count += 1
            if count % 10_000 == 0:
                time.sleep(0)  # let the worker take the GIL back when Rust is done
        worker.join()
    finally:
        sys.setswitchinterval(interval)
    assert count > 0
