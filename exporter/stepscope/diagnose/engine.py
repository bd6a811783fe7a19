"""The verdict rules: pure functions over a window of Snapshots.

The window (:class:`~stepscope.diagnose.window.SnapshotWindow`) comes indexed by rank,
GPU and pid, kept up to date as snapshots arrive and expire, so a pass reads each
subject's views without scanning every snapshot. For each training rank of the newest
snapshot, the window's first and last view of the rank give the measured steps and
the seconds of each phase (data_wait, compute, comm, other) in between; the rank's GPU
(joined by UUID) and the host give the evidence that tells the causes apart. A GPU
that no rank reported gets a verdict from its own signals. docs/diagnosis.md states
every rule; the thresholds are :class:`~stepscope.diagnose.thresholds.Thresholds`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from stepscope.core.labels import GpuIdentity
from stepscope.core.snapshot import Snapshot
from stepscope.diagnose.advice import advice_for
from stepscope.diagnose.fail_slow import mark_fail_slow
from stepscope.diagnose.faults import Fault, HeldXid, gpu_faults, noted_xids
from stepscope.diagnose.finished import FinishedRank
from stepscope.diagnose.losses import COMM, DATA, LOSS_WORDS, lost_shares
from stepscope.diagnose.lost_time import (
    between_steps_verdict,
    gpu_busy_between_steps,
    stalls,
    transfer_bound_why,
    unnamed_share,
)
from stepscope.diagnose.model import SPAN_MODIFIERS, Diagnosis, Subject, Verdict
from stepscope.diagnose.thresholds import Thresholds
from stepscope.diagnose.window import RankWindow, SnapshotWindow
from stepscope.gpu.fields import POWER_EVENTS, THERMAL_EVENTS
from stepscope.gpu.model import GPU_PART, GpuInfo, GpuState
from stepscope.host.model import HostReading, ProcessReading
from stepscope.ingest.aggregate import INGEST_PART, TrainingView
from stepscope.ingest.mfu import rank_mfu
from stepscope.shared.datagram import PHASES, SPANS

_THERMAL_BITS = int(THERMAL_EVENTS)
_POWER_BITS = int(POWER_EVENTS)
_NO_RANKS = TrainingView(ingest_up=False, accepted=0)
_NO_SIGNALS: Mapping[str, float | None] = {}


def _gpus(snapshot: Snapshot) -> tuple[GpuState, ...]:
    part = snapshot.part(GPU_PART)
    return part.gpus if part is not None else ()


def _gpu(snapshot: Snapshot, uuid: str) -> GpuState | None:
    part = snapshot.part(GPU_PART)
    return part.by_uuid.get(uuid) if part is not None else None


def _training(snapshot: Snapshot | None) -> TrainingView:
    return (snapshot.part(INGEST_PART) if snapshot is not None else None) or _NO_RANKS


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _over_time(pairs: Iterable[tuple[float, float | None]]) -> float | None:
    """The mean of rates or shares, each (seconds it spans, value), weighed by time:
    a reading taken just after the one before spans a jiffy or two and reads all or
    nothing; counted like a full interval it pulled a saturated host's busy share from
    100% to 80% on a loaded 2-CPU machine."""
    total = weight = 0.0
    for seconds, value in pairs:
        if value is not None:
            total += seconds * value
            weight += seconds
    return total / weight if weight > 0 else None


# "12 steps of 0.800 s: data_wait 12%, compute 62%, comm 19%, other 6%" (one format call;
# "{:.0%}" is _pct's "{100 * v:.0f}%" for the shares, never None there)
_STEPS_EVIDENCE = "{} steps of {:.3f} s: " + ", ".join(f"{name} {{:.0%}}" for name in PHASES)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.0f}%"


def _num(v: float | None, fmt: str = ".2f") -> str:
    return "n/a" if v is None else format(v, fmt)


# ---------------------------------------------------------------- GPU evidence


@dataclass(frozen=True)
class GpuWindow:
    """One GPU's signals averaged over the window (None: not measured, or the GPU is
    down now: a down GPU's earlier readings are never shown as current)."""

    info: GpuInfo
    up: bool
    sm_active: float | None
    gpu_util: float | None
    occupancy: float | None
    tensor: float | None
    fp32: float | None
    dram: float | None
    thermal_share: float
    power_share: float
    series: dict[str, Sequence[float | None]]
    faults: tuple[Fault, ...] = ()
    notes: tuple[str, ...] = ()  # non-critical XIDs in the window
    pcie_rx: float | None = None  # bytes/s the GPU received over PCIe (host to device)
    sm_clock: float | None = None  # MHz, mean over the window
    power_limit: float | None = None  # W, the enforced limit now

    # made once per GPU window, however many ranks share the GPU
    @cached_property
    def identity(self) -> GpuIdentity:
        """What names the GPU in labels (and picks its peak FLOP/s)."""
        return self.info.identity

    @cached_property
    def signals(self) -> Mapping[str, float | None]:
        """The GPU's signals in a verdict (only ``gpu_up`` when it is down)."""
        return _signals_of(self)

    @cached_property
    def evidence(self) -> tuple[str, ...]:
        """The GPU's evidence lines in a verdict."""
        return tuple(_evidence_of(self))


