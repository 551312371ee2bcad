"""The Strands front, next to the HTTP fronts (:mod:`tito_core.gateway`): a Strands ``Model`` over the rollout core.

:mod:`~tito_core.strands_front.model` holds :class:`~tito_core.strands_front.model.TitoModel` (Strands' model
interface: conversion, Strands events, the malformed-call guard, structured output) and
:mod:`~tito_core.strands_front.messages` the conversion of Strands messages, system prompt and tool specs into the
core's :class:`~tito_core.conversation.Conversation`. Only these two modules know Strands' message types; this
package imports neither on import (``tito_core.TitoModel`` loads it when first used).
"""
