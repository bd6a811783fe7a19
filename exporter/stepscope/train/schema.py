"""The ingest datagram schema, version 1: what a training rank sends per step.

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
=================  ========  ==================================================

Phases: ``data + compute + comm <= dur`` (up to rounding); the rest of the step is
``other``. Unknown keys are ignored (forward compatibility within a version); a
different ``v`` is rejected.
"""

from __future__ import annotations

import re

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
PHASES = ("data_wait", "compute", "comm", "other")

DEFAULT_INGEST = "unix:///run/stepscope/ingest.sock"
INGEST_ENV = "STEPSCOPE_INGEST"
