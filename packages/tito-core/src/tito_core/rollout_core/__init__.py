"""The rollout core: one model call at a time on tito's own conversation form, recorded as exact tokens.

Its parts each own their state:

- :mod:`~tito_core.rollout_core.sync`: which messages one lineage's tokens cover; how a conversation relates to them.
- :mod:`~tito_core.rollout_core.lineages`: the open lineages of a rollout, and which one each call goes on.
- :mod:`~tito_core.rollout_core.tree`: the branches of a rollout, their numbers, the trajectory handed out.
- :mod:`~tito_core.rollout_core.prompt`: the new prompt ids, the grammar of a forced call.
- :mod:`~tito_core.rollout_core.checks`: the engine's answer is valid before anything is recorded.
- :mod:`~tito_core.rollout_core.output`: parse and record.
- :mod:`~tito_core.rollout_core.sequence`: the backend sequence of one lineage's branch.
- :mod:`~tito_core.rollout_core.call`: the call loop, :class:`Rollout`.

None of them imports a front's framework (Strands); :class:`~tito_core.strands_front.model.TitoModel` and the
gateway convert to :class:`~tito_core.conversation.Conversation`.
"""

from .call import CallOptions, Rollout
from .checks import check_result
from .output import CallResult
from .prompt import PrefixPolicy, RenderMode

__all__ = ["CallOptions", "CallResult", "PrefixPolicy", "RenderMode", "Rollout", "check_result"]
