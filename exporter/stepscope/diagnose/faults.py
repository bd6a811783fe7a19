"""Hardware health: the faults that outrank every performance verdict.

A GPU is faulted when it is down (stopped answering NVML), logged a critical XID
(kept for ``fault_hold`` seconds, or until the GPU is seen reset), has an uncorrectable
ECC error since the driver loaded, a pending or failed row remap, or a PCIe replay
storm. Which XIDs are critical, and what to do about each, follows NVIDIA's XID
catalogue (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, the
"Resolution Bucket (Immediate Action)" column): the codes whose immediate action is a
GPU reset, a node reboot, or a reset/reboot workflow (48, 74) are critical; those whose
action is "restart the application" or "ignore" are not (13, 31, 43, 45, 63, 92, 94...).

:func:`gpu_faults` is pure (a GPU over the window, plus the XID it holds);
:class:`FaultTracker` is the state the diagnosis keeps across passes so that a critical
XID outlives the window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stepscope.core.snapshot import Snapshot
from stepscope.diagnose.fleet_rules import FLEET
from stepscope.diagnose.thresholds import Thresholds
from stepscope.gpu.model import GPU_PART, GpuState


@dataclass(frozen=True)
class XidKind:
    """One XID code: NVIDIA's description, its immediate action and what we advise."""

    description: str
    action: str  # NVIDIA's resolution bucket (immediate action)
    advice: str


_RESET = "Drain the GPU's work and reset it (nvidia-smi -r -i <gpu>, or reboot the node)"
_RESET_RMA = _RESET + "; if it recurs after the reset, contact the hardware vendor (RMA)."

# What the catalogue says of the codes whose immediate action is RESET_GPU, RESTART_BM
# (reboot the node) or a workflow that ends in a reset (48, 74, the NVLink5 codes).
_DRAIN_KINDS: Mapping[int, XidKind] = {
    46: XidKind("GPU stopped processing", "RESET_GPU", _RESET_RMA),
    48: XidKind("double-bit ECC error", "WORKFLOW_XID_48",
                _RESET + " to clear the uncorrectable error; the job on it may have "
                "computed on corrupt memory. Replace the GPU if it recurs."),
    62: XidKind("internal micro-controller halt", "RESET_GPU", _RESET_RMA),
    64: XidKind("row remapping failure", "RESET_GPU",
                _RESET + "; the memory could not be remapped: contact the vendor (RMA)."),
    74: XidKind("NVLink error", "WORKFLOW_NVLINK_ERR",
                _RESET + "; check `nvidia-smi nvlink -e`. It can be sympathetic to a failed "
                "peer GPU on the same link: look at the node's other GPUs first."),
    79: XidKind("GPU has fallen off the bus", "RESTART_BM",
                "Drain the node and reboot it: a GPU off the PCIe bus cannot be reset in "
                "place. Check the kernel log for PCIe (AER) errors; if it falls off again, "
                "replace the GPU or its riser (RMA)."),
    95: XidKind("uncontained memory error", "RESET_GPU",
                _RESET + " before any application restarts on it."),
    109: XidKind("context switch timeout", "RESET_GPU", _RESET_RMA),
    110: XidKind("security fault", "RESET_GPU",
                 "Drain the node, revert recent hardware changes and cold-reset the system; "
                 "contact the vendor if it persists."),
    119: XidKind("GSP RPC timeout", "RESET_GPU",
                 _RESET + "; if it recurs after a power cycle, update the driver."),
    120: XidKind("GSP error", "RESET_GPU",
                 _RESET + "; if it recurs after a power cycle, update the driver."),
    136: XidKind("NVLink link training failed", "RESET_GPU", _RESET_RMA),
    140: XidKind("unrecovered ECC error", "RESET_GPU", _RESET_RMA),
    143: XidKind("GPU initialization error", "RESET_GPU", _RESET_RMA),
    **{code: XidKind("NVLink5 error", "WORKFLOW_NVLINK5_ERR", _RESET_RMA)
       for code in range(144, 151)},
    155: XidKind("NVLink link down (software defined)", "RESET_GPU", _RESET + "."),
    156: XidKind("resource retirement event", "RESET_GPU", _RESET + " to retire it."),
    158: XidKind("GPU fatal timeout", "RESET_GPU", _RESET_RMA),
}  # fmt: skip

