"""The verdicts' vocabulary: their kinds and modifiers, and which of them say time is
leaking. Plain names, importing nothing: the fleet thresholds (which the node's own
thresholds and so the verdicts' model import) render the bottleneck alert from them.
"""

from __future__ import annotations

# Verdict kinds (``stepscope_bottleneck{kind}`` serves a subject's one kind, at 1).
# ``host_contended``: the rank waits for CPU that processes outside its job hold.
# ``gpu_fault`` outranks every performance verdict: a GPU that is down or must be
# drained reads ``gpu_fault`` whatever its steps look like.
KINDS: tuple[str, ...] = (
    "gpu_fault",
    "compute",
    "host_bound",
    "transfer_bound",
    "input_cpu",
    "input_io",
    "input",
    "host_contended",
    "communication",
    "waiting_on_peer",
    "between_steps",
    "idle",
    "finished",
    "unknown",
)
# The hardware faults a ``gpu_fault`` verdict names (one modifier each), most urgent first.
FAULT_MODIFIERS: tuple[str, ...] = (
    "gpu_down",
    "xid_critical",
    "row_remap_failed",
    "ecc_uncorrectable",
    "row_remap_pending",
    "pcie_replay_storm",
)
# The named spans between steps a ``between_steps`` verdict names (one modifier each):
# the SDK's span names (stepscope.shared.datagram.SPANS) but its catch-all "other".
SPAN_MODIFIERS: tuple[str, ...] = ("checkpoint", "evaluation", "logging")
# Qualifiers of a verdict (``stepscope_bottleneck_modifier{modifier}``).
MODIFIERS: tuple[str, ...] = (
    "fp32_no_tensor",
    "low_occupancy",
    "memory_bound",
    "thermal_throttle",
    "power_cap",
    # fail-slow on the node: a rank busier than its group's other ranks here; a loaded
    # GPU clocked under its peers of the same model and power limit
    "straggler",
    "clock_lag",
    "tcp_suspected",
    *SPAN_MODIFIERS,
    "unnamed_gpu_work",
    *FAULT_MODIFIERS,
)
# Kinds that mean "time is leaking" (or the hardware is broken): `stepscope diagnose`
# exits 1 on one of these, or on a thermally throttled GPU (the classic straggler).
BOTTLENECK_KINDS: frozenset[str] = frozenset(
    {"gpu_fault", "host_bound", "transfer_bound", "input_cpu", "input_io", "input",
     "host_contended", "communication", "waiting_on_peer", "between_steps"}
)  # fmt: skip
ALERT_MODIFIERS: frozenset[str] = frozenset(
    {"thermal_throttle", "tcp_suspected", "straggler", "clock_lag"})