def _event_share(states: Sequence[GpuState], bits: int, counter: str, span: float) -> float:
    """Share of the window under these clock events: the bitmask, or the counter's rise."""
    masks = [s.values.get("clocks_event_reasons") for s in states]
    known = [m for m in masks if m is not None]
    by_mask = sum(1 for m in known if int(m) & bits) / len(known) if known else 0.0
    counts = [s.values[counter] for s in states if counter in s.values]
    by_counter = 0.0
    if len(counts) >= 2 and span > 0:
        by_counter = max(0.0, counts[-1] - counts[0]) / 1e9 / span
    return max(by_mask, min(1.0, by_counter))


def gpu_window(
    uuid: str,
    window: SnapshotWindow,
    th: Thresholds | None = None,
    held: HeldXid | None = None,
) -> GpuWindow | None:
    """The GPU ``uuid`` over the window, or None if the newest snapshot lacks it.

    With ``th``, its hardware faults are judged too (``held``: a critical XID the
    diagnosis holds against it beyond the window)."""
    now = window.latest
    if now is None or _gpu(now, uuid) is None:
        return None
    timed = window.gpu_states(uuid)
    latest = timed[-1][1]
    live = [g for _, g in timed if g.up] if latest.up else []
    span = window.span

    def series(key: str) -> tuple[float | None, ...]:
        return tuple(g.values.get(key) for g in live)

    sm = series("sm_active")
    util = series("gpu_util")
    faults: tuple[Fault, ...] = ()
    if th is not None:
        faults = gpu_faults(timed, held, now.monotonic, now.slow_interval, th)
    return GpuWindow(
        info=latest.info,
        up=latest.up,
        sm_active=_mean(sm),
        gpu_util=_mean(util),
        occupancy=_mean(series("sm_occupancy")),
        tensor=_mean(series("pipe_tensor_active")),
        fp32=_mean(series("pipe_fp32_active")),
        dram=_mean(series("dram_active")),
        thermal_share=_event_share(live, _THERMAL_BITS, "thermal_violation", span),
        power_share=_event_share(live, _POWER_BITS, "power_violation", span),
        series={"sm_active": sm, "gpu_util": util},
        faults=faults,
        notes=tuple(noted_xids(timed[0][1], latest)),
        pcie_rx=_mean(series("pcie_rx_bytes")),
        sm_clock=_mean(series("sm_clock")),
        power_limit=live[-1].values.get("enforced_power_limit") if live else None,
    )


def _compute_modifiers(gpu: GpuWindow | None, th: Thresholds) -> tuple[list[str], list[str]]:
    """Modifiers of a compute verdict, with their evidence."""
    mods: list[str] = []
    ev: list[str] = []
    if gpu is None:
        return mods, ev
    fp32, tensor, occ, sm = gpu.fp32, gpu.tensor, gpu.occupancy, gpu.sm_active
    dram = gpu.dram
    memory_bound = (
        dram is not None and tensor is not None and dram >= th.dram_busy > 0
        and tensor < th.tensor_idle
    )  # fmt: skip
    if memory_bound:
        # the DRAM interface, not the math, sets the pace: an FP32 pipe busy beside it is
        # element-wise math in fp32 registers (bf16 upcast), which tensor cores won't take
        mods.append("memory_bound")
        ev.append(
            f"DRAM active {_pct(dram)} while tensor pipes {_pct(tensor)}: the kernels "
            "wait on memory bandwidth (element-wise, normalisation, optimizer)"
        )
    elif (
        fp32 is not None
        and tensor is not None
        and fp32 >= th.fp32_active > 0
        and (tensor < th.tensor_idle)
    ):
        mods.append("fp32_no_tensor")
        ev.append(f"FP32 pipe {_pct(fp32)} active while tensor pipes {_pct(tensor)}")
    if occ is not None and sm is not None and sm >= th.sm_active_busy and (occ < th.low_occupancy):
        mods.append("low_occupancy")
        ev.append(f"SM occupancy {_pct(occ)} while SM active {_pct(sm)}")
    if gpu.thermal_share >= th.throttle_share:
        mods.append("thermal_throttle")
        ev.append(f"thermal slowdown {_pct(gpu.thermal_share)} of the window")
    if gpu.power_share >= th.throttle_share:
        mods.append("power_cap")
        ev.append(f"power capping {_pct(gpu.power_share)} of the window")
    return mods, ev