# The critical codes: the fleet's drain_xids, the codes StepscopeGpuXidDrain pages for, so
# that the alert and the node's gpu_fault never disagree. A code added there that the
# table above does not describe is held all the same, with the generic advice.
CRITICAL_XIDS: Mapping[int, XidKind] = {
    code: _DRAIN_KINDS.get(
        code, XidKind("listed in drain_xids", "see NVIDIA's XID catalogue", _RESET_RMA))
    for code in FLEET.drain_xids
}

# Common codes that do not need the GPU drained: evidence only.
NOTED_XIDS: Mapping[int, str] = {
    13: "graphics engine exception: usually the application (out-of-bounds access)",
    31: "GPU memory page fault: usually the application (illegal address)",
    43: "GPU stopped processing: the application hit a fault and was stopped; "
        "the GPU is healthy",
    45: "preemptive cleanup: a process was killed or reset (look for other XIDs)",
    63: "a memory row was marked for remapping (applied at the next GPU reset)",
    92: "high single-bit ECC error rate (corrected; trend it)",
    94: "contained memory error: restart the affected application, reset the GPU "
        "when convenient",
    154: "the driver's recommended recovery action changed (see the other XIDs)",
}  # fmt: skip


@dataclass(frozen=True)
class HeldXid:
    """A critical XID held against a GPU: the code and when (monotonic) it was seen."""

    xid: int
    since: float


@dataclass(frozen=True)
class Fault:
    """One hardware fault of a GPU: its modifier, the evidence and what to do."""

    modifier: str
    evidence: str
    action: str


def _span(window: Sequence[tuple[float, GpuState]], slow_interval: float) -> float:
    # a slow-tier counter (PCIe replays) moves only every slow_interval: a window shorter
    # than that would turn one step of the counter into an inflated rate
    return max(window[-1][0] - window[0][0], slow_interval) if window else 0.0


def gpu_faults(
    states: Sequence[tuple[float, GpuState]],
    held: HeldXid | None,
    now: float,
    slow_interval: float,
    th: Thresholds,
) -> tuple[Fault, ...]:
    """The faults of one GPU, most urgent first; ``states`` (monotonic, state) oldest first."""
    latest = states[-1][1]
    faults: list[Fault] = []
    if not latest.up:
        faults.append(Fault(
            "gpu_down",
            "the GPU is down: it stopped answering NVML (fell off the bus or lost); "
            "no reading of it is current",
            "Drain the node and reset the GPU (nvidia-smi -r) or reboot; if it does not "
            "come back, or falls off again, replace it (RMA).",
        ))  # fmt: skip
    if held is not None:
        kind = CRITICAL_XIDS.get(held.xid)
        description = kind.description if kind else "critical"
        faults.append(Fault(
            "xid_critical",
            f"XID {held.xid} ({description}) {now - held.since:.0f} s ago; NVIDIA's "
            f"immediate action: {kind.action if kind else 'RESET_GPU'}. Held for "
            f"{th.fault_hold:.0f} s unless the GPU is seen reset",
            kind.advice if kind else _RESET_RMA,
        ))  # fmt: skip
    values = latest.values
    if values.get("row_remap_failure", 0.0) >= 1:
        faults.append(Fault(
            "row_remap_failed",
            "row remapping failed: no spare memory rows are left",
            "Drain the GPU and replace it (RMA): it can no longer retire failing memory.",
        ))  # fmt: skip
    dbe = values.get("ecc_dbe_vol_total", 0.0)
    if dbe > 0:
        faults.append(Fault(
            "ecc_uncorrectable",
            f"{dbe:.0f} uncorrectable (double-bit) ECC error(s) since the driver loaded",
            "Drain the GPU and reset it; the job on it may have computed on corrupt "
            "memory. Replace the GPU if it recurs.",
        ))  # fmt: skip
    if values.get("row_remap_pending", 0.0) >= 1:
        faults.append(Fault(
            "row_remap_pending",
            "a memory row remap is pending a GPU reset",
            "Drain the GPU and reset it (nvidia-smi -r) to apply the remap.",
        ))  # fmt: skip
    replays = [(t, s.values["pcie_replay"]) for t, s in states if "pcie_replay" in s.values]
    if len(replays) >= 2:
        span = _span(states, slow_interval)
        per_minute = max(0.0, replays[-1][1] - replays[0][1]) / span * 60 if span > 0 else 0.0
        if per_minute >= th.pcie_replays_per_minute > 0:
            faults.append(Fault(
                "pcie_replay_storm",
                f"{per_minute:.0f} PCIe replays per minute (limit "
                f"{th.pcie_replays_per_minute:g}, DCGM's health check): the link is "
                "retrying transfers",
                "Reseat or replace the GPU's riser/cable and check the slot; drain the "
                "node if it persists (a flaky link slows every copy and can drop the GPU "
                "off the bus).",
            ))  # fmt: skip
    return tuple(faults)


