"""The rollout core: one model call at a time on tito's own conversation form, recorded as exact tokens.

Parts, each with its own state: :mod:`.sync` (which messages the tokens cover; the one fork),
:mod:`.prompt` (the new prompt ids, the grammar of a forced call), :mod:`.checks` (the engine's answer is
valid before anything is recorded), :mod:`.output` (parse and record), :mod:`.sequence` (the backend
sequence of the live branch) and :mod:`.call` (the call loop, :class:`Rollout`). None of them imports a
front's framework (Strands); :class:`~tito_core.model.TitoModel` and the gateway convert to
:class:`~tito_core.conversation.Conversation`.
"""

from .call import CallOptions, Rollout
from .checks import check_result
from .output import CallResult
from .prompt import PrefixPolicy, RenderMode

__all__ = ["CallOptions", "CallResult", "PrefixPolicy", "RenderMode", "Rollout", "check_result"]