def _signals_of(gpu: GpuWindow) -> dict[str, float | None]:
    if not gpu.up:  # nothing read now is current: absent, never the last values
        return {"gpu_up": 0.0}
    return {
        "gpu_up": 1.0,
        "sm_active": gpu.sm_active,
        "gpu_util": gpu.gpu_util,
        "sm_occupancy": gpu.occupancy,
        "tensor_active": gpu.tensor,
        "fp32_active": gpu.fp32,
        "dram_active": gpu.dram,
        "thermal_share": gpu.thermal_share,
        "power_share": gpu.power_share,
        "pcie_rx_bytes_per_second": gpu.pcie_rx,
    }


def _evidence_of(gpu: GpuWindow) -> list[str]:
    if not gpu.up:
        return [f"GPU {gpu.info.index} is down: no current reading"]
    return [
        f"GPU {gpu.info.index}: SM active {_pct(gpu.sm_active)}, util "
        f"{_num(gpu.gpu_util, '.0f')}%, occupancy {_pct(gpu.occupancy)}, DRAM "
        f"{_pct(gpu.dram)}",
        *gpu.notes,
    ]


def _gpu_idle(gpu: GpuWindow, th: Thresholds) -> bool:
    return (
        gpu.gpu_util is not None
        and gpu.gpu_util < th.idle_gpu_util
        and (gpu.sm_active is None or gpu.sm_active < th.idle_sm_active)
    )


class _MakeVerdict(Protocol):
    def __call__(
        self, kind: str, mods: Sequence[str] = (), why: Sequence[str] = (), advice: str = ""
    ) -> Verdict: ...


def _verdict_maker(
    subject: Subject,
    ev: list[str],
    signals: Mapping[str, float | None],
    series: Mapping[str, Sequence[float | None]],
) -> _MakeVerdict:
    """A verdict constructor for one subject: its evidence so far plus the rule's ``why``."""

    def verdict(
        kind: str, mods: Sequence[str] = (), why: Sequence[str] = (), advice: str = ""
    ) -> Verdict:
        return Verdict(
            subject,
            kind,
            tuple(mods),
            advice or advice_for(kind, tuple(mods)),
            tuple([*ev, *why]),
            signals,
            series,
        )

    return verdict


def _fault_verdict(gpu: GpuWindow, verdict: _MakeVerdict) -> Verdict:
    """``gpu_fault``: every fault named (a modifier each), the most urgent one's action
    as the advice, each fault's evidence and action in the evidence."""
    # the advice follows the most specific fault: a critical XID's catalogue action
    # (79: reboot, a reset cannot reach it) over the generic one of a GPU that is down
    first = next((f for f in gpu.faults if f.modifier == "xid_critical"), gpu.faults[0])
    rest = [f for f in gpu.faults if f is not first]
    advice = f"Hardware fault on GPU {gpu.info.index} ({first.modifier}): {first.action}"
    if rest:
        advice += " Also: " + ", ".join(f.modifier for f in rest) + "."
    why = [f"{f.modifier}: {f.evidence}" for f in gpu.faults]
    why += [f"{f.modifier}: {f.action}" for f in rest]
    return verdict("gpu_fault", [f.modifier for f in gpu.faults], why, advice)


def gpu_verdict(gpu: GpuWindow, th: Thresholds) -> Verdict:
    """A GPU no rank reported: what its own signals can honestly say."""
    subject = Subject(gpu=gpu.info.index, uuid=gpu.info.uuid, model=gpu.info.name)
    signals = dict(gpu.signals)
    ev = list(gpu.evidence)

    verdict = _verdict_maker(subject, ev, signals, gpu.series)

    if gpu.faults:  # hardware health outranks performance
        return _fault_verdict(gpu, verdict)
    if not gpu.up:
        return verdict("unknown", why=["the GPU is down (stopped answering NVML)"])
    if gpu.gpu_util is None:
        return verdict("unknown", why=["no utilization reading in the window"])
    if _gpu_idle(gpu, th):
        return verdict("idle", why=["no kernel ran and no training rank reports"])
    if gpu.sm_active is None:
        return verdict(
            "unknown",
            why=[
                "no SM activity (GPM profiling unsupported): utilization alone cannot "
                "tell computing from a kernel spinning in a collective"
            ],
        )
    samples = [v for v in gpu.series.get("sm_active", ()) if v is not None]
    if (
        len(samples) >= 4
        and min(samples) <= th.idle_sm_active
        and max(samples) >= th.sm_active_busy
    ):
        # a sawtooth that drops to 0 every step is a GPU waiting for something each
        # step (docs/field-guide.md); a busy average over the window would hide it
        return verdict(
            "unknown",
            why=[
                f"SM activity swings between {_pct(min(samples))} and {_pct(max(samples))} "
                "in the window: a sawtooth that drops to ~0 means the GPU waits for "
                "something every step (data or communication); report steps with "
                "stepscope.train to tell which"
            ],
        )
    if gpu.sm_active >= th.sm_active_busy:
        mods, why = _compute_modifiers(gpu, th)
        return verdict("compute", mods, why)
    return verdict(
        "unknown",
        why=[
            f"the SMs are busy only {_pct(gpu.sm_active)} of the time and no training rank "
            "reports steps: report steps with stepscope.train to tell data from "
            "communication"
        ],
    )


