"""The analysis of recorded rollouts and templates: offline checks of how far other paths are from the exact tokens.

None of it runs while a rollout is recorded; each reads records, a trajectory or a template and reports.

* :mod:`~tito_core.analysis.audit`: the mismatch ledger (``tito audit``): the logprobs a rollout file recorded
  against an independent re-score of the same tokens.
* :mod:`~tito_core.analysis.drift`: retokenization drift (``tito audit --drift``): what a text-based stack would
  train on instead of the recorded ids.
* :mod:`~tito_core.analysis.prefix_check`: whether a chat template's incremental render equals its full render
  (``python -m tito_core.analysis.prefix_check``).
"""
