"""load_tokenizer: one load per path per process, off the event loop, clear errors without hub retries.

No network: HF_HUB_OFFLINE is set for every test, the tokenizer on disk is the offline Qwen3 one saved into
tmp_path, and the tests of the online branch replace the loader or point the hub at a closed local port.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tito_core import tokenizers
from tito_core.errors import ConfigError
from tito_core.tokenizers import aload_tokenizer, clear_tokenizer_cache, load_tokenizer


@pytest.fixture(autouse=True)
def _offline_and_fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    clear_tokenizer_cache()
    yield
    clear_tokenizer_cache()


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The offline Qwen3 tokenizer saved as a model directory (a real one: a few seconds per load)."""
    from tito_testing.tokenizers import load_qwen_tokenizer

    path = tmp_path_factory.mktemp("qwen3-tokenizer")
    load_qwen_tokenizer("qwen3").save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A four-word tokenizer directory: loads in milliseconds, so cache tests can load it often."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1, "world": 2, "<eos>": 3}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    path = tmp_path_factory.mktemp("tiny-tokenizer")
    tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture
def warm() -> None:
    """Import transformers' tokenizer loading before a test times a failure (the import alone takes seconds)."""
    from transformers import AutoTokenizer

    assert AutoTokenizer is not None


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any], int]]:
    """Every call into transformers: (source, kwargs, thread id)."""
    calls: list[tuple[str, dict[str, Any], int]] = []
    real = tokenizers._from_pretrained

    def counting(source: str, **kwargs: Any) -> Any:
        calls.append((source, kwargs, threading.get_ident()))
        return real(source, **kwargs)

    monkeypatch.setattr(tokenizers, "_from_pretrained", counting)
    return calls


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """Every hub reachability check (one TCP connect each): what it found (None: reachable)."""
    found: list[str | None] = []
    real = tokenizers._hub_unreachable

    def counting(*args: Any, **kwargs: Any) -> str | None:
        found.append(real(*args, **kwargs))
        return found[-1]

    monkeypatch.setattr(tokenizers, "_hub_unreachable", counting)
    return found


# --- loading and the cache -------------------------------------------------------------------------


def test_a_qwen_directory_loads_once_from_local_files_only(qwen_dir: Path, loads: list[Any]) -> None:
    tokenizer = load_tokenizer(qwen_dir)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 151645
    assert tokenizer.encode("hello world", add_special_tokens=False) == [14990, 1879]
    assert load_tokenizer(str(qwen_dir)) is tokenizer
    assert load_tokenizer(f"{qwen_dir}/") is tokenizer
    [(source, kwargs, _)] = loads
    assert source == str(qwen_dir.resolve()) and kwargs == {"local_files_only": True}


def test_three_loads_of_one_path_load_once(tokenizer_dir: Path, loads: list[Any]) -> None:
    first = load_tokenizer(str(tokenizer_dir))
    assert first.encode("hello world", add_special_tokens=False) == [1, 2]
    assert load_tokenizer(str(tokenizer_dir)) is first
    assert load_tokenizer(tokenizer_dir) is first
    assert len(loads) == 1