# ---------------------------------------------------------------- rank evidence


@dataclass(frozen=True)
class HostWindow:
    """Host signals over the window, and the rank's process if it could be read.

    ``busy`` and ``cpu_count`` are over the CPUs the rank may use (its affinity, if
    known); ``job_cpu_cores``: the cores its job's ranks and their workers on those CPUs
    use (None: the rank's process is not visible), so the rest of ``busy`` is processes
    outside the job (other jobs, daemons, the exporter)."""

    cpu_count: int
    busy: float | None
    iowait: float | None
    cpu_pressure: float | None
    io_pressure: float | None
    process: ProcessReading | None  # mean over the window's readings of the pid
    job_cpu_cores: float | None = None

    @property
    def job_share(self) -> float | None:
        """Share of the rank's CPUs its job keeps busy."""
        if self.job_cpu_cores is None or self.cpu_count <= 0:
            return None
        return min(1.0, self.job_cpu_cores / self.cpu_count)

    @property
    def outside_share(self) -> float | None:
        """Share of the rank's CPUs that processes outside its job keep busy."""
        job = self.job_share
        if job is None or self.busy is None:
            return None
        return max(0.0, self.busy - job)

    def contended(self, th: Thresholds) -> bool:
        """Saturated CPUs that processes outside the job hold more of than the job."""
        outside, job = self.outside_share, self.job_share
        saturated = self.busy is not None and self.busy >= th.cpu_saturated
        return saturated and outside is not None and job is not None and outside > job

    def cpu_evidence(self) -> str:
        """Who keeps the rank's CPUs busy (the job, or processes outside it)."""
        return (
            f"processes outside the job keep {_pct(self.outside_share)} of the "
            f"{self.cpu_count} CPUs the rank may use busy; the job's ranks and their "
            f"workers {_pct(self.job_share)} ({self.job_cpu_cores or 0.0:.2f} cores)"
        )


class HostWindows:
    """The host over the window for each rank's pid, in one pass: the host-wide figures
    once, each pid's process and each CPU set's busy share once, whatever the ranks."""

    def __init__(self, window: SnapshotWindow) -> None:
        self._window = window
        readings = self._readings = window.host_readings()
        # the first reading's CPU figures are since boot: skip it when there are others
        recent = self._recent = readings[1:] if len(readings) > 1 else readings
        self._iowait = _over_time((h.seconds, h.iowait) for h in recent)
        self._cpu_pressure = _mean(
            [h.cpu_pressure.some_avg10 if h.cpu_pressure else None for h in recent]
        )
        self._io_pressure = _mean(
            [h.io_pressure.some_avg10 if h.io_pressure else None for h in recent]
        )
        self._busy: dict[tuple[int, ...], float | None] = {}
        self._procs: dict[int, ProcessReading | None] = {}
        self._by_pid: dict[int | None, HostWindow | None] = {}

    def _busy_over(self, cpus: tuple[int, ...]) -> float | None:
        """Mean busy share of ``cpus`` (all CPUs if unknown) over the recent readings."""
        if cpus not in self._busy:

            def busy(h: HostReading) -> float:
                mine = [h.cpu_busy[c] for c in cpus if c < len(h.cpu_busy)]
                return sum(mine) / len(mine) if mine and len(mine) < len(h.cpu_busy) else h.busy

            self._busy[cpus] = _over_time((h.seconds, busy(h)) for h in self._recent)
        return self._busy[cpus]

    def _process(self, pid: int) -> ProcessReading | None:
        """The process ``pid`` over the window (rates weighed by time), None if unread."""
        if pid not in self._procs:
            # the first reading of a pid has no CPU baseline yet: skip it
            procs = self._window.process_readings(pid)
            procs = procs[1:] if len(procs) > 1 else procs
            self._procs[pid] = None
            if procs:
                self._procs[pid] = ProcessReading(
                    pid,
                    _over_time((p.seconds, p.cpu_cores) for p in procs) or 0.0,
                    round(sum(p.workers for p in procs) / len(procs)),
                    _over_time((p.seconds, p.workers_cpu_cores) for p in procs) or 0.0,
                    procs[-1].cpus,
                    sum(p.seconds for p in procs),
                )
        return self._procs[pid]

    def job_cores(self, pids: Iterable[int | None]) -> dict[tuple[int, ...], float]:
        """Cores the processes ``pids`` (a job's ranks on this node) and their workers
        use, by the CPU set they may run on."""
        cores: dict[tuple[int, ...], float] = {}
        for pid in pids:
            proc = self._process(pid) if pid is not None else None
            if proc is not None:
                tree = proc.cpu_cores + proc.workers_cpu_cores
                cores[proc.cpus] = cores.get(proc.cpus, 0.0) + tree
        return cores

    def of(
        self, pid: int | None, job: Mapping[tuple[int, ...], float] | None = None
    ) -> HostWindow | None:
        """Host signals over the window with the process ``pid``, None without readings;
        ``job``: :meth:`job_cores` of its job (a pid belongs to one job)."""
        if pid not in self._by_pid:
            self._by_pid[pid] = self._make(pid, job or {})
        return self._by_pid[pid]

    def _make(self, pid: int | None, job: Mapping[tuple[int, ...], float]) -> HostWindow | None:
        readings = self._readings
        if not readings:
            return None
        process = self._process(pid) if pid is not None else None
        # saturation is judged over the CPUs the rank may use (its affinity), if known
        cpus = process.cpus if process is not None else ()
        job_cores = None
        if process is not None:  # the rank itself, whether or not ``job`` names it
            job_cores = job.get(cpus, process.cpu_cores + process.workers_cpu_cores)
        return HostWindow(
            cpu_count=len(cpus) if cpus else readings[-1].cpu_count,
            busy=self._busy_over(cpus),
            iowait=self._iowait,
            cpu_pressure=self._cpu_pressure,
            io_pressure=self._io_pressure,
            process=process,
            job_cpu_cores=job_cores,
        )


