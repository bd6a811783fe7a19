"""The label contract over a whole exposition: 8 simulated GPUs, training ranks (one
without a GPU), hpc jobs, verdicts, every source. No series carries ``job``,
``instance`` or an empty label value; the host label has the one configured name; a GPU
used by a rank carries its training job."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stepscope.attribution.hpc_jobs import HpcJobSource
from stepscope.core.labels import HOST_LABELS
from stepscope.core.sampler import SamplerSettings
from stepscope.diagnose.analysis import DiagnosisAnalysis
from stepscope.gpu.simulated import SimulatedBackend, default_scenario
from stepscope.host.source import HostSource
from stepscope.ingest.aggregate import Aggregator
from stepscope.ingest.source import IngestSource
from stepscope.net.source import RdmaSource
from stepscope.shared.datagram import StepRecord
from tests.support import make_sampler
from tests.support.clocks import ManualClock

# name="value" pairs inside {...}, escapes included
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def exposition(host_label: str, tmp_path: Path) -> str:
    clock = ManualClock(50.0)
    backend = SimulatedBackend(default_scenario(8), hostname="node-7", clock=clock)
    uuids = [d.uuid for d in backend.devices()]
    (tmp_path / "3").write_text("4242\n")
    agg = Aggregator(clock=clock)
    sampler = make_sampler(
        backend,
        hostname="node-7",
        clock=clock,
        sources=[IngestSource(agg), HostSource(), RdmaSource(), HpcJobSource(tmp_path)],
        analyses=[DiagnosisAnalysis()],
    )
    sampler.update(SamplerSettings("node-7", 1.0, 10.0, host_label))
    for second in range(12):
        clock.t += 1
        for rank in range(5):  # ranks 0-3 on GPUs 0-3, rank 4 on the CPU
            agg.add(StepRecord(
                "llm", rank, rank, second, 1.7e9 + clock.t, 0.5, 0.05, 0.4, 0.03, 0.02,
                second < 2, 2048, 1e12, "bf16", 5, None, uuids[rank] if rank < 4 else None, 0,
            ))  # fmt: skip
        text: str = sampler.sample_once().body.decode()
    return text


@pytest.mark.parametrize("host_label", HOST_LABELS)
def test_no_series_carries_job_instance_an_empty_value_or_the_other_host_label(
    host_label: str, tmp_path: Path
) -> None:
    text = exposition(host_label, tmp_path)
    other = next(h for h in HOST_LABELS if h != host_label)
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(series) > 500
    names_seen: set[str] = set()
    for line in series:
        labels = line[line.index("{") + 1 : line.rindex("}")] if "{" in line else ""
        pairs = _PAIR.findall(labels)
        names = [k for k, _ in pairs]
        names_seen.update(names)
        assert "job" not in names and "instance" not in names, line
        assert all(v for _, v in pairs), f"empty label value: {line}"
        assert other not in names, line
        assert len(names) == len(set(names)), f"a label twice: {line}"
    assert {host_label, "training_job", "hpc_job", "gpu", "UUID", "rank"} <= names_seen
    gpu_util = [line for line in series if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    assert len(gpu_util) == 8 and all(f'{host_label}="node-7"' in line for line in gpu_util)


def test_a_gpu_used_by_a_rank_carries_its_training_job_and_only_then(tmp_path: Path) -> None:
    text = exposition("Hostname", tmp_path)
    jobs = {}
    for line in text.splitlines():
        if line.startswith("DCGM_FI_DEV_GPU_UTIL{"):
            pairs = dict(_PAIR.findall(line))
            jobs[pairs["gpu"]] = (pairs.get("training_job"), pairs.get("hpc_job"))
    assert jobs == {
        "0": ("llm", None), "1": ("llm", None), "2": ("llm", None), "3": ("llm", "4242"),
        "4": (None, None), "5": (None, None), "6": (None, None), "7": (None, None),
    }  # fmt: skip
    # the rank without a GPU of this node has no gpu labels at all (not gpu="")
    rank4 = [line for line in text.splitlines()
             if line.startswith("stepscope_steps_total{") and 'rank="4"' in line]  # fmt: skip
    assert len(rank4) == 1 and "gpu=" not in rank4[0] and "UUID=" not in rank4[0]
