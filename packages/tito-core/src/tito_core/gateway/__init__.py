"""``tito serve``: an OpenAI-compatible gateway that records every rollout token-in/token-out.

A second front on the framework-neutral core (docs/gateway.md): OpenAI chat messages become tito's
:class:`~tito_core.conversation.Conversation`, one :class:`~tito_core.rollout_core.call.Rollout` per gateway
rollout records the exact tokens, and the answer is a standard ``ChatCompletion``.

    gw = Gateway(config, output="rollouts.jsonl")
    base = await gw.start()                 # http://127.0.0.1:PORT
    r = gw.open(task_id="t1")               # an OpenAI client sets base_url=r.base_url
    ...
    record = await gw.finish(r.id, reward=1.0)
    await gw.close()
"""

from .errors import GatewayError
from .registry import GatewayRollout
from .service import Gateway

__all__ = ["Gateway", "GatewayError", "GatewayRollout"]