def _input_verdict(host: HostWindow | None, th: Thresholds) -> tuple[str, list[str]]:
    """input_cpu / input_io / input / host_contended, with the evidence that decided it."""
    if host is None:
        return "input", ["no host readings: CPU and storage could not be checked"]
    proc = host.process
    ev = [
        f"host CPUs {_pct(host.busy)} busy, iowait {_pct(host.iowait)}, IO pressure "
        f"{_pct(host.io_pressure)}"
    ]
    io_stalled = (host.io_pressure is not None and host.io_pressure >= th.io_pressure) or (
        host.iowait is not None and host.iowait >= th.iowait
    )
    saturated = host.busy is not None and host.busy >= th.cpu_saturated
    if proc is None:
        if io_stalled:
            return "input_io", [*ev, "storage stalls (IO pressure / iowait high)"]
        return "input", [
            *ev,
            "the rank's process is not visible (another PID namespace?): loader workers "
            "unknown, so CPU saturation is not claimed"
            + ("; whether the job or other processes keep the CPUs busy cannot be told: "
               "more workers help only where CPUs are free" if saturated else ""),
        ]  # fmt: skip
    ev.append(
        f"{proc.workers} DataLoader worker(s) using {proc.workers_cpu_cores:.2f} cores, "
        f"main process {proc.cpu_cores:.2f} cores"
    )
    per_worker = proc.workers_cpu_cores / proc.workers if proc.workers else 0.0
    if saturated and not (io_stalled and proc.workers and per_worker < th.worker_blocked):
        # no headroom (unless idle workers wait on storage): whose CPUs are they?
        ev.append(host.cpu_evidence())
        if host.contended(th):
            return "host_contended", [
                *ev,
                "the CPUs are saturated by processes outside the job: the loader waits for "
                "CPU that others hold",
            ]
        if proc.workers:
            return "input_cpu", [*ev, "the CPUs the rank may use have no headroom for more "
                                 "workers: the job's own processes fill them"]  # fmt: skip
    if io_stalled:
        return "input_io", [*ev, "storage stalls (IO pressure / iowait high)"]
    if not proc.workers or (per_worker < th.worker_blocked and proc.cpu_cores >= th.worker_busy):
        # no workers, or children that do nothing while the rank's own process is busy:
        # the batches are made in the training process
        return "input", [*ev, "the batches are made in the training process (num_workers=0)"]
    if per_worker < th.worker_blocked:
        return "input_io", [
            *ev,
            f"workers use only {per_worker:.2f} cores each while the rank waits: they are "
            "blocked reading data, not computing",
        ]
    if per_worker >= th.worker_busy:
        return "input", [*ev, "the workers are CPU-bound but CPUs are free for more of them"]
    return "input", [*ev, "the workers are partly busy and the CPUs have headroom"]


def _rdma_rate(window: SnapshotWindow) -> tuple[int, float | None]:
    """(RDMA ports, bytes/s through all of them over the window)."""
    first, last = window.rdma_ends()
    span = window.span
    if not last or span <= 0:
        return len(last), None
    before = {(p.device, p.port): p.bytes_total for p in first}
    moved = sum(
        max(0.0, p.bytes_total - before[(p.device, p.port)])
        for p in last
        if (p.device, p.port) in before
    )
    return len(last), moved / span


