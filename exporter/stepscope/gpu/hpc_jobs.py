"""Which HPC (Slurm) job owns which GPU, from dcgm-exporter's job-mapping directory.

The Slurm prolog (deploy/parallelcluster/slurm-prolog.sh) writes one file per GPU
index, named by the index, holding the job id; the epilog removes it. The exporter
reads the directory every pass (a handful of tiny files) and puts ``hpc_job`` on that
GPU's series. Off unless ``hpc_job_dir`` is set: the label makes a new set of series
per job, see docs/deploy/parallelcluster.md for the cardinality cost.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# a job id as a label value: Slurm ids ("4242", "4242_7" array tasks, "4242+1" het jobs)
_JOB_RE = re.compile(r"\A[A-Za-z0-9_.:+-]{1,64}\Z")
_MAX_FILE_BYTES = 4096


def read_hpc_jobs(directory: Path) -> dict[int, str]:
    """GPU index -> job id(s) (several jobs sharing a GPU joined with ``,``).

    A missing directory means no job runs (the prolog creates it): an empty mapping.
    Files that are not named by a GPU index, unreadable, or hold no valid job id are
    skipped. Raises nothing.
    """
    jobs: dict[int, str] = {}
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return jobs
    for entry in entries:
        if not entry.name.isdigit():
            continue  # the prolog's temporary ".N.job" files, anything else
        try:
            with open(entry.path, "rb") as f:
                data = f.read(_MAX_FILE_BYTES)
        except OSError:
            continue
        ids = [line.strip() for line in data.decode("utf-8", "replace").splitlines()]
        valid = sorted({i for i in ids if _JOB_RE.match(i)})
        if valid:
            jobs[int(entry.name)] = ",".join(valid)
    return jobs
