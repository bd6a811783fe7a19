"""Which HPC (Slurm) job owns which GPU, from dcgm-exporter's job-mapping directory.

The Slurm prolog (deploy/parallelcluster/slurm-prolog.sh) writes one file per GPU
index, named by the index, holding the job id; the epilog removes it. The exporter
reads the directory every pass (a handful of tiny files) and the enrichment stage puts
``hpc_job`` on that GPU's series. Off unless ``hpc_job_dir`` is set: the label makes a
new set of series per job, see docs/deploy/parallelcluster.md for the cardinality cost.

The directory is written by a root prolog but read by a long-lived daemon, so every
entry is treated as hostile: only names of ASCII digits, only regular files (a symlink
is not followed, a FIFO is never opened for a blocking read), at most 4 KiB read. A bad
entry is skipped and counted (``stepscope_collector_errors_total{collector="hpc_jobs"}``),
never fatal.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stepscope.core.labels import GpuIdentity, Pairs
from stepscope.core.source import PartKey, ReadContext, Source

# a job id as a label value: Slurm ids ("4242", "4242_7" array tasks, "4242+1" het jobs)
_JOB_RE = re.compile(r"\A[A-Za-z0-9_.:+-]{1,64}\Z")
_INDEX_RE = re.compile(r"\A[0-9]{1,4}\Z")  # str.isdigit() also accepts "²" and "٣"
_MAX_FILE_BYTES = 4096
_MAX_ENTRIES = 1024


@dataclass(frozen=True)
class HpcJobs:
    """GPU index -> job id(s) (several jobs sharing a GPU joined with ``,``), and the
    entries that were skipped as malformed (name: why)."""

    jobs: Mapping[int, str] = field(default_factory=dict)
    skipped: Sequence[str] = ()


def _read_entry(path: str) -> bytes:
    """At most 4 KiB of a regular file, never following a symlink or blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        return os.read(fd, _MAX_FILE_BYTES)
    finally:
        os.close(fd)


def read_hpc_jobs(directory: Path) -> HpcJobs:
    """The mapping in ``directory``. A missing directory means no job runs (the prolog
    creates it): an empty mapping. Raises nothing."""
    jobs: dict[int, str] = {}
    skipped: list[str] = []
    try:
        with os.scandir(directory) as it:
            entries = [e for _, e in zip(range(_MAX_ENTRIES), it, strict=False)]
    except OSError:
        return HpcJobs()
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            continue  # the prolog's temporary ".N.job" files
        if _INDEX_RE.match(name) is None:
            skipped.append(f"{name!r}: not a GPU index")
            continue
        try:
            data = _read_entry(entry.path)
        except (OSError, ValueError) as exc:
            skipped.append(f"{name!r}: {getattr(exc, 'strerror', None) or exc}")
            continue
        ids = [line.strip() for line in data.decode("utf-8", "replace").splitlines()]
        valid = sorted({i for i in ids if _JOB_RE.match(i)})
        if valid:
            jobs[int(name)] = ",".join(valid)
        elif any(ids):
            skipped.append(f"{name!r}: no valid job id")
    return HpcJobs(jobs, tuple(skipped))


HPC_JOBS_PART: PartKey[HpcJobs] = PartKey("hpc_jobs")


class HpcJobSource(Source[HpcJobs]):
    """Attributes each GPU to the Slurm job(s) running on it (``hpc_job`` label)."""

    key = HPC_JOBS_PART

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def read(self, ctx: ReadContext) -> HpcJobs:
        jobs = read_hpc_jobs(self.directory)
        if jobs.skipped:
            ctx.error(len(jobs.skipped))
        return jobs

    def gpu_labels(self, part: HpcJobs, gpus: Sequence[GpuIdentity]) -> Mapping[str, Pairs]:
        return {g.uuid: (("hpc_job", part.jobs[g.index]),) for g in gpus if g.index in part.jobs}

    def evidence(self, part: HpcJobs) -> Sequence[str]:
        return tuple(f"hpc_job_dir entry skipped: {why}" for why in part.skipped[:5])