@dataclass(frozen=True)
class JobPeers:
    """The ranks of one job on this node: how many, and the two that compute longest
    per step (enough to find any rank's slowest peer in O(1))."""

    local: int
    slowest: tuple[RankWindow, ...]

    @classmethod
    def of(cls, ranks: Sequence[RankWindow], th: Thresholds) -> JobPeers:
        """The peers of a job's ranks on this node (those with enough steps can lag)."""
        counted = [p for p in ranks if p.steps >= th.min_steps]
        counted.sort(key=lambda p: p.per_step().compute, reverse=True)
        return cls(len(ranks), tuple(counted[:2]))

    def slowest_other(self, rw: RankWindow) -> RankWindow | None:
        """The peer of ``rw`` that computes longest per step, if any."""
        return next((p for p in self.slowest if p is not rw), None)


def rank_verdict(
    rw: RankWindow,
    gpu: GpuWindow | None,
    host: HostWindow | None,
    peers: JobPeers,
    window: SnapshotWindow,
    th: Thresholds,
) -> Verdict:
    """One rank's verdict (rules in docs/diagnosis.md, in this order)."""
    r = rw.view
    subject = Subject(
        job=r.job,
        rank=r.rank,
        local_rank=r.local_rank,
        gpu=gpu.info.index if gpu else None,
        uuid=gpu.info.uuid if gpu else "",
        model=gpu.info.name if gpu else "",
        group=r.identity.group or "",
    )
    peaks = _training(window.latest).settings.peak_flops
    mfu = rank_mfu(r, gpu.identity if gpu else None, peaks).value
    shares = rw.shares()
    signals: dict[str, float | None] = {
        **(gpu.signals if gpu is not None else _NO_SIGNALS),
        "steps": float(rw.steps),
        "step_seconds": rw.dur / rw.steps if rw.steps else None,
        "data_wait_share": shares.data_wait if rw.steps else None,
        "compute_share": shares.compute if rw.steps else None,
        "comm_share": shares.comm if rw.steps else None,
        "other_share": shares.other if rw.steps else None,
        "mfu": mfu,
    }
    if r.world_size is not None:
        signals.update(world_size=float(r.world_size), job_ranks_on_node=float(peers.local))
    if rw.spans is not None and rw.dur > 0:
        for name, seconds in zip(SPANS, rw.spans, strict=True):
            if name in SPAN_MODIFIERS:
                signals[f"{name}_share"] = seconds / rw.dur
    if host is not None:
        signals.update(
            cpu_busy=host.busy,
            cpu_count=float(host.cpu_count),
            iowait=host.iowait,
            io_pressure=host.io_pressure,
            cpu_pressure=host.cpu_pressure,
        )
        if host.process is not None:
            signals.update(
                dataloader_workers=float(host.process.workers),
                dataloader_cpu_cores=host.process.workers_cpu_cores,
                main_cpu_cores=host.process.cpu_cores,
                job_cpu_share=host.job_share,
                outside_cpu_share=host.outside_share,
            )
    history = rw.series.joined(gpu.series) if gpu is not None else rw.series
    ev: list[str] = []
    if rw.steps:
        ev.append(_STEPS_EVIDENCE.format(rw.steps, rw.dur / rw.steps, *shares))
    if gpu is not None:
        ev += gpu.evidence

    verdict = _verdict_maker(subject, ev, signals, history)

    if gpu is not None and gpu.faults:  # hardware health outranks performance
        return _fault_verdict(gpu, verdict)
    if rw.steps < th.min_steps:
        if rw.all_steps == 0:
            if gpu is None or _gpu_idle(gpu, th):
                return verdict("idle", why=["no step completed in the window"])
            return verdict(
                "unknown",
                why=["no step completed in the window while the GPU is busy: a step "
                     "longer than the window, or a hang"],
            )  # fmt: skip
        return verdict(
            "unknown",
            why=[f"only {rw.steps} measured step(s) in the window (need {th.min_steps}); "
                 "warm-up or very long steps"],
        )  # fmt: skip
    _, compute, _, other = shares
    signals["between_steps_share"] = other
    signals["between_steps_intervals"] = float(stalls(rw.series["other"], th))
    lost = lost_shares(signals, th)
    if lost:  # the largest lost share that matters is the verdict (docs/diagnosis.md)
        for also in lost[1:]:
            ev.append(f"also {_pct(signals[also])} of the step {LOSS_WORDS[also]}")
        if lost[0] == DATA:
            kind, why = _input_verdict(host, th)
            return verdict(kind, why=why)
        if lost[0] == COMM:
            return _comm_verdict(rw, peers, window, th, verdict)
        unnamed = unnamed_share(other, rw.spans, rw.dur)
        busy = gpu_busy_between_steps(_kernel_share(gpu), unnamed, th)
        signals["between_steps_gpu_busy"] = busy
        return between_steps_verdict(rw.dur, rw.steps, other, rw.spans, th, verdict, busy)
    if other >= th.between_steps_share:
        # one gap in the window: too large to call the GPU the limit, too rare to judge
        return verdict("unknown", why=[
            f"{_pct(other)} of the step time is outside the timed loader and step body, all "
            "in one gap of the window (a save or evaluation now and then)",
        ])  # fmt: skip
    if compute >= other:
        sm = gpu.sm_active if gpu is not None else None
        if gpu is not None and sm is not None and sm < th.host_bound_sm_active:
            return _idle_body_verdict(gpu, sm, compute, host, th, verdict)
        mods, why = _compute_modifiers(gpu, th)
        if sm is not None and sm < th.sm_active_busy:
            why.append(
                f"compute dominates the step but SM active is only {_pct(sm)}: partly "
                "small kernels or host-bound launches"
            )
        return verdict("compute", mods, why)
    return verdict(
        "unknown",
        why=[f"no phase dominates the step: {_pct(other)} of it is outside the timed loader "
             "and step body (logging, evaluation, checkpoints, or an untimed loader), "
             f"{_pct(compute)} in the step body"],
    )  # fmt: skip


