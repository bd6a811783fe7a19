"""Where a rank is and where it sends: launcher environment, ingest URL, GPU UUID.

Standard library only; torch is looked up in ``sys.modules`` and never imported here.
The ingest URL grammar is the exporter's (:mod:`stepscope.shared.datagram`), so the SDK and
the exporter read every URL the same way (the exporter also wants UDP on loopback).
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stepscope.shared.datagram import (
    INGEST_ENV,
    LABEL_VALUE_RE,
    MAX_GROUP_LENGTH,
    IngestURLError,
    parse_ingest_url,
)

# IngestAddress re-exported: the sender takes it from here
from stepscope.shared.datagram import IngestAddress as IngestAddress

log = logging.getLogger("stepscope.train")

# (rank, local_rank, world_size) variables per launcher, first match wins:
# torchrun / torch.distributed.launch, Slurm's srun, Open MPI's mpirun.
LAUNCHER_ENV: tuple[tuple[str, str, str], ...] = (
    ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
)


@dataclass(frozen=True)
class Placement:
    """A rank's place in its job."""

    rank: int
    local_rank: int
    world_size: int


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip())
    except ValueError:
        log.warning("stepscope: ignoring %s=%r (not an integer)", name, raw)
        return None


def placement_from_env(env: Mapping[str, str]) -> Placement:
    """Rank, local rank and world size from the first launcher family whose rank
    variable is set (torchrun, then Slurm, then Open MPI); else 0, 0, 1."""
    for rank_var, local_var, size_var in LAUNCHER_ENV:
        rank = _env_int(env, rank_var)
        if rank is None:
            continue
        local = _env_int(env, local_var)
        size = _env_int(env, size_var)
        return Placement(rank, local if local is not None else 0, size if size else 1)
    return Placement(0, 0, 1)


def parse_ingest(url: str, origin: str = "ingest") -> IngestAddress:
    """Parse an ingest URL with the exporter's own grammar
    (:func:`stepscope.shared.datagram.parse_ingest_url`); raise ``ValueError`` naming where
    the URL came from (``origin``: the ``ingest`` argument, or ``STEPSCOPE_INGEST``) when
    it is malformed (``TypeError`` when it is not a string).

    Called once, when the reporter is made, never per step: a bad URL is a
    configuration error the job sees at start, not an exception in its loop."""
    if not isinstance(url, str):
        raise TypeError(f"ingest must be a str URL, got {type(url).__name__}")
    try:
        return parse_ingest_url(url)
    except IngestURLError as err:
        fix = (
            f"fix or unset {origin} (it must name the exporter's --ingest)"
            if origin == INGEST_ENV
            else "pass the exporter's --ingest URL"
        )
        raise ValueError(f"stepscope: {origin}={url!r}: {err}; {fix}") from None


def ingest_from(argument: str | None, env: Mapping[str, str], default: str) -> IngestAddress:
    """The reporter's ingest: the argument, else ``$STEPSCOPE_INGEST``, else ``default``;
    an error names the one that was bad."""
    if argument is not None:
        return parse_ingest(argument)
    if env.get(INGEST_ENV):
        return parse_ingest(env[INGEST_ENV], INGEST_ENV)
    return parse_ingest(default)


def cuda_device_uuid(torch: Any, device: int) -> str | None:
    """The UUID of CUDA device ``device`` in NVML's form (``GPU-xxxxxxxx-...``).

    ``torch.cuda.get_device_properties(d).uuid`` prints as the bare UUID; NVML (and
    so dcgm-exporter's ``UUID`` label) prefixes it with ``GPU-`` (``MIG-`` for a MIG
    instance, which CUDA reports already prefixed on some versions)."""
    try:
        cu = torch.cuda.get_device_properties(device).uuid
    except Exception as err:  # old torch without .uuid, or a driver error
        log.debug("stepscope: no GPU UUID for device %s: %s", device, err)
        return None
    try:  # the 16 raw bytes (CUuuid.bytes), independent of how str() prints them
        raw = str(uuid.UUID(bytes=bytes(cu.bytes)))
    except Exception:
        raw = str(cu)
    if raw.startswith(("GPU-", "MIG-")):
        return raw
    return "GPU-" + raw


GROUP_ENV = "STEPSCOPE_GROUP"


def valid_group(value: object) -> bool:
    """Whether ``value`` can name a rank's group: a label-safe string of at most
    :data:`~stepscope.shared.datagram.MAX_GROUP_LENGTH` characters."""
    return (
        isinstance(value, str)
        and len(value) <= MAX_GROUP_LENGTH
        and LABEL_VALUE_RE.fullmatch(value) is not None
    )


def megatron_stage() -> str | None:
    """``stage<k>``: this rank's pipeline stage where Megatron-LM (or Megatron-Core) is
    imported, its model parallelism initialized and the pipeline has more than one
    stage; else None. Never imports, never raises."""
    state = sys.modules.get("megatron.core.parallel_state")
    if state is None:
        return None
    try:
        if not state.model_parallel_is_initialized():
            return None
        if int(state.get_pipeline_model_parallel_world_size()) < 2:
            return None
        return f"stage{int(state.get_pipeline_model_parallel_rank())}"
    except Exception as err:  # another version's API: no group rather than an error
        log.debug("stepscope: no pipeline stage from Megatron: %s", err)
        return None


def group_from_env(env: Mapping[str, str]) -> str | None:
    """The rank's group when the reporter is given none: ``$STEPSCOPE_GROUP`` (a bad
    value is logged and ignored), else Megatron's pipeline stage (:func:`megatron_stage`),
    else None: the whole job is one group."""
    raw = env.get(GROUP_ENV)
    if raw is not None and raw.strip():
        if valid_group(raw.strip()):
            return raw.strip()
        log.warning("stepscope: ignoring %s=%r (1-%d characters of letters, digits and "
                    "_.:/@+=-)", GROUP_ENV, raw, MAX_GROUP_LENGTH)  # fmt: skip
    return megatron_stage()


def loaded_torch() -> Any:
    """torch if the training script already imported it, else None (never imports)."""
    return sys.modules.get("torch")