def noted_xids(first: GpuState, last: GpuState) -> list[str]:
    """Evidence lines for non-critical XIDs the GPU logged between two states."""
    out = []
    for code, count in sorted(last.xid_counts.items()):
        new = count - first.xid_counts.get(code, 0)
        if new > 0 and code not in CRITICAL_XIDS:
            what = NOTED_XIDS.get(code, "see NVIDIA's XID catalogue")
            out.append(f"XID {code} x{new} in the window: {what}")
    return out


class FaultTracker:
    """The critical XIDs held against each GPU, across passes (sampler thread only).

    A critical XID is held from the pass that first counts it until ``fault_hold``
    seconds have passed or the GPU is seen reset: it was seen down and answers again,
    its volatile ECC counters went back (they clear on a reset), or a pending row
    remap cleared (remaps are applied at a reset). Per pass: O(GPUs).
    """

    def __init__(self) -> None:
        self._counts: dict[str, Mapping[int, int]] = {}
        # up, volatile ECC count, remap pending: the last seen (None: not read)
        self._seen: dict[str, tuple[bool, float | None, float | None]] = {}
        self._held: dict[str, HeldXid] = {}

    def update(self, snapshot: Snapshot, hold: float) -> Mapping[str, HeldXid]:
        """Fold in ``snapshot``; the XIDs held now, by GPU UUID."""
        part = snapshot.part(GPU_PART)
        now = snapshot.monotonic
        for gpu in part.gpus if part is not None else ():
            uuid = gpu.info.uuid
            values = gpu.values
            vol = None
            if "ecc_dbe_vol_total" in values or "ecc_sbe_vol_total" in values:
                vol = values.get("ecc_dbe_vol_total", 0.0) + values.get("ecc_sbe_vol_total", 0.0)
            pending = values.get("row_remap_pending")
            before = self._seen.get(uuid)
            if before is not None and uuid in self._held:
                was_up, was_vol, was_pending = before
                # a counter compares only with a reading of it: one failed getter is no reset
                went_back = (vol is not None and was_vol is not None and vol < was_vol) or (
                    pending is not None and was_pending is not None and pending < was_pending)
                if (not was_up and gpu.up) or (gpu.up and was_up and went_back):
                    del self._held[uuid]  # the GPU was reset: the XID is dealt with
            if gpu.up or before is None:
                self._seen[uuid] = (gpu.up, vol, pending)
            else:  # down: no values; remember it was down, keep the last counters
                self._seen[uuid] = (False, before[1], before[2])
            counts = self._counts.get(uuid, {})
            for code, n in gpu.xid_counts.items():  # a handful of codes at most
                if code in CRITICAL_XIDS and n > counts.get(code, 0):
                    self._held[uuid] = HeldXid(code, now)
            self._counts[uuid] = gpu.xid_counts
        for uuid, held in list(self._held.items()):
            if now - held.since >= hold:
                del self._held[uuid]
        return dict(self._held)