def _kernel_share(gpu: GpuWindow | None) -> float | None:
    """Share of the window the GPU ran kernels (util; SM active without it)."""
    if gpu is None or not gpu.up:
        return None
    return gpu.gpu_util / 100.0 if gpu.gpu_util is not None else gpu.sm_active


def _idle_body_verdict(
    gpu: GpuWindow,
    sm: float,
    compute: float,
    host: HostWindow | None,
    th: Thresholds,
    verdict: _MakeVerdict,
) -> Verdict:
    """The step body dominates while the SMs mostly idle: host-bound, small grids, or
    a body that waits on something that is neither the CPU nor the GPU."""
    util = gpu.gpu_util
    head = f"the step body is {_pct(compute)} of the step while SM active is {_pct(sm)}"
    if util is not None and util >= th.busy_gpu_util:
        # kernels run back to back, each on few SMs: the GPU is the limit, badly filled
        mods, why = _compute_modifiers(gpu, th)
        why.append(
            f"{head} and kernels run {util:.0f}% of the time: small grids leave most "
            "SMs idle; a larger batch or fused kernels fill the GPU"
        )
        return verdict("compute", mods, why)
    copying = transfer_bound_why(gpu.pcie_rx, head, th)
    if copying is not None:
        return verdict("transfer_bound", why=copying)
    proc = host.process if host is not None else None
    if (
        host is not None
        and proc is not None
        and proc.cpu_cores < th.main_cpu_busy
        and (host.contended(th))
    ):
        return verdict("host_contended", why=[
            f"{head}: the GPU idles between kernels",
            host.cpu_evidence(),
            f"the training process gets only {proc.cpu_cores:.2f} cores while processes "
            "outside the job hold the CPUs: it launches kernels when it gets a CPU",
        ])  # fmt: skip
    if proc is None:
        return verdict("host_bound", why=[
            f"{head}: the GPU idles between kernels",
            "the rank's process is not visible (another PID namespace?): its CPU was not "
            "checked, the idle GPU during the step body is the evidence",
        ])  # fmt: skip
    if proc.cpu_cores >= th.main_cpu_busy:
        return verdict("host_bound", why=[
            f"{head}: the GPU idles between kernels",
            f"the training process keeps {proc.cpu_cores:.2f} CPU cores busy launching "
            "kernels and waiting on host syncs (.item(), .cpu()): the CPU feeds the GPU "
            "too slowly",
        ])  # fmt: skip
    return verdict("unknown", why=[
        f"{head} and the training process uses only {proc.cpu_cores:.2f} cores: the step "
        "body waits on something that is neither the GPU nor the CPU (a blocking call, "
        "a lock, I/O inside the step?)",
    ])  # fmt: skip


