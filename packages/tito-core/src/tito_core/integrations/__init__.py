"""Integrations with libraries built around Strands agents, one module per library.

None of them is imported by ``tito_core``, and none imports its library at import time.

- :mod:`tito_core.integrations.strands_env`: strands-env environments on a tito model (a ``model_factory``),
  and a strands-env environment as the tools, reward and tasks of ``tito rollout``.
"""
