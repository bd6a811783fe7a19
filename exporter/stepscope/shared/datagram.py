"""The ingest datagram, schema version 1: the one definition both sides use.

A training rank (the SDK, :mod:`stepscope.train`) encodes one datagram per step with
:class:`StepEncoder`; the exporter's ingest validates it with :func:`parse_datagram`.
Standard library only, and importing it imports nothing else of stepscope, so the
SDK stays light and the ingest never loads the SDK.

One UTF-8 JSON object per datagram, at most :data:`MAX_DATAGRAM_BYTES` bytes, sent
fire-and-forget to the node's exporter (Unix datagram socket by default, UDP on
loopback as an option). This module is the single definition both sides use: the
SDK (:mod:`stepscope.train`) encodes it, the exporter's ingest validates it. It is
standard library only, like the SDK.

Fields of a ``"type": "step"`` datagram (``*`` = required):

=================  ========  ==================================================
key                type      meaning
=================  ========  ==================================================
``v`` *           int       schema version, :data:`SCHEMA_VERSION`
``type`` *        str       ``"step"``
``job`` *         str       job name, label-safe (:data:`LABEL_VALUE_RE`)
``rank`` *        int       global rank, 0 <= rank < :data:`MAX_RANK`
``local_rank`` *  int       rank on this node, 0 <= local_rank < 1024
``world_size``    int       ranks in the job, >= 1
``pid``           int       the rank's process id (for host-side diagnosis)
``uuid``          str       the rank's GPU UUID (``GPU-...``) when CUDA is used
``step`` *        int       optimizer step number, >= 0
``warmup``        bool      true for the first ``warmup_steps`` steps
``t`` *           float     Unix time the step ended
``dur`` *         float     step wall time, seconds, 0 < dur <= MAX_STEP_SECONDS
``data``          float     of which waiting for the next batch, seconds
``compute``       float     of which computing (forward, backward, optimizer)
``comm``          float     of which exposed communication (waiting on all-reduce)
``tokens``        int       tokens processed by this rank in this step, >= 0
``flops``         float     model FLOPs of this rank in this step, >= 0
``precision``     str       ``bf16`` | ``fp16`` | ``tf32`` | ``fp32`` | ``fp8``
``dropped``       int       datagrams this rank failed to send so far
``nccl_transport`` str      the network NCCL chose for the rank, once known:
                            one of :data:`NCCL_TRANSPORTS` (opt-in in the SDK)
``spans``         object    seconds of named spans between steps (checkpoint,
                            evaluation, ...) that ended since the previous
                            step: ``{"checkpoint": 1.02}``; keys outside
                            :data:`SPANS` count as ``other``; part of ``other``
``group``         str       the rank's group of peers in its job (a pipeline
                            stage, a role): label-safe, at most
                            :data:`MAX_GROUP_LENGTH`; ranks compare within it
=================  ========  ==================================================

A ``"type": "tail"`` datagram carries the named spans a rank ran after its last step (a
final checkpoint save or evaluation), which no step follows to carry them: the same
fields, ``step`` the number of the last step, ``dur`` the seconds from that step's end to
the last span's end, ``spans`` their seconds, no phases (it is all between steps). The SDK
sends it once, when the reporter closes (at exit too); an exporter older than it rejects
it (reason ``type``), so that time stays unexplained there, as before.

Phases: ``data + compute + comm <= dur`` (up to rounding); the rest of the step is
``other``. Unknown keys are ignored (forward compatibility within a version: an exporter
older than ``nccl_transport`` or ``spans`` accepts datagrams carrying them); a different
``v`` is rejected. The named ``spans`` are clamped to the step's ``other`` (they are
timed on the host clock, ``other`` may come from CUDA events).

Validation is the per-datagram hot path (target: 50,000 datagrams/s on one core with
the socket and the aggregation included), so checks are plain ``type() is`` tests and
comparisons rather than a schema library. Every bad datagram is rejected under exactly
one reason from :data:`REJECT_REASONS`, a small fixed set, so
``stepscope_ingest_rejected_total{reason}`` stays low-cardinality.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import socket
from dataclasses import dataclass
from typing import Any, NamedTuple

SCHEMA_VERSION = 1
MAX_DATAGRAM_BYTES = 4096
MAX_RANK = 1 << 20
MAX_LOCAL_RANK = 1024
MAX_STEP_SECONDS = 86400.0
MAX_LABEL_LENGTH = 128
# Label values we accept from a training process: printable, no quotes or
# backslashes, no whitespace: safe in every exposition and PromQL selector.
LABEL_VALUE_RE = re.compile(r"\A[A-Za-z0-9_.:/@+=-]{1,128}\Z")
PRECISIONS = ("bf16", "fp16", "tf32", "fp32", "fp8")
# What NCCL's network can be, in the words of `stepscope nccl-check`
# (stepscope.shared.nccl_log): EFA or another libfabric provider through aws-ofi-nccl,
# InfiniBand/RoCE verbs, TCP sockets. A closed set: the exporter serves it as a label.
NCCL_TRANSPORTS = ("efa", "ib", "libfabric", "socket")
PHASES = ("data_wait", "compute", "comm", "other")
# Named spans of the time between steps (``StepReporter.phase(name)``): a closed set,
# since the exporter serves them as a label value; any other name counts as "other".
SPANS = ("checkpoint", "evaluation", "logging", "other")
MAX_SPAN_KEYS = 16  # keys in one datagram's "spans" object (a bound on parsing work)
# A rank's group (StepReporter(group=...)): a label value on its series, fixed for the
# rank like its other identity labels; short, since it sits on every series of the rank.
MAX_GROUP_LENGTH = 64


class Phases(NamedTuple):
    """Seconds of a step (or a sum of steps) by phase; field order is :data:`PHASES`."""

    data_wait: float = 0.0
    compute: float = 0.0
    comm: float = 0.0
    other: float = 0.0


DEFAULT_INGEST = "unix:///run/stepscope/ingest.sock"
INGEST_ENV = "STEPSCOPE_INGEST"


# ------------------------------------------------------------------- the ingest URL

# A Unix socket path must fit sun_path (108 bytes on Linux, with its NUL).
MAX_UNIX_PATH_BYTES = 107
_URL_FORMS = "expected unix:///PATH or udp://HOST:PORT"
_HOST_RE = re.compile(r"\A[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?\Z")


class IngestURLError(ValueError):
    """An ingest URL outside the grammar; the message says what is wrong (not the URL)."""


@dataclass(frozen=True)
class IngestAddress:
    """A parsed ingest URL: where ranks send and the exporter listens.

    ``family`` is ``AF_UNIX``, ``AF_INET`` or ``AF_INET6``; ``address`` the socket
    address (a path, or ``(host, port)``); ``url`` the URL as given.
    """

    family: int
    address: str | tuple[str, int]
    url: str

    @property
    def is_unix(self) -> bool:
        """Whether this is a Unix socket (the authenticated transport)."""
        return self.family == socket.AF_UNIX

    @property
    def is_loopback(self) -> bool:
        """For UDP: the host is a loopback literal or ``localhost``; True for Unix."""
        if isinstance(self.address, str):
            return True
        host = self.address[0]
        if host.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False


def parse_ingest_url(url: str) -> IngestAddress:
    """Parse an ingest URL, the one grammar of the SDK and the exporter.

    - ``unix:///ABSOLUTE/PATH``: nothing between ``//`` and the path (``unix://run/x``
      would otherwise silently mean ``/x``), no ``?`` or ``#`` anywhere (they would
      silently cut the path), no NUL, a file name at the end, at most
      :data:`MAX_UNIX_PATH_BYTES` bytes. The path is taken literally (no
      percent-decoding).
    - ``udp://HOST:PORT``: HOST an IPv4 address, ``[IPv6]`` or a DNS name; PORT
      1-65535; nothing else (no user, path, query or fragment).

    Raises :class:`IngestURLError` (a ``ValueError``) saying what is wrong.
    """
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("unix", "udp"):
        raise IngestURLError(f"{_URL_FORMS} (the scheme must be unix:// or udp://)")
    if "?" in rest or "#" in rest:
        raise IngestURLError(f"an ingest URL takes no query or fragment ('?' or '#'); {_URL_FORMS}")
    if scheme == "unix":
        return IngestAddress(socket.AF_UNIX, _unix_path(rest), text)
    return _udp(rest, text)


def _unix_path(rest: str) -> str:
    if not rest:
        raise IngestURLError("expected unix:///PATH, an absolute path")
    if not rest.startswith("/"):
        host, _, tail = rest.partition("/")
        raise IngestURLError(
            f"unix:// takes no host part ({host!r} would be dropped and /{tail} used); "
            f"write the absolute path after three slashes: unix:///{rest}"
        )
    if "\0" in rest:
        raise IngestURLError("the socket path contains a NUL character")
    name = rest.rsplit("/", 1)[1]
    if name in ("", ".", ".."):
        raise IngestURLError(f"the socket path {rest!r} must end in a file name")
    size = len(rest.encode("utf-8", "surrogateescape"))
    if size > MAX_UNIX_PATH_BYTES:
        raise IngestURLError(
            f"the socket path is {size} bytes; a Unix socket path has at most {MAX_UNIX_PATH_BYTES}"
        )
    return rest


def _udp(rest: str, text: str) -> IngestAddress:
    if "/" in rest or "@" in rest:
        raise IngestURLError(f"udp:// takes HOST:PORT only (no user or path); {_URL_FORMS}")
    if rest.startswith("["):
        host, bracket, port_s = rest[1:].partition("]")
        colon, port_s = port_s[:1], port_s[1:]
        try:
            ok = bool(bracket) and ipaddress.ip_address(host).version == 6
        except ValueError:
            ok = False
        if not ok:
            raise IngestURLError("an IPv6 host goes in brackets: udp://[::1]:9401")
        family = socket.AF_INET6
    else:
        host, colon, port_s = rest.rpartition(":")
        family = socket.AF_INET
        if ":" in host:
            raise IngestURLError("an IPv6 host goes in brackets: udp://[::1]:9401")
        if host and _HOST_RE.fullmatch(host) is None:
            raise IngestURLError(f"{host!r} is not a host name or an IPv4 address")
    if not host or not colon or not port_s:
        raise IngestURLError("expected udp://HOST:PORT")
    if not port_s.isascii() or not port_s.isdigit() or not 1 <= int(port_s) <= 65535:
        raise IngestURLError(f"the port must be 1-65535, got {port_s!r}")
    return IngestAddress(family, (host, int(port_s)), text)


# Why a datagram was dropped. Parsing reasons first, then the sender's credentials and
# identity, then the caps, then "internal" (a bug in the exporter; never expected,
# counted rather than raised).
REJECT_REASONS: tuple[str, ...] = (
    "oversize",  # longer than MAX_DATAGRAM_BYTES
    "not_utf8",  # not valid UTF-8
    "not_json",  # not valid JSON
    "not_object",  # valid JSON but not an object
    "version",  # "v" missing or not SCHEMA_VERSION
    "type",  # "type" is not a known datagram type ("step", "tail")
    "missing_field",  # a required field is absent
    "wrong_type",  # a field has the wrong JSON type
    "out_of_range",  # a number is NaN/inf, negative, too large, or phases exceed dur
    "bad_label",  # a label value (job, uuid, precision, nccl_transport, group) is refused
    "not_allowed",  # the sender's uid and gid are not in ingest_allow_uids/_gids
    "bad_pid",  # the pid the datagram reports is not the sender's, per the kernel
    "not_owner",  # the job or rank belongs to another uid, or the rank to another process
    "identity_changed",  # local_rank, pid, world_size, uuid, precision or group differ
    "cap_jobs",  # a new job beyond max_jobs on this node
    "cap_uid",  # a new job of a uid holding its share of max_jobs while other uids report
    "cap_ranks",  # a new rank beyond max_ranks_per_job for its job
    "internal",  # the exporter failed to process it (a bug; logged)
)

# Why a step was accepted with its time changed: its end or its duration is judged
# against the exporter's own clocks (stepscope.ingest.aggregate), never believed as sent.
# Counted in stepscope_ingest_clamped_total{reason}; the step counts as accepted.
CLAMP_REASONS: tuple[str, ...] = (
    "clock_ahead",  # it ended after the exporter received it: its end is the receive time
    "clock_behind",  # it ended long before its rank's previous step, or long before it was
    # received: its end is the receive time
    "longer_than_seen",  # longer than the exporter has seen its rank (since its process
    # started, read from /proc, or since its first datagram): cut to that, phases in proportion
)

DEFAULT_PRECISION = "bf16"
# Phases may exceed dur by measurement rounding: 1 ms relative plus 1 us absolute.
PHASE_TOLERANCE_REL = 1e-3
PHASE_TOLERANCE_ABS = 1e-6
MAX_PID = (1 << 31) - 1
MAX_TOKENS = 1 << 53  # exact in a float counter
MAX_DROPPED = 1 << 53
_PRECISIONS = frozenset(PRECISIONS)
_NCCL_TRANSPORTS = frozenset(NCCL_TRANSPORTS)


@dataclass(frozen=True)
class Limits:
    """What the exporter accepts from training processes (bounds cardinality).

    ``max_label_length`` applies to ``job``, the one free-form label (at most the
    schema's :data:`~stepscope.shared.datagram.MAX_LABEL_LENGTH`, which bounds ``uuid``);
    ``max_jobs`` and ``max_ranks_per_job`` are enforced by the aggregator.
    """

    max_jobs: int = 8
    max_ranks_per_job: int = 64
    max_label_length: int = MAX_LABEL_LENGTH


class StepRecord(NamedTuple):
    """One valid ``step`` datagram, phases filled in (``other`` = the rest of dur)."""

    job: str
    rank: int
    local_rank: int
    step: int
    t: float
    dur: float
    data_wait: float
    compute: float
    comm: float
    other: float
    warmup: bool
    tokens: int
    flops: float
    precision: str
    world_size: int | None
    pid: int | None
    uuid: str | None
    dropped: int
    # None: not reported (the SDK did not opt in, NCCL has not said yet, an older SDK)
    nccl_transport: str | None = None
    # seconds of each of SPANS in this step's ``other`` (clamped to it); None: none named
    spans: tuple[float, ...] | None = None
    # a "tail" datagram: not a step, the named spans after the rank's last step (all of
    # ``dur`` is ``other``)
    tail: bool = False
    # the rank's group of peers (a pipeline stage, a role); None: not reported
    group: str | None = None


class Rejection(NamedTuple):
    """Why a datagram was dropped: one of :data:`REJECT_REASONS`, and a detail for logs."""

    reason: str
    detail: str


class _Reject(Exception):
    """Internal: raised by the field checks, turned into a Rejection."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _int(obj: dict[str, Any], key: str, lo: int, hi: int, default: int | None) -> int | None:
    """An integer field in [lo, hi); bool is not an integer here."""
    value = obj.get(key)
    if value is None:
        if key in obj:
            raise _Reject("wrong_type", f"{key} is null")
        if default is None:
            return None
        return default
    if type(value) is not int:
        raise _Reject("wrong_type", f"{key} must be an integer")
    if not lo <= value < hi:
        raise _Reject("out_of_range", f"{key}={value} outside [{lo}, {hi})")
    return value


def _required_int(obj: dict[str, Any], key: str, lo: int, hi: int) -> int:
    if key not in obj:
        raise _Reject("missing_field", f"{key} is required")
    value = _int(obj, key, lo, hi, None)
    assert value is not None
    return value


def _float(obj: dict[str, Any], key: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    """A finite number in [lo, hi] (or (lo, hi]); missing means 0."""
    value = obj.get(key, 0.0)
    kind = type(value)
    if kind is not float and kind is not int:
        raise _Reject("wrong_type", f"{key} must be a number")
    try:
        v = float(value)
    except OverflowError:  # an integer with hundreds of digits
        raise _Reject("out_of_range", f"{key} is too large") from None
    if not math.isfinite(v) or v > hi or v < lo or (lo_open and v == lo):
        raise _Reject("out_of_range", f"{key}={value!r} out of range")
    return v


def _label(obj: dict[str, Any], key: str, max_length: int) -> str | None:
    value = obj.get(key)
    if value is None:
        if key in obj:
            raise _Reject("wrong_type", f"{key} is null")
        return None
    if type(value) is not str:
        raise _Reject("wrong_type", f"{key} must be a string")
    # fullmatch: the pattern's "$" alone would also accept a trailing newline
    if len(value) > max_length or LABEL_VALUE_RE.fullmatch(value) is None:
        raise _Reject("bad_label", f"{key} is not an accepted label value")
    return value


def _step(obj: dict[str, Any], limits: Limits, tail: bool = False) -> StepRecord:
    for key in ("job", "rank", "local_rank", "step", "t", "dur"):
        if key not in obj:
            raise _Reject("missing_field", f"{key} is required")
    job = _label(obj, "job", limits.max_label_length)
    assert job is not None
    rank = _required_int(obj, "rank", 0, MAX_RANK)
    local_rank = _required_int(obj, "local_rank", 0, MAX_LOCAL_RANK)
    step = _required_int(obj, "step", 0, 1 << 62)
    world_size = _int(obj, "world_size", 1, MAX_RANK + 1, None)
    if world_size is not None and rank >= world_size:
        raise _Reject("out_of_range", f"rank {rank} >= world_size {world_size}")
    pid = _int(obj, "pid", 0, MAX_PID, None)
    uuid = _label(obj, "uuid", MAX_LABEL_LENGTH)
    t = _float(obj, "t", 0.0, 1e11, lo_open=True)
    dur = _float(obj, "dur", 0.0, MAX_STEP_SECONDS, lo_open=True)
    data = _float(obj, "data", 0.0, MAX_STEP_SECONDS)
    compute = _float(obj, "compute", 0.0, MAX_STEP_SECONDS)
    comm = _float(obj, "comm", 0.0, MAX_STEP_SECONDS)
    phases = data + compute + comm
    if phases > dur * (1.0 + PHASE_TOLERANCE_REL) + PHASE_TOLERANCE_ABS:
        raise _Reject("out_of_range", f"phases sum to {phases:g} s > dur {dur:g} s")
    warmup = obj.get("warmup", False)
    if type(warmup) is not bool:
        raise _Reject("wrong_type", "warmup must be true or false")
    tokens = _int(obj, "tokens", 0, MAX_TOKENS, 0)
    flops = _float(obj, "flops", 0.0, 1e30)
    precision = obj.get("precision", DEFAULT_PRECISION)
    if type(precision) is not str:
        raise _Reject("wrong_type", "precision must be a string")
    if precision not in _PRECISIONS:
        raise _Reject("bad_label", "precision is not one of " + ", ".join(PRECISIONS))
    dropped = _int(obj, "dropped", 0, MAX_DROPPED, 0)
    assert tokens is not None and dropped is not None
    transport = obj.get("nccl_transport")
    if transport is not None or "nccl_transport" in obj:
        if type(transport) is not str:
            raise _Reject("wrong_type", "nccl_transport must be a string")
        if transport not in _NCCL_TRANSPORTS:  # a closed set: it becomes a label value
            raise _Reject(
                "bad_label", "nccl_transport is not one of " + ", ".join(NCCL_TRANSPORTS)
            )
    group = _label(obj, "group", MAX_GROUP_LENGTH)
    other = max(0.0, dur - phases)
    raw_spans = obj.get("spans")
    spans = None if raw_spans is None and "spans" not in obj else _spans(raw_spans, other)
    return StepRecord(
        job,
        rank,
        local_rank,
        step,
        t,
        dur,
        data,
        compute,
        comm,
        other,
        warmup,
        tokens,
        flops,
        precision,
        world_size,
        pid,
        uuid,
        dropped,
        transport,
        spans,
        tail,
        group,
    )


_SPAN_INDEX = {name: i for i, name in enumerate(SPANS)}
_OTHER_SPAN = SPANS.index("other")


def _spans(value: Any, other: float) -> tuple[float, ...] | None:
    """The ``spans`` object as seconds per :data:`SPANS`, scaled down to fit ``other``
    when the host-timed spans exceed it; None when it names no time."""
    if type(value) is not dict:
        raise _Reject("wrong_type", "spans must be an object of name to seconds")
    if len(value) > MAX_SPAN_KEYS:
        raise _Reject("out_of_range", f"spans has more than {MAX_SPAN_KEYS} names")
    out = [0.0] * len(SPANS)
    for name, seconds in value.items():
        kind = type(seconds)
        if kind is not float and kind is not int:
            raise _Reject("wrong_type", "a span's seconds must be a number")
        v = float(seconds)
        if not math.isfinite(v) or not 0.0 <= v <= MAX_STEP_SECONDS:
            raise _Reject("out_of_range", "a span's seconds are out of range")
        # a name a newer SDK knows and this exporter does not: time between steps still
        out[_SPAN_INDEX.get(name, _OTHER_SPAN)] += v
    total = sum(out)
    if total <= 0.0:
        return None
    if total > other:
        scale = other / total
        out = [v * scale for v in out]
    return tuple(out)


def parse_datagram(data: bytes, limits: Limits) -> StepRecord | Rejection:
    """Validate one datagram against schema v1; never raises for any input bytes."""
    if len(data) > MAX_DATAGRAM_BYTES:
        return Rejection("oversize", f"{len(data)} bytes > {MAX_DATAGRAM_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return Rejection("not_utf8", "not valid UTF-8")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return Rejection("not_json", "not valid JSON")
    if type(obj) is not dict:
        return Rejection("not_object", "not a JSON object")
    v = obj.get("v")
    if type(v) is not int or v != SCHEMA_VERSION:
        return Rejection("version", f"v={v!r}, expected {SCHEMA_VERSION}")
    kind = obj.get("type")
    if kind != "step" and kind != "tail":
        if kind is None:
            return Rejection("missing_field", "type is required")
        return Rejection("type", "unknown datagram type")
    try:
        return _step(obj, limits, kind == "tail")
    except _Reject as rej:
        return Rejection(rej.reason, rej.detail)


# ---------------------------------------------------------------- encoding (SDK side)

# What the SDK's training thread queues per step, a plain tuple (cheapest to build;
# encoded later on the sender thread): (step, warmup, t, dur, data, compute, comm,
# tokens, flops, spans), spans a ((name, seconds), ...) tuple, empty when none. The
# exporter's parsed form is :class:`StepRecord`.
Spans = tuple[tuple[str, float], ...]
PendingStep = tuple[int, bool, float, float, float, float, float, int, float, Spans]
# The named spans after a rank's last step: (last step's number, t, dur, spans).
PendingTail = tuple[int, float, float, Spans]


class StepEncoder:
    """Turns a :data:`PendingStep` into datagram bytes for one rank.

    What is constant for the rank (its identity, and the NCCL transport once known) is
    JSON-encoded once, here; a new fact means a new encoder, not a cost per step."""

    def __init__(
        self,
        job: str,
        rank: int,
        local_rank: int,
        world_size: int,
        precision: str,
        uuid: str | None = None,
        nccl_transport: str | None = None,
        group: str | None = None,
    ) -> None:
        head: dict[str, object] = {
            "v": SCHEMA_VERSION,
            "type": "step",
            "job": job,
            "rank": rank,
            "local_rank": local_rank,
            "world_size": world_size,
            "pid": os.getpid(),
            "precision": precision,
        }
        if uuid is not None:
            head["uuid"] = uuid
        if nccl_transport is not None:
            head["nccl_transport"] = nccl_transport
        if group is not None:  # once in the rank's constant prefix: nothing per step
            head["group"] = group
        self.prefix = json.dumps(head, separators=(",", ":"))[:-1] + ","
        self.tail_prefix = self.prefix.replace('"type":"step"', '"type":"tail"', 1)

    def encode_tail(self, record: PendingTail, dropped: int) -> bytes:
        """The ``tail`` datagram for ``record``: the named spans after the last step."""
        step, t, dur, spans = record
        named = ",".join(f'"{n}":{v:.6f}' for n, v in spans)
        return (
            f'{self.tail_prefix}"step":{step},"t":{t:.6f},"dur":{dur:.9f},'
            f'"dropped":{dropped},"spans":{{{named}}}}}'
        ).encode()

    def encode(self, record: PendingStep, dropped: int) -> bytes:
        """The datagram for ``record``, ``dropped`` being the rank's count so far.

        Durations are printed to the nanosecond (``%.9f``), so every value is a
        plain JSON number; ``flops`` is finite (checked when the record is made).
        """
        step, warm, t, dur, data, compute, comm, tokens, flops, spans = record
        # names are SDK-checked identifiers: "spans" is plain JSON without escaping
        named = ',"spans":{' + ",".join(f'"{n}":{v:.6f}' for n, v in spans) + "}" if spans else ""
        return (
            f'{self.prefix}"step":{step},"warmup":{"true" if warm else "false"},'
            f'"t":{t:.6f},"dur":{dur:.9f},"data":{data:.9f},"compute":{compute:.9f},'
            f'"comm":{comm:.9f},"tokens":{tokens},"flops":{flops!r},"dropped":{dropped}'
            f"{named}}}"
        ).encode()


# -- the exporter's answer to a refused datagram (Unix socket only) -------------------
# A sender whose socket has an address (the SDK binds its Unix socket to an abstract
# name the kernel picks) gets one short datagram back when the exporter refuses its
# steps, so the training log can say why instead of the steps vanishing. Older SDKs
# send from unbound sockets: the exporter cannot answer them and does not try. UDP is
# never answered (its source address is not authenticated: no reflection).

MAX_REFUSAL_BYTES = 512
REFUSAL_TYPE = "refused"
# What each reason means for the rank that sent it, in the words its log shows.
REFUSAL_HINTS: dict[str, str] = {
    "not_owner": (
        "this job or rank is held by another process (a live one of the same user, or "
        "another user's); a restarted rank takes over once the old process has exited"
    ),
    "identity_changed": (
        "local_rank, pid, world_size, GPU, precision or group differ from this rank's "
        "first step; keep them fixed for a run, or use a new job name"
    ),
    "cap_jobs": "the node already tracks its maximum number of jobs (max_jobs)",
    "cap_uid": "this user holds its share of the node's job slots while others report",
    "cap_ranks": "the job already has max_ranks_per_job ranks on this node",
    "not_allowed": "this user and group are not in ingest_allow_uids / ingest_allow_gids",
    "bad_pid": "the pid in the step is not the sending process's",
}


class Refusal(NamedTuple):
    """Why the exporter refused a rank's step: a reason of :data:`REJECT_REASONS`."""

    reason: str
    job: str | None
    rank: int | None

    def describe(self) -> str:
        """One line for the training log: the reason, whose step, and what it means."""
        who = f"rank {self.rank} of job {self.job!r}" if self.job is not None else "a step"
        hint = REFUSAL_HINTS.get(self.reason, "the datagram was malformed")
        return f"the exporter refuses {who}: {self.reason} ({hint})"


def encode_refusal(reason: str, job: str | None, rank: int | None) -> bytes:
    """The exporter's answer to a refused step (at most :data:`MAX_REFUSAL_BYTES`)."""
    body: dict[str, object] = {"v": SCHEMA_VERSION, "type": REFUSAL_TYPE, "reason": reason}
    if job is not None and rank is not None:
        body["job"], body["rank"] = job, rank
    return json.dumps(body, separators=(",", ":")).encode()[:MAX_REFUSAL_BYTES]


def parse_refusal(data: bytes) -> Refusal | None:
    """The refusal in ``data``, or None for anything else (never raises)."""
    try:
        obj = json.loads(data[:MAX_REFUSAL_BYTES])
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict) or obj.get("type") != REFUSAL_TYPE:
        return None
    reason = obj.get("reason")
    if reason not in REJECT_REASONS:
        return None
    job, rank = obj.get("job"), obj.get("rank")
    if not (isinstance(job, str) and LABEL_VALUE_RE.match(job)) or type(rank) is not int:
        job, rank = None, None
    return Refusal(reason, job, rank)
