from __future__ import annotations

from tito_core import check_prefix_preservation
from tito_core.analysis.prefix_check import _SAMPLE, _SAMPLE_TOOL, main
from tito_testing.tokenizers import chat_template, qwen_tokenizer_dir


def test_qwen25_template_is_prefix_preserving(qwen25_tokenizer):
    report = check_prefix_preservation(qwen25_tokenizer, _SAMPLE, tools=[_SAMPLE_TOOL], system_prompt="s")
    assert report.ok, str(report)
    assert report.incremental_text == report.canonical_text


def test_qwen3_template_drops_earlier_thinking_and_the_report_says_where(qwen3_tokenizer):
    """Pitfall 2: Qwen3's canonical full render is not a prefix of the runtime sequence."""
    report = check_prefix_preservation(qwen3_tokenizer, _SAMPLE, tools=[_SAMPLE_TOOL], system_prompt="s")
    assert not report.ok
    assert report.message_index == 1
    assert "<think>" in report.incremental_excerpt and "reasoning" in report.reason
    assert report.incremental_text[: report.position] == report.canonical_text[: report.position]


def test_a_prefix_preserving_qwen3_template_passes(qwen3_tokenizer):
    report = check_prefix_preservation(
        qwen3_tokenizer, _SAMPLE, tools=[_SAMPLE_TOOL], chat_template=chat_template("qwen3_training")
    )
    assert report.ok, str(report)


def test_command_line(capsys):
    assert main([str(qwen_tokenizer_dir("qwen2.5"))]) == 0
    assert "prefix-preserving" in capsys.readouterr().out
    assert main([str(qwen_tokenizer_dir("qwen3"))]) == 1
    assert "NOT prefix-preserving" in capsys.readouterr().out


def test_report_instead_of_traceback_on_any_tokenizer() -> None:
    """A tokenizer that cannot render (no template, a broken object) gives a report, not an exception."""
    from types import SimpleNamespace

    from tito_core.analysis.prefix_check import _SAMPLE, check_prefix_preservation

    report = check_prefix_preservation(SimpleNamespace(chat_template=None), _SAMPLE)
    assert not report.ok and "no chat template" in report.reason
    assert str(report).startswith("NOT prefix-preserving")


def test_report_on_mistral_common_backend() -> None:
    """transformers' MistralCommonBackend (mistral-common's Tekken) is reported on, never a traceback."""
    import importlib.util
    from pathlib import Path

    import pytest

    transformers = pytest.importorskip("transformers")
    if importlib.util.find_spec("mistral_common") is None or not hasattr(transformers, "MistralCommonBackend"):
        pytest.skip("needs mistral-common and a transformers with MistralCommonBackend")
    import mistral_common

    from tito_core.analysis.prefix_check import _SAMPLE, _SAMPLE_TOOL, check_prefix_preservation

    path = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"
    tokenizer = transformers.MistralCommonBackend(tokenizer_path=str(path))
    report = check_prefix_preservation(tokenizer, _SAMPLE, tools=[_SAMPLE_TOOL])
    assert not report.ok and "mistral-common" in report.reason and "tools block" in report.reason