def test_spellings_of_one_directory_share_the_cache(
    tokenizer_dir: Path, loads: list[Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first = load_tokenizer(tokenizer_dir)
    link = tmp_path / "link"
    link.symlink_to(tokenizer_dir, target_is_directory=True)
    monkeypatch.chdir(tokenizer_dir.parent)
    assert load_tokenizer(f"./{tokenizer_dir.name}/") is first
    assert load_tokenizer(link) is first
    assert len(loads) == 1


def test_concurrent_callers_wait_for_one_load(tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = tokenizers._from_pretrained
    real_resolve = tokenizers._resolve
    results: list[Any] = [None] * 8
    arrived = 0
    all_here = threading.Condition()

    def resolve(path_or_name: Any) -> tuple[str, bool]:
        nonlocal arrived
        resolved = real_resolve(path_or_name)
        with all_here:  # next, this caller looks in the cache: empty, since the load waits for every caller
            arrived += 1
            all_here.notify_all()
        return resolved

    def slow(source: str, **kwargs: Any) -> Any:
        calls.append(source)
        with all_here:  # the load ends only once every caller is past the cache check, however slow the machine
            assert all_here.wait_for(lambda: arrived == len(results), timeout=60), "a caller never arrived"
        return real(source, **kwargs)

    monkeypatch.setattr(tokenizers, "_resolve", resolve)
    monkeypatch.setattr(tokenizers, "_from_pretrained", slow)

    def worker(i: int) -> None:
        results[i] = load_tokenizer(tokenizer_dir)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert all(r is results[0] for r in results) and results[0] is not None


def test_each_chat_template_gets_its_own_tokenizer(tokenizer_dir: Path, loads: list[Any]) -> None:
    plain = load_tokenizer(tokenizer_dir)
    templated = load_tokenizer(tokenizer_dir, chat_template="{{ messages }}")
    assert templated is not plain
    assert templated.chat_template == "{{ messages }}"
    assert plain.chat_template != "{{ messages }}"  # the shared one is untouched
    assert load_tokenizer(tokenizer_dir, chat_template="{{ messages }}") is templated
    assert len(loads) == 2


def test_clear_cache_loads_again(tokenizer_dir: Path, loads: list[Any]) -> None:
    first = load_tokenizer(tokenizer_dir)
    clear_tokenizer_cache()
    assert load_tokenizer(tokenizer_dir) is not first
    assert len(loads) == 2


def test_async_load_runs_off_the_event_loop_once(tokenizer_dir: Path, loads: list[Any]) -> None:
    async def main() -> tuple[list[Any], int]:
        loop_thread = threading.get_ident()
        results = await asyncio.gather(*(aload_tokenizer(tokenizer_dir) for _ in range(3)))
        return list(results), loop_thread

    results, loop_thread = asyncio.run(main())
    assert len(loads) == 1
    assert loads[0][2] != loop_thread
    assert results[0] is results[1] is results[2]


def test_async_load_of_a_cached_tokenizer_needs_no_thread(tokenizer_dir: Path, loads: list[Any]) -> None:
    first = load_tokenizer(tokenizer_dir)

    async def main() -> Any:
        return await aload_tokenizer(str(tokenizer_dir))

    assert asyncio.run(main()) is first
    assert len(loads) == 1


def test_async_errors_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        asyncio.run(aload_tokenizer("/no/such/tokenizer"))


# --- paths that are not there ----------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["/no/such/tokenizer", "./no-such-tokenizer", "~/no-such-tito-tokenizer", "a/b/c"])
def test_a_missing_path_fails_at_once_without_the_hub(spelling: str, loads: list[Any], probes: list[Any]) -> None:
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_tokenizer(spelling)
    assert str(info.value).startswith(f"tokenizer path {spelling!r} does not exist")
    assert loads == [] and probes == []  # at once: neither transformers nor the hub was asked
    assert time.monotonic() - started < 30  # a guard against a hang, not a speed check


def test_a_missing_path_object_is_a_path_even_without_a_slash(tmp_path: Path, loads: list[Any]) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_tokenizer(Path("qwen3-local"))
    assert loads == []


def test_a_file_is_not_a_tokenizer_directory(tmp_path: Path) -> None:
    file = tmp_path / "tokenizer.json"
    file.write_text("{}")
    with pytest.raises(ConfigError, match=r"is a file; give the directory that holds tokenizer.json"):
        load_tokenizer(file)


def test_a_directory_without_a_tokenizer_names_the_path(tmp_path: Path) -> None:
    empty = tmp_path / "empty-model"
    empty.mkdir()
    with pytest.raises(ConfigError) as info:
        load_tokenizer(empty)
    assert f"cannot load a tokenizer from directory {str(empty.resolve())!r}" in str(info.value)
    assert isinstance(info.value.__cause__, OSError | ValueError)


def test_a_failure_is_not_cached(tmp_path: Path, tokenizer_dir: Path) -> None:
    target = tmp_path / "later"
    with pytest.raises(ConfigError):
        load_tokenizer(target)
    target.symlink_to(tokenizer_dir, target_is_directory=True)
    assert load_tokenizer(target).convert_tokens_to_ids("world") == 2


@pytest.mark.parametrize("value", ["", "  ", 42, None])
def test_not_a_path_or_name(value: Any) -> None:
    with pytest.raises(ConfigError, match="tokenizer path or name"):
        load_tokenizer(value)


# --- hub names -------------------------------------------------------------------------------------


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_a_hub_name_missing_offline_fails_fast_and_says_what_to_do(
    variable: str, monkeypatch: pytest.MonkeyPatch, loads: list[Any], probes: list[Any], warm: None
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv(variable, "1")
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_tokenizer("tito-tests/no-such-model")
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert "tokenizer 'tito-tests/no-such-model' is not a local directory" in message
    assert "not in the local Hugging Face cache" in message
    assert f"({variable}=1)" in message and "hf download tito-tests/no-such-model" in message
    # fast: one look in the local cache, no reachability check, no download (with its ~50 s of retries)
    assert [kwargs for _, kwargs, _ in loads] == [{"revision": None, "local_files_only": True}]
    assert probes == []
    assert elapsed < 30  # a guard against a hang, not a speed check


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_hub_name_with_the_hub_unreachable_fails_fast(
    monkeypatch: pytest.MonkeyPatch, loads: list[Any], probes: list[Any], warm: None
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_tokenizer("tito-tests/no-such-model", revision="v1")
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert "tokenizer 'tito-tests/no-such-model' (revision 'v1')" in message
    assert "the hub cannot be reached (http://127.0.0.1:" in message and "HF_HUB_OFFLINE=1" in message
    # fast: one look in the local cache and one reachability check that failed, no download attempted
    assert [kwargs.get("local_files_only") for _, kwargs, _ in loads] == [True]
    assert len(probes) == 1 and (probes[0] or "").startswith("http://127.0.0.1:")
    assert elapsed < 30  # a guard against a hang, not a speed check


def test_a_hub_name_with_the_hub_reachable_is_downloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    calls: list[dict[str, Any]] = []
    downloaded = object()

    def fake(source: str, **kwargs: Any) -> Any:
        calls.append(kwargs)
        if kwargs.get("local_files_only"):
            raise OSError("not in the cache")
        return downloaded

    monkeypatch.setattr(tokenizers, "_from_pretrained", fake)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert load_tokenizer("tito-tests/model", revision="main") is downloaded
        assert load_tokenizer("tito-tests/model", revision="main") is downloaded
    assert calls == [{"revision": "main", "local_files_only": True}, {"revision": "main"}]


def test_a_failed_download_names_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(tokenizers, "_hub_unreachable", lambda: None)

    def fake(source: str, **kwargs: Any) -> Any:
        raise OSError("tito-tests/model is not a local folder and is not a valid model identifier")

    monkeypatch.setattr(tokenizers, "_from_pretrained", fake)
    with pytest.raises(ConfigError, match=r"cannot load tokenizer 'tito-tests/model' from the Hugging Face hub: "):
        load_tokenizer("tito-tests/model")


def test_a_hub_name_in_the_local_cache_needs_no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    cached = object()
    calls: list[dict[str, Any]] = []

    def fake(source: str, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return cached

    def probe() -> str | None:
        raise AssertionError("the hub must not be contacted for a cached tokenizer")

    monkeypatch.setattr(tokenizers, "_from_pretrained", fake)
    monkeypatch.setattr(tokenizers, "_hub_unreachable", probe)
    assert load_tokenizer("Qwen/Qwen3-8B") is cached
    assert calls == [{"revision": None, "local_files_only": True}]


def test_a_proxy_is_probed_instead_of_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    port = _closed_port()
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    reason = tokenizers._hub_unreachable(timeout=1.0)
    assert reason is not None and reason.startswith("proxy 127.0.0.1")


def test_hub_names_and_paths_are_told_apart() -> None:
    looks_like_path = tokenizers._looks_like_path
    for name in ("gpt2", "Qwen/Qwen3-8B", "org/model.v1_2-x"):
        assert not looks_like_path(name), name
    for path in ("/models/q", "./q", "../q", "~/q", "~q", "a/b/c", "org/", "/", ".", "..", os.path.join("a", "b", "c")):
        assert looks_like_path(path), path


def test_the_cache_follows_tito_cache_dir_then_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tito_testing.tokenizers import cache_root

    monkeypatch.delenv("TITO_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "tito"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # not absolute: ignored, as the XDG spec says
    assert cache_root() == Path.home() / ".cache" / "tito"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "tito"
    monkeypatch.setenv("TITO_CACHE_DIR", str(tmp_path / "tito"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "tito"