def _comm_verdict(
    rw: RankWindow,
    peers: JobPeers,
    window: SnapshotWindow,
    th: Thresholds,
    verdict: Callable[..., Verdict],
) -> Verdict:
    r = rw.view
    ours = rw.per_step()
    ours_comm = ours.comm
    worst = peers.slowest_other(rw)
    if worst is not None:
        theirs = worst.per_step().compute
        excess = theirs - ours.compute
        if excess > 0 and excess >= th.peer_excess * ours_comm:
            return verdict(
                "waiting_on_peer",
                why=[
                    f"rank {worst.view.rank} computes {theirs:.3f} s per step, "
                    f"{excess:.3f} s more than this rank, which waits {ours_comm:.3f} s per "
                    "step in all-reduce"
                ],
            )
    why = [f"exposed communication {ours_comm:.3f} s per step"]
    mods: list[str] = []
    local = peers.local
    spans = r.world_size is not None and r.world_size > local
    # NCCL's own choice, when the rank reports it (SDK nccl_transport=True), over inference
    if spans and r.nccl_transport == "socket":
        mods.append("tcp_suspected")
        why.append(
            f"the job spans nodes ({r.world_size} ranks, {local} here) and the rank "
            "reports that NCCL chose TCP sockets"
        )
    elif spans and r.nccl_transport not in ("efa", "ib"):
        ports, rate = _rdma_rate(window)
        if ports == 0:
            mods.append("tcp_suspected")
            why.append(
                f"the job has {r.world_size} ranks, {local} on this node, and this node has "
                "no RDMA device: inter-node traffic goes over TCP"
            )
        elif rate is not None and rate < th.rdma_flat_bytes_per_second:
            mods.append("tcp_suspected")
            why.append(
                f"the job spans nodes ({r.world_size} ranks, {local} here) yet the {ports} "
                f"RDMA port(s) moved only {rate:.0f} B/s while steps advanced"
            )
    return verdict("communication", mods, why)


def finished_verdict(rw: RankWindow, gpu: GpuWindow | None, mark: FinishedRank,
                     now: float) -> Verdict:  # fmt: skip
    """``finished``: the rank's process has ended; its verdict drops out after a linger."""
    r = rw.view
    subject = Subject(
        job=r.job, rank=r.rank, local_rank=r.local_rank,
        gpu=gpu.info.index if gpu else None, uuid=gpu.info.uuid if gpu else "",
        model=gpu.info.name if gpu else "",
    )  # fmt: skip
    return Verdict(
        subject,
        "finished",
        advice=advice_for("finished", ()),
        evidence=(f"{mark.reason} {now - mark.since:.0f} s ago, after {r.steps} steps",),
        signals={"steps": float(rw.steps)},
    )


def diagnose(
    window: SnapshotWindow,
    th: Thresholds,
    held: Mapping[str, HeldXid] | None = None,
    finished: Mapping[tuple[str, int], FinishedRank] | None = None,
) -> Diagnosis:
    """Every verdict for the newest snapshot of ``window``.

    ``held``: critical XIDs held against GPUs (by UUID) beyond the window;
    ``finished``: ranks whose process has ended (by job and rank), kept by the caller
    across passes (:class:`~stepscope.diagnose.analysis.DiagnosisAnalysis`)."""
    latest = window.latest
    if latest is None:
        return Diagnosis(0.0, 0, thresholds=th)
    held = held or {}
    finished = finished or {}
    now = latest.monotonic
    span = window.span
    verdicts: list[Verdict] = []
    by_job: dict[str, list[RankWindow]] = {}
    for rw in window.ranks():
        by_job.setdefault(rw.view.job, []).append(rw)
    claimed: set[str] = set()
    # each GPU's window once per pass, however many ranks share the GPU
    gpu_windows: dict[str, GpuWindow | None] = {}

    def gpu_of(uuid: str | None) -> GpuWindow | None:
        if not uuid:
            return None
        if uuid not in gpu_windows:
            gpu_windows[uuid] = gpu_window(uuid, window, th, held.get(uuid))
        return gpu_windows[uuid]

    hosts = HostWindows(window)
    judged: list[RankWindow] = []  # the ranks with a verdict of their own, not finished
    for ranks in by_job.values():
        live = []
        for rw in ranks:
            mark = finished.get((rw.view.job, rw.view.rank))
            if mark is None:
                live.append(rw)
                continue
            if now - mark.since >= th.finished_linger:
                continue  # dropped out: its GPU is judged on its own again
            gpu = gpu_of(rw.view.uuid)
            if gpu is not None and gpu.faults:
                live.append(rw)  # a fault outranks "finished": the GPU needs attention
                continue
            if gpu is not None:
                claimed.add(gpu.info.uuid)
            verdicts.append(finished_verdict(rw, gpu, mark, now))
        peers = JobPeers.of(live, th)
        job_cores = hosts.job_cores(rw.view.proc_pid for rw in live)
        judged += live
        for rw in live:
            gpu = gpu_of(rw.view.uuid)
            if gpu is not None:
                claimed.add(gpu.info.uuid)
            host = hosts.of(rw.view.proc_pid, job_cores)
            verdicts.append(rank_verdict(rw, gpu, host, peers, window, th))
    for g in _gpus(latest):
        if g.info.uuid in claimed:
            continue
        gw = gpu_of(g.info.uuid)
        if gw is not None:
            verdicts.append(gpu_verdict(gw, th))
    gpus = [gw for g in _gpus(latest) if (gw := gpu_of(g.info.uuid)) is not None]
    verdicts = mark_fail_slow(verdicts, judged, gpus, th)
    return Diagnosis(span, window.samples, tuple(verdicts), th, latest.timestamp)
