"""How a gateway worker process talks to its supervisor: a pipe, one request and one reply at a time.

The supervisor is the output's one writer (it holds the output's lock); a worker asks it for sample numbers (so that
``(task_id, sample)`` keys stay unique across workers) and hands it each ended rollout's record, and waits for the
reply before answering its client: a ``finish`` is answered only once its record is written. The pipe is inherited
from the supervisor (no address a neighbour could reach).

:class:`RemoteOutput` is the worker's ``GatewayOutput`` (``tito_core.gateway.output``) over the pipe; a record the
supervisor could not take is kept and sent again, as a local output keeps one it could not write.
"""

from __future__ import annotations

from multiprocessing.connection import Connection

import msgspec

from ..records import GroupAdvantages, Key, Outcome, RecordWriter, RolloutRecord
from .errors import GatewayError
from .journal import Journal
from .output import GatewayOutput

__all__ = ["Channel", "Ready", "Reply", "RemoteOutput", "SampleOf", "WriteRecord", "decode_request", "encode"]


class Ready(msgspec.Struct, frozen=True, tag="ready"):
    """The worker serves at ``base_url``."""

    base_url: str
    pid: int


class SampleOf(msgspec.Struct, frozen=True, tag="sample"):
    """The next sample number of ``task_id`` across the workers, for rollout ``rollout_id``.

    The same rollout id asked again (the door opening it on another worker after the first died before opening it)
    gets the same number.
    """

    task_id: str
    rollout_id: str | None = None


class WriteRecord(msgspec.Struct, frozen=True, tag="write"):
    """Write an ended rollout's record to the output."""

    record: RolloutRecord


class Reply(msgspec.Struct, frozen=True):
    """The supervisor's answer: a sample number, or an error that kept it from doing what was asked."""

    sample: int = 0
    error: str | None = None


Request = Ready | SampleOf | WriteRecord
_ENCODER = msgspec.json.Encoder()
_REQUESTS: msgspec.json.Decoder[Request] = msgspec.json.Decoder(Request)
_REPLY = msgspec.json.Decoder(Reply)


def encode(message: Request | Reply) -> bytes:
    """A message's bytes on the pipe."""
    return _ENCODER.encode(message)


def decode_request(data: bytes) -> Request:
    """A worker's request, from its bytes."""
    return _REQUESTS.decode(data)


class Channel:
    """The worker's end of the pipe: each request waits for its reply (the supervisor answers at once)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def request(self, message: Request) -> Reply:
        """Send ``message`` and return the reply.

        Raises:
            OSError: The supervisor is gone, or it answered with an error (its message).
        """
        try:
            self.conn.send_bytes(encode(message))
            reply = _REPLY.decode(self.conn.recv_bytes())
        except EOFError:
            raise OSError("the gateway supervisor is gone") from None
        if reply.error is not None:
            raise OSError(reply.error)
        return reply


class _SupervisorWriter(RecordWriter):
    """A record writer that hands each record to the supervisor, then journals it as ended."""

    def __init__(self, channel: Channel, journal: Journal | None) -> None:
        self.channel = channel
        self.journal = journal
        self._outcomes: dict[Key, Outcome] = {}
        self._done = set()
        self._advantages = {}

    def write(self, record: RolloutRecord) -> None:
        """Hand the record over; it is in the output when this returns (OSError otherwise)."""
        self.channel.request(WriteRecord(record))
        self._done.add(record.key)
        if self.journal is not None:
            self.journal.ended(record.trajectory.rollout_id)

    def write_advantages(self, entry: GroupAdvantages) -> None:
        """Not used by the gateway (it writes no group advantages)."""
        raise NotImplementedError("a gateway worker writes no group advantages")

    def _remove(self, keys: set[Key]) -> None:
        raise NotImplementedError("a gateway worker removes no records")

    def close(self) -> None:
        """Close the journal (the supervisor reads it once the worker is gone)."""
        if self.journal is not None:
            self.journal.close()


class RemoteOutput(GatewayOutput):
    """A worker's output: records go to the supervisor, sample numbers come from it."""

    def __init__(self, channel: Channel, journal: Journal | None) -> None:
        super().__init__(None)
        self.channel = channel
        self._writer = _SupervisorWriter(channel, journal)

    def next_sample(self, task: str, rollout_id: str | None = None) -> int:
        """The next sample number of ``task``, across every worker of the supervisor (503 when it is gone).

        The supervisor gives a rollout id it has seen the number it gave it (see :class:`SampleOf`).
        """
        try:
            return self.channel.request(SampleOf(task, rollout_id)).sample
        except OSError as exc:
            raise GatewayError(503, f"the gateway cannot open rollouts: {exc}", code="shutting_down") from None
