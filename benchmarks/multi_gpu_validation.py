"""Issue 7: stepscope on every GPU of one host, with a real DDP job and a real straggler.

One script, two modes:

- GPU (default; an ``nvidia-h200-x2/x4/x8`` machine): ``stepscope serve`` on real NVML,
  a DDP job over ``--ranks`` GPUs (default all) with NCCL, one process per GPU, a bf16
  MLP of ~270 MB of gradients so the all-reduce is visible.
- ``--cpu``: the same logic with gloo, ``--ranks`` processes, ``stepscope serve
  --simulate N`` as the exporter; each rank reports a simulated GPU's UUID through
  ``StepReporter(gpu_uuid=...)`` and MFU is against a configured ``STEPSCOPE_PEAK_FLOPS``.

Checks (PASS / FAIL / SKIP each; exit 0 only when none FAILs):

1. labels: every GPU's series distinct (``gpu``, ``UUID``, ``device``, ``pci_bus_id``
   unique across GPUs, one label set per GPU in every ``DCGM_*`` family).
2. bytes (GPU only): NVLink or PCIe bytes/s of every GPU in use above its idle
   baseline during the DDP phase.
3. ddp: per rank, steps received, phases summing to step time, comm measured (> 0),
   MFU served with ``mfu_status="ok"`` and within 15% of FLOPs / step time / peak, the
   rank joined with the GPU it ran on.
4. straggler: one rank sleeps before each backward; ``/api/v1/diagnosis`` and
   ``stepscope diagnose --exporter URL --json`` read ``waiting_on_peer`` for every other
   rank with the slowed rank named in the evidence, and the slowed rank not waiting.
5. rules: the scraped step counters of the straggler phase become a promtool unit test
   of ``deploy/prometheus/rules/stepscope-recording.yml``: the slowed rank's
   ``job_rank:stepscope_straggler_score:ratio`` is the job's unique maximum.
6. nccl: ``stepscope nccl-check`` over the DDP phase's per-rank ``NCCL_DEBUG=INFO`` files
   (SKIP with ``--cpu``: gloo writes no NCCL log).

Writes to ``--out`` (default ``$OUT``): ``multi_gpu_validation.md`` (also printed),
``multi_gpu_validation.json``, ``straggler_rules_test.yml`` with a copy of the rule file
beside it (``cd OUT && promtool test rules straggler_rules_test.yml`` re-runs the rule
check anywhere), and ``raw.tar.gz`` (exporter and rank logs, NCCL logs, scrapes,
diagnosis documents, promtool output). NVLink multicast stays off in every process
started here (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _local import free_port, get, scrape, wait_for_exporter

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "exporter"))
RULES = REPO / "deploy" / "prometheus" / "rules" / "stepscope-recording.yml"

# NVLink multicast can take a shared host's GPUs out of service: off in every child, always.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
SIM_MODEL = "NVIDIA H100 80GB HBM3"  # what `stepscope serve --simulate` reports
SIM_PEAK = 1e12  # configured bf16 peak for the simulated model: CPU-sized, so MFU < 1
WARMUP = 5
JOB_DDP, JOB_SLOW = "mgv-ddp", "mgv-straggler"
PHASES = ("data_wait", "compute", "comm", "other")

Sample = tuple[str, dict[str, str], float]


# -- exposition helpers -------------------------------------------------------------------


def samples(text: str) -> list[Sample]:
    """Every sample of an exposition text as (name, labels, value)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (s.name, dict(s.labels), float(s.value))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]


def rank_values(smp: list[Sample], name: str, job: str, **match: str) -> dict[int, float]:
    return {
        int(lbl["rank"]): v
        for n, lbl, v in smp
        if n == name and lbl.get("job") == job and all(lbl.get(k) == w for k, w in match.items())
    }


def gpu_values(smp: list[Sample], name: str) -> dict[str, float]:
    """UUID -> value of a per-GPU family."""
    return {lbl["UUID"]: v for n, lbl, v in smp if n == name and "UUID" in lbl}


def selector(name: str, labels: dict[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    body = ",".join(f'{k}="{esc(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{body}}}"


# -- the check table ----------------------------------------------------------------------


@dataclass
class Check:
    name: str
    status: str  # PASS, FAIL, SKIP
    detail: str


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def check(self, name: str, ok: bool | None, detail: str) -> None:
        status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        self.checks.append(Check(name, status, detail))
        print(f"[{status}] {name}: {detail}", flush=True)

    def add(self, *lines: str) -> None:
        self.sections.extend(lines)


def table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def fmt(v: float | None, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)


# -- the rank (worker mode) ---------------------------------------------------------------


def worker(args: argparse.Namespace) -> int:
    """One DDP rank: torchrun-style env (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from stepscope.train import StepReporter
    from stepscope.train._env import cuda_device_uuid

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    cuda = not args.cpu
    if cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
        hidden, layers, batch, dtype = 4096, 8, 8192, torch.bfloat16
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        hidden, layers, batch, dtype = 512, 4, 256, torch.float32
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden, bias=False), nn.ReLU()]
    model = DistributedDataParallel(
        nn.Sequential(*mods).to(device, dtype), device_ids=[local] if cuda else None
    )
    n_params = sum(p.numel() for p in model.parameters())
    # bias-free linear layers: 2 FLOPs per weight per row forward, 4 backward
    flops_per_step = 6.0 * n_params * batch
    # On CUDA the SDK finds the rank's GPU itself (what users rely on); the UUID read here
    # only lets the orchestrator check that the exporter joined the rank with that GPU.
    uuid = args.uuid or (cuda_device_uuid(torch, local) if cuda else None)
    rep = StepReporter(
        job=args.job,
        flops_per_step=flops_per_step,
        precision="bf16",
        ingest=args.ingest,
        gpu_uuid=args.uuid or None,
        warmup_steps=WARMUP,
    )
    hooked = rep.watch_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    gen = torch.Generator(device=device).manual_seed(1000 + rank)
    xs = [torch.randn(batch, hidden, device=device, dtype=dtype, generator=gen) for _ in range(4)]
    slow = rank == args.slow_rank and args.delay > 0
    flag = torch.zeros(1, device=device)
    deadline = float("inf")
    step = 0
    t_measured = time.monotonic()
    while True:
        with rep.step(tokens=batch):
            loss = model(xs[step % 4]).float().pow(2).mean()
            if slow:
                time.sleep(args.delay)  # the straggler: late to every backward
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        step += 1
        if step == WARMUP:
            t_measured = time.monotonic()
            deadline = t_measured + args.seconds
            if rank == 0:
                Path(args.started).write_text(str(time.time()))
        if step > WARMUP and step % 5 == 0:  # every rank stops at the same step
            flag.fill_(1.0 if time.monotonic() > deadline else 0.0)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                break
    if cuda:
        torch.cuda.synchronize()
    wall = time.monotonic() - t_measured
    rep.close(timeout=5)
    dist.barrier()
    dist.destroy_process_group()
    result = {
        "rank": rank,
        "local_rank": local,
        "uuid": uuid,
        "steps": rep.steps,
        "dropped": rep.dropped,
        "failed": rep.failed,
        "invalid": rep.invalid,
        "hooked": hooked,
        "n_params": n_params,
        "flops_per_step": flops_per_step,
        "tokens_per_step": batch,
        "measured_wall_s": wall,
        "slow": slow,
        "device": torch.cuda.get_device_name(local) if cuda else "cpu",
    }
    Path(args.result).write_text(json.dumps(result))
    print(json.dumps(result), flush=True)
    return 0


# -- the orchestrator ---------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out
        self.raw = Path(tempfile.mkdtemp(prefix="mgv-raw-"))
        self.tmp = Path(tempfile.mkdtemp(prefix="mgv-"))
        self.ingest = f"unix://{self.tmp}/ingest.sock"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            **MULTICAST_OFF,
            "PYTHONPATH": os.pathsep.join(
                [str(REPO / "exporter"), os.environ.get("PYTHONPATH", "")]
            ).rstrip(os.pathsep),
            "PYTHONUNBUFFERED": "1",
        }
        if args.cpu:
            self.env["STEPSCOPE_PEAK_FLOPS"] = json.dumps({SIM_MODEL: {"bf16": SIM_PEAK}})
        self.exporter: subprocess.Popen[bytes] | None = None
        self.rep = Report()

    # exporter
    def start_exporter(self) -> bool:
        a = self.args
        (self.tmp / "stepscope.yaml").write_text(
            f"interval: 1\ningest: {self.ingest}\nmfu_window: 600\n"
            f"diagnosis: {{window: {a.window}}}\n"
        )
        cmd = [
            sys.executable,
            "-m",
            "stepscope",
            "serve",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--config",
            str(self.tmp / "stepscope.yaml"),
        ]
        if a.cpu:
            cmd += ["--simulate", str(a.ranks)]
        self.rep.data["exporter_cmd"] = " ".join(cmd[1:])
        log = self.raw / "exporter.log"
        self.exporter = subprocess.Popen(
            cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=self.env
        )
        if not wait_for_exporter(self.port, self.exporter, log):
            return False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # a full sampling pass with every GPU in it
            try:
                get(self.url + "/readyz")
                if "stepscope_gpu_info{" in scrape(self.port):
                    return True
            except OSError:
                pass
            time.sleep(0.5)
        return False

    def stop_exporter(self) -> None:
        if self.exporter and self.exporter.poll() is None:
            self.exporter.send_signal(signal.SIGTERM)
            try:
                self.exporter.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.exporter.kill()

    # phase runner
    def run_phase(self, job: str, seconds: float, delay: float,
                  uuids: list[str]) -> dict[str, Any]:  # fmt: skip
        """Launch the ranks, scrape every second, read the diagnosis once the window
        lies inside the measured steps; return scrapes, results and documents."""
        a = self.args
        master = free_port()
        started = self.tmp / f"started-{job}"
        procs: list[subprocess.Popen[bytes]] = []
        for r in range(a.ranks):
            env = {
                **self.env,
                **MULTICAST_OFF,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(master),
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": str(a.ranks),
                "LOCAL_WORLD_SIZE": str(a.ranks),
                "OMP_NUM_THREADS": "1",
            }
            if not a.cpu:
                env["NCCL_DEBUG"] = "INFO"
                env["NCCL_DEBUG_SUBSYS"] = "INIT,BOOTSTRAP,ENV,NET"
                env["NCCL_DEBUG_FILE"] = str(self.raw / f"nccl-{job}-rank{r}.log")
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                "--job",
                job,
                "--ingest",
                self.ingest,
                "--seconds",
                str(seconds),
                "--delay",
                str(delay),
                "--slow-rank",
                str(a.slow_rank),
                "--started",
                str(started),
                "--result",
                str(self.tmp / f"result-{job}-{r}.json"),
            ]
            if a.cpu:
                cmd += ["--cpu", "--uuid", uuids[r]]
            log = (self.raw / f"rank-{job}-{r}.log").open("wb")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
        scrapes: list[tuple[int, str]] = []
        stop = threading.Event()
        t0 = time.monotonic()

        def scraper() -> None:
            i = 0
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    scrapes.append((i, scrape(self.port)))
                i = int(time.monotonic() - t0) + 1  # a late scrape skips its slot
                stop.wait(max(0.0, t0 + i - time.monotonic()))

        th = threading.Thread(target=scraper, daemon=True)
        th.start()
        doc: dict[str, Any] | None = None
        cli: dict[str, Any] = {}
        limit = time.monotonic() + seconds + a.startup_timeout
        while time.monotonic() < limit and any(p.poll() is None for p in procs):
            if (
                doc is None
                and started.exists()
                and time.time() - float(started.read_text() or 0) >= a.window + 2
            ):
                doc = json.loads(get(self.url + "/api/v1/diagnosis"))
                cli = self.diagnose_cli()
            time.sleep(0.2)
        for p in procs:
            if p.poll() is None:  # a hung collective: stop our own ranks
                p.kill()
            p.wait()
        time.sleep(2.5)  # the last datagrams and one more sampling pass
        stop.set()
        th.join()
        scrapes.append((int(time.monotonic() - t0) + 1, scrape(self.port)))
        results = []
        for r in range(a.ranks):
            f = self.tmp / f"result-{job}-{r}.json"
            results.append(json.loads(f.read_text()) if f.exists() else None)
        return {
            "scrapes": scrapes,
            "results": results,
            "codes": [p.returncode for p in procs],
            "diagnosis": doc,
            "cli": cli,
        }

    def diagnose_cli(self) -> dict[str, Any]:
        base = [sys.executable, "-m", "stepscope", "diagnose", "--exporter", self.url]
        js = subprocess.run(
            [*base, "--json"], capture_output=True, text=True, env=self.env, timeout=60
        )
        tx = subprocess.run(base, capture_output=True, text=True, env=self.env, timeout=60)
        try:
            doc = json.loads(js.stdout)
        except ValueError:
            doc = None
        return {
            "rc": js.returncode,
            "doc": doc,
            "text": tx.stdout + tx.stderr,
            "text_rc": tx.returncode,
            "stderr": js.stderr,
        }

    # the checks
    def check_labels(self, text: str) -> list[dict[str, str]]:
        smp = samples(text)
        info = [lbl for n, lbl, _ in smp if n == "stepscope_gpu_info"]
        keys = ("gpu", "UUID", "device", "pci_bus_id")
        problems: list[str] = []
        for k in keys:
            vals = [g.get(k, "") for g in info]
            if "" in vals or len(set(vals)) != len(vals):
                problems.append(f"`{k}` not unique: {vals}")
        per_gpu: dict[str, set[tuple[str, ...]]] = {}
        families = set()
        for n, lbl, _ in smp:
            if n.startswith("DCGM_") and "gpu" in lbl:
                families.add(n)
                per_gpu.setdefault(lbl["gpu"], set()).add(tuple(lbl.get(k, "") for k in keys))
        for gpu, sets in per_gpu.items():
            if len(sets) != 1:
                problems.append(f"gpu {gpu} has {len(sets)} label sets across DCGM_* families")
        dup = [
            n
            for n in families
            if len([1 for m, lbl, _ in smp if m == n])
            != len({lbl.get("gpu") for m, lbl, _ in smp if m == n})
        ]
        if dup:
            problems.append(f"families with two series for one GPU: {sorted(dup)}")
        want = self.args.ranks
        if len(info) < want:
            problems.append(f"{len(info)} GPUs served, {want} needed")
        ok = not problems
        self.rep.check(
            "labels",
            ok,
            (
                f"{len(info)} GPUs, {len(families)} DCGM_* families: "
                "gpu, UUID, device, pci_bus_id unique; one label set "
                "per GPU"
            )
            if ok
            else "; ".join(problems),
        )
        self.rep.add(
            "## 1. Per-GPU series",
            "",
            f"`stepscope_gpu_info` at idle ({len(families)} `DCGM_*` families "
            "checked for one label set per GPU):",
            "",
        )
        self.rep.add(
            *table(
                ["gpu", "UUID", "device", "pci_bus_id", "modelName", "profiling"],
                [
                    [
                        g.get("gpu"),
                        g.get("UUID"),
                        g.get("device"),
                        g.get("pci_bus_id"),
                        g.get("modelName"),
                        g.get("profiling"),
                    ]
                    for g in info
                ],
            ),
            "",
        )
        return info

    def check_bytes(self, idle: list[str], scrapes: list[tuple[int, str]],
                    uuids: list[str]) -> None:  # fmt: skip
        names = (
            "DCGM_FI_PROF_NVLINK_TX_BYTES",
            "DCGM_FI_PROF_NVLINK_RX_BYTES",
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            "DCGM_FI_PROF_PCIE_RX_BYTES",
        )

        def peak(texts: list[str]) -> dict[str, dict[str, float]]:
            best: dict[str, dict[str, float]] = {}
            for t in texts:
                smp = samples(t)
                for n in names:
                    for u, v in gpu_values(smp, n).items():
                        d = best.setdefault(u, {})
                        d[n] = max(d.get(n, 0.0), v)
            return best

        if self.args.cpu:
            self.rep.check(
                "bytes",
                None,
                "skipped with --cpu: simulated GPUs serve made-up "
                "NVLink/PCIe rates, and gloo moves no GPU bytes",
            )
            return
        base, busy = peak(idle), peak([t for _, t in scrapes])
        rows, bad = [], []
        for u in uuids:
            b, d = base.get(u, {}), busy.get(u, {})
            nv_idle = b.get(names[0], 0) + b.get(names[1], 0)
            nv = d.get(names[0], 0) + d.get(names[1], 0)
            pc_idle = b.get(names[2], 0) + b.get(names[3], 0)
            pc = d.get(names[2], 0) + d.get(names[3], 0)
            moved = nv > nv_idle or pc > pc_idle
            if not d:
                bad.append(f"{u}: no NVLink/PCIe series served")
            elif not moved:
                bad.append(f"{u}: no rise over idle")
            rows.append(
                [
                    u,
                    f"{nv_idle / 1e9:.3f}",
                    f"{nv / 1e9:.3f}",
                    f"{pc_idle / 1e9:.3f}",
                    f"{pc / 1e9:.3f}",
                    "yes" if moved else "no",
                ]
            )
        self.rep.check(
            "bytes",
            not bad,
            "NVLink or PCIe bytes/s above idle on every GPU in use" if not bad else "; ".join(bad),
        )
        self.rep.add(
            "### NVLink / PCIe bytes (GB/s, TX+RX; max over idle scrapes vs. over "
            "the DDP phase's scrapes)",
            "",
        )
        self.rep.add(
            *table(["UUID", "NVLink idle", "NVLink DDP", "PCIe idle", "PCIe DDP", "rose"], rows), ""
        )

    def check_ddp(self, ph: dict[str, Any], info: list[dict[str, str]]) -> list[str]:
        a, job = self.args, JOB_DDP
        res = ph["results"]
        smp = samples(ph["scrapes"][-1][1])
        self.rep.data["ddp_results"] = res
        problems: list[str] = []
        if any(r is None for r in res) or any(c != 0 for c in ph["codes"]):
            problems.append(f"rank exit codes {ph['codes']}")
        steps = rank_values(smp, "stepscope_steps_total", job)
        count = rank_values(smp, "stepscope_step_duration_seconds_count", job)
        total = rank_values(smp, "stepscope_step_duration_seconds_sum", job)
        phase = {
            p: rank_values(smp, "stepscope_step_phase_seconds_total", job, phase=p) for p in PHASES
        }
        mfu = rank_values(smp, "stepscope_mfu_ratio", job)
        flops = rank_values(smp, "stepscope_model_flops_total", job)
        peaks = {
            lbl["UUID"]: v
            for n, lbl, v in smp
            if n == "stepscope_gpu_peak_flops" and lbl.get("precision") == "bf16"
        }
        rinfo = {
            int(lbl["rank"]): lbl
            for n, lbl, _ in smp
            if n == "stepscope_training_rank_info" and lbl.get("job") == job
        }
        gpu_of = {g["UUID"]: g["gpu"] for g in info}
        rows = []
        used: list[str] = []
        for r in range(a.ranks):
            rr = res[r] or {}
            lbl = rinfo.get(r, {})
            uuid = rr.get("uuid") or ""
            used.append(uuid)
            n = count.get(r, 0.0)
            tot = total.get(r, 0.0)
            ph_s = {p: phase[p].get(r, 0.0) for p in PHASES}
            expect = (flops.get(r, 0.0) / tot / peaks[uuid]) if tot and uuid in peaks else None
            m = mfu.get(r)
            if steps.get(r) != rr.get("steps"):
                problems.append(
                    f"rank {r}: served {steps.get(r)} steps, rank did {rr.get('steps')}"
                )
            if rr.get("dropped"):
                problems.append(f"rank {r}: {rr['dropped']} steps dropped")
            if not n or abs(sum(ph_s.values()) - tot) > 1e-3 * tot + 1e-6:
                problems.append(f"rank {r}: phases {ph_s} do not sum to {tot}")
            if not ph_s["comm"] > 0 or not rr.get("hooked"):
                problems.append(f"rank {r}: comm not measured (hooked={rr.get('hooked')})")
            if m is None or lbl.get("mfu_status") != "ok" or not 0 < m <= 1:
                problems.append(f"rank {r}: MFU {m}, status {lbl.get('mfu_status')}")
            elif expect is None or abs(m - expect) > 0.15 * expect:
                problems.append(f"rank {r}: MFU {m:.4f} vs FLOPs/step time/peak {expect}")
            if lbl.get("UUID") != uuid or lbl.get("gpu") != gpu_of.get(uuid):
                problems.append(
                    f"rank {r}: joined with {lbl.get('UUID')} / gpu {lbl.get('gpu')}, ran on {uuid}"
                )
            rows.append(
                [
                    r,
                    lbl.get("gpu", "-"),
                    uuid,
                    rr.get("steps", "-"),
                    int(n),
                    fmt(tot / n if n else None),
                    *(f"{100 * ph_s[p] / tot:.1f}%" if tot else "-" for p in PHASES),
                    fmt(ph_s["comm"] / n * 1e3 if n else None, ".2f"),
                    fmt(m),
                    fmt(expect),
                    lbl.get("mfu_status", "-"),
                ]
            )
        if len(set(used)) != len(used):
            problems.append(f"ranks share GPUs: {used}")
        ok = not problems
        self.rep.check(
            "ddp",
            ok,
            (
                f"{a.ranks} ranks: steps, phases (sum = step time), comm > 0,"
                " MFU ok and within 15% of FLOPs/step time/peak, each rank on "
                "its own GPU"
            )
            if ok
            else "; ".join(problems),
        )
        r0 = res[0] or {}
        grad_mb = r0.get("n_params", 0) * (4 if a.cpu else 2) / 1e6
        self.rep.add(
            f"## 2. DDP over {a.ranks} {'processes (gloo)' if a.cpu else 'GPUs (NCCL)'}",
            "",
            f"Model: {r0.get('n_params', 0) / 1e6:.1f} M parameters "
            f"({'fp32, CPU' if a.cpu else 'bf16'}; {grad_mb:.0f} MB of gradients all-reduced "
            f"per step), {r0.get('tokens_per_step')} rows per rank per step, "
            "FLOPs/step = 6 x params x rows = "
            f"{r0.get('flops_per_step', 0):.3e}; {WARMUP} warm-up steps, then "
            f"{a.seconds:.0f} s. MFU is served over `mfu_window: 600` (the whole run) against "
            + (
                f'the configured peak `STEPSCOPE_PEAK_FLOPS={{"{SIM_MODEL}": {{"bf16": '
                f"{SIM_PEAK:g}}}}}`"
                if a.cpu
                else "the GPU's datasheet bf16 peak"
            )
            + "; 'expected' = served `stepscope_model_flops_total` / "
            "`step_duration_seconds_sum` / `stepscope_gpu_peak_flops`.",
            "",
        )
        self.rep.add(
            *table(
                [
                    "rank",
                    "gpu",
                    "UUID",
                    "steps",
                    "measured",
                    "step s",
                    "data_wait",
                    "compute",
                    "comm",
                    "other",
                    "comm ms/step",
                    "MFU served",
                    "MFU expected",
                    "mfu_status",
                ],
                rows,
            ),
            "",
        )
        self.add_verdicts(
            "Verdicts read from `/api/v1/diagnosis` during this phase", ph["diagnosis"], job
        )
        return used

    def add_verdicts(self, title: str, doc: dict[str, Any] | None, job: str) -> None:
        vs = [v for v in (doc or {}).get("verdicts", []) if v["subject"]["job"] == job]
        self.rep.add(f"{title}:", "")
        self.rep.add(
            *table(
                ["subject", "verdict", "evidence"],
                [
                    [
                        v["subject"]["name"],
                        "`" + v["kind"] + "".join(f"+{m}" for m in v["modifiers"]) + "`",
                        "; ".join(v["evidence"]).replace("|", "/"),
                    ]
                    for v in vs
                ],
            ),
            "",
        )

    def verdict_problems(self, doc: dict[str, Any] | None, job: str) -> list[str]:
        a = self.args
        if not doc:
            return ["no diagnosis document"]
        vs = {
            v["subject"]["rank"]: v for v in doc.get("verdicts", []) if v["subject"]["job"] == job
        }
        problems = []
        for r in range(a.ranks):
            v = vs.get(r)
            if v is None:
                problems.append(f"rank {r}: no verdict")
            elif r == a.slow_rank:
                if v["kind"] in ("waiting_on_peer", "communication"):
                    problems.append(f"slowed rank {r} reads {v['kind']}")
            elif v["kind"] != "waiting_on_peer":
                problems.append(f"rank {r} reads {v['kind']}, not waiting_on_peer")
            elif not any(f"rank {a.slow_rank} computes" in e for e in v["evidence"]):
                problems.append(f"rank {r}: evidence does not name rank {a.slow_rank}")
        return problems

    def check_straggler(self, ph: dict[str, Any]) -> None:
        a, job = self.args, JOB_SLOW
        doc, cli = ph["diagnosis"], ph["cli"]
        api_p = self.verdict_problems(doc, job)
        cli_p = self.verdict_problems(cli.get("doc"), job)
        if cli.get("rc") != 1:
            cli_p.append(f"exit status {cli.get('rc')} (1 = bottleneck expected)")
        if any(c != 0 for c in ph["codes"]):
            api_p.append(f"rank exit codes {ph['codes']}")
        slow_v = next(
            (
                v
                for v in (doc or {}).get("verdicts", [])
                if v["subject"]["job"] == job and v["subject"]["rank"] == a.slow_rank
            ),
            None,
        )
        named = (
            (
                f"rank {a.slow_rank} (gpu {slow_v['subject']['gpu']}, "
                f"{slow_v['subject']['uuid']}) reads `{slow_v['kind']}`"
            )
            if slow_v
            else ""
        )
        self.rep.check(
            "straggler-api",
            not api_p,
            (
                f"/api/v1/diagnosis: every other rank `waiting_on_peer` naming rank {a.slow_rank}; "
                + named
            )
            if not api_p
            else "; ".join(api_p),
        )
        self.rep.check(
            "straggler-cli",
            not cli_p,
            ("`stepscope diagnose --json` (exit 1): the same verdicts")
            if not cli_p
            else "; ".join(cli_p),
        )
        smp = samples(ph["scrapes"][-1][1])
        count = rank_values(smp, "stepscope_step_duration_seconds_count", job)
        total = rank_values(smp, "stepscope_step_duration_seconds_sum", job)
        phase = {
            p: rank_values(smp, "stepscope_step_phase_seconds_total", job, phase=p) for p in PHASES
        }
        bott = {
            int(lbl["rank"]): lbl["kind"]
            for n, lbl, v in smp
            if n == "stepscope_bottleneck" and lbl.get("job") == job and v == 1
        }
        rows = []
        for r in range(a.ranks):
            n = count.get(r, 0.0)
            rows.append(
                [
                    r,
                    "slowed" if r == a.slow_rank else "",
                    int(n),
                    fmt(total.get(r, 0) / n if n else None),
                    *(fmt(phase[p].get(r, 0) / n if n else None) for p in PHASES),
                    bott.get(r, "-"),
                ]
            )
        self.rep.add(
            f"## 3. The same job with rank {a.slow_rank} slowed",
            "",
            f"Rank {a.slow_rank} sleeps {a.delay} s before each backward. The diagnosis window "
            f"is {a.window} s; the verdicts were read {a.window + 2:.0f} s after the warm-up, "
            "while the job ran. Seconds per step from the last scrape, and the served "
            "`stepscope_bottleneck{kind=...} == 1`:",
            "",
        )
        self.rep.add(
            *table(
                [
                    "rank",
                    "",
                    "measured",
                    "step s",
                    "data_wait s",
                    "compute s",
                    "comm s",
                    "other s",
                    "served kind",
                ],
                rows,
            ),
            "",
        )
        self.add_verdicts("`/api/v1/diagnosis`", doc, job)
        self.rep.add(
            "`stepscope diagnose --exporter URL` (text form, read at the same moment, "
            f"exit {cli.get('text_rc')}):",
            "",
            "```",
            cli.get("text", "").rstrip(),
            "```",
            "",
        )
        (self.raw / "straggler-diagnosis.json").write_text(json.dumps(doc, indent=2))
        (self.raw / "straggler-diagnose-cli.json").write_text(json.dumps(cli.get("doc"), indent=2))

    def check_rules(self, ph: dict[str, Any]) -> None:
        """The straggler phase's scraped counters as promtool input series, 1 s apart."""
        a, job = self.args, JOB_SLOW
        wanted = (
            "stepscope_step_duration_seconds_sum",
            "stepscope_step_duration_seconds_count",
            "stepscope_step_phase_seconds_total",
        )
        series: dict[str, dict[int, float]] = {}
        last = 0
        for i, text in ph["scrapes"]:
            last = max(last, i)
            for n, lbl, v in samples(text):
                if n in wanted and lbl.get("job") == job:
                    series.setdefault(selector(n, lbl), {})[i] = v
        inputs = [{"series": s, "values": " ".join(
            repr(vals[i]) if i in vals else "_" for i in range(last + 1))}
            for s, vals in sorted(series.items())]  # fmt: skip
        score = f'job_rank:stepscope_straggler_score:ratio{{job="{job}"}}'
        top = f'job:stepscope_straggler_score:max{{job="{job}"}}'
        test: dict[str, Any] = {
            "rule_files": [RULES.name],
            "evaluation_interval": "1s",
            "tests": [
                {
                    "name": f"{job}: the slowed rank {a.slow_rank} has the job's highest score",
                    "interval": "1s",
                    "input_series": inputs,
                    "promql_expr_test": [
                        {
                            "expr": f'count({score[:-1]},rank="{a.slow_rank}"}} == on (job) '
                            f"group_left () {top})",
                            "eval_time": f"{last}s",
                            "exp_samples": [{"labels": "{}", "value": 1}],
                        },
                        {
                            "expr": f"count({score} == on (job) group_left () {top})",
                            "eval_time": f"{last}s",
                            "exp_samples": [{"labels": "{}", "value": 1}],
                        },
                        {
                            "expr": f"count({score})",
                            "eval_time": f"{last}s",
                            "exp_samples": [{"labels": "{}", "value": a.ranks}],
                        },
                    ],
                }
            ],
        }
        # The same input, asserting nothing is recorded: promtool fails and prints what it
        # evaluated, which is how the scores themselves are read from promtool.
        show: dict[str, Any] = {
            **test,
            "tests": [
                {
                    **dict(test["tests"][0]),
                    "name": "show the scores",
                    "promql_expr_test": [
                        {"expr": score, "eval_time": f"{last}s", "exp_samples": []}
                    ],
                }
            ],
        }
        shutil.copy(RULES, self.out / RULES.name)
        (self.out / "straggler_rules_test.yml").write_text(json.dumps(test, indent=1) + "\n")
        (self.tmp / RULES.name).write_text(RULES.read_text())
        (self.tmp / "show_scores_test.yml").write_text(json.dumps(show, indent=1) + "\n")
        promtool = str(Path(a.promtool).resolve()) if a.promtool else shutil.which("promtool")
        if promtool and Path(promtool).is_file() and not os.access(promtool, os.X_OK):
            promtool = str(shutil.copy(promtool, self.tmp / "promtool"))  # carried without +x
            os.chmod(promtool, 0o755)
        if not promtool:
            self.rep.check(
                "rules",
                False,
                "promtool not found (give --promtool PATH); the test "
                "file is in the output: cd OUT && promtool test rules "
                "straggler_rules_test.yml",
            )
            return
        run = subprocess.run(
            [promtool, "test", "rules", "straggler_rules_test.yml"],
            cwd=self.out,
            capture_output=True,
            text=True,
            timeout=120,
        )
        shown = subprocess.run(
            [promtool, "test", "rules", "show_scores_test.yml"],
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=120,
        )
        (self.raw / "promtool-test.txt").write_text(run.stdout + run.stderr)
        (self.raw / "promtool-show-scores.txt").write_text(shown.stdout + shown.stderr)
        scores = {
            int(m.group(1)): float(m.group(2))
            for m in re.finditer(
                r'rank="(\d+)"[^}]*\} (?:=> )?([-+0-9.eE]+|NaN)', shown.stdout + shown.stderr
            )
        }
        ok = run.returncode == 0
        self.rep.check(
            "rules",
            ok,
            (
                f"promtool test rules: rank {a.slow_rank}'s "
                "job_rank:stepscope_straggler_score:ratio is the job's unique maximum "
                f"({len(inputs)} input series, {last + 1} s at 1 s)"
            )
            if ok
            else f"promtool exit {run.returncode}: {(run.stdout + run.stderr)[-600:]}",
        )
        self.rep.data["straggler_scores"] = scores
        self.rep.add(
            "## 4. The recording rule's straggler score, evaluated by promtool",
            "",
            f"The straggler phase's scraped `stepscope_step_duration_seconds_sum/_count` and "
            f"`stepscope_step_phase_seconds_total` of job `{job}` ({len(inputs)} series, one "
            f"value per second, `_` before a series existed) are the input series of "
            f"`straggler_rules_test.yml` over `{RULES.relative_to(REPO)}` (copied beside it), "
            f"evaluated at {last} s; it asserts the slowed rank's score equals "
            f"`job:stepscope_straggler_score:max` and that one rank holds the maximum. "
            f"`{Path(promtool).name} test rules` exit {run.returncode}. The scores promtool "
            "computed (read from a second run that expects none):",
            "",
        )
        self.rep.add(
            *table(
                ["rank", "job_rank:stepscope_straggler_score:ratio"],
                [
                    [r, f"{s:.3f}" + (" (slowed)" if r == a.slow_rank else "")]
                    for r, s in sorted(scores.items())
                ],
            ),
            "",
        )

    def check_nccl(self) -> None:
        a = self.args
        if a.cpu:
            self.rep.check("nccl", None, "skipped with --cpu: gloo writes no NCCL_DEBUG log")
            self.rep.add(
                "## 5. NCCL transport",
                "",
                "Not run: with `--cpu` the ranks use gloo, which writes no `NCCL_DEBUG=INFO` log.",
                "",
            )
            return
        logs = [str(p) for p in sorted(self.raw.glob(f"nccl-{JOB_DDP}-rank*.log"))]
        if not logs:
            self.rep.check("nccl", False, "no NCCL_DEBUG_FILE written")
            return
        base = [sys.executable, "-m", "stepscope", "nccl-check"]
        js = subprocess.run(
            [*base, "--json", *logs], capture_output=True, text=True, env=self.env, timeout=60
        )
        tx = subprocess.run(
            [*base, *logs], capture_output=True, text=True, env=self.env, timeout=60
        )
        try:
            rows = json.loads(js.stdout)
        except ValueError:
            rows = []
        ranks = sorted(r["rank"] for r in rows if r.get("rank") is not None)
        ok = (
            js.returncode == 0
            and ranks == list(range(a.ranks))
            and all(r["verdict"] == "ok" for r in rows)
        )
        self.rep.check(
            "nccl",
            ok,
            f"nccl-check exit {js.returncode}, ranks {ranks}, verdicts "
            f"{sorted({r['verdict'] for r in rows})}",
        )
        self.rep.add(
            "## 5. NCCL transport: `stepscope nccl-check` over the DDP phase's logs",
            "",
            f"`NCCL_DEBUG=INFO`, `NCCL_DEBUG_FILE` per rank ({len(logs)} files, in "
            f"raw.tar.gz); exit {tx.returncode}:",
            "",
            "```",
            tx.stdout.rstrip(),
            "```",
            "",
        )
        (self.raw / "nccl-check.json").write_text(js.stdout)


def orchestrate(args: argparse.Namespace) -> int:
    import torch

    os.environ.update(MULTICAST_OFF)
    if not args.cpu:
        if not torch.cuda.is_available():
            print("multi_gpu_validation: CUDA not available (use --cpu)", file=sys.stderr)
            return 2
        args.ranks = args.ranks or torch.cuda.device_count()
        if args.ranks > torch.cuda.device_count():
            print(
                f"multi_gpu_validation: {args.ranks} ranks, {torch.cuda.device_count()} GPUs",
                file=sys.stderr,
            )
            return 2
    args.ranks = args.ranks or 2
    if args.ranks < 2:
        print("multi_gpu_validation: a straggler needs at least 2 ranks", file=sys.stderr)
        return 2
    args.window = args.window or (8 if args.cpu else 15)
    args.seconds = args.seconds or (12.0 if args.cpu else 30.0)
    args.slow_seconds = args.slow_seconds or args.window + (6.0 if args.cpu else 10.0)
    args.seconds = max(args.seconds, args.window + 4)
    args.slow_seconds = max(args.slow_seconds, args.window + 4)
    args.delay = args.delay or (0.15 if args.cpu else 0.1)
    args.slow_rank = args.ranks - 1 if args.slow_rank < 0 else args.slow_rank
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args)
    rep = run.rep
    t_start = time.monotonic()
    code = 1
    try:
        if not run.start_exporter():
            print((run.raw / "exporter.log").read_text())
            rep.check("exporter", False, "stepscope serve did not come up")
            return finish(run, time.monotonic() - t_start)
        idle = []
        for _ in range(3):
            idle.append(scrape(run.port))
            time.sleep(1.0)
        (run.raw / "metrics-idle.txt").write_text(idle[-1])
        info = run.check_labels(idle[-1])
        sim_uuids = [g["UUID"] for g in sorted(info, key=lambda g: int(g["gpu"]))]
        ddp = run.run_phase(JOB_DDP, args.seconds, 0.0, sim_uuids)
        (run.raw / "metrics-ddp-end.txt").write_text(ddp["scrapes"][-1][1])
        (run.raw / "ddp-diagnosis.json").write_text(json.dumps(ddp["diagnosis"], indent=2))
        used = run.check_ddp(ddp, info)
        run.check_bytes(idle, ddp["scrapes"], used)
        slow = run.run_phase(JOB_SLOW, args.slow_seconds, args.delay, sim_uuids)
        (run.raw / "metrics-straggler-end.txt").write_text(slow["scrapes"][-1][1])
        rep.data["straggler_results"] = slow["results"]
        run.check_straggler(slow)
        run.check_rules(slow)
        run.check_nccl()
        served = [
            line
            for line in slow["scrapes"][-1][1].splitlines()
            if line.startswith(("stepscope_training_rank_info{", "stepscope_mfu_ratio{"))
            or (line.startswith("stepscope_bottleneck{") and line.endswith(" 1"))
        ]
        rep.add(
            "## What was served at the end of the straggler phase (excerpt)",
            "",
            "```",
            *served,
            "```",
            "",
        )
        code = finish(run, time.monotonic() - t_start)
    finally:
        run.stop_exporter()
        shutil.rmtree(run.tmp, ignore_errors=True)
    return code


def finish(run: Run, elapsed: float) -> int:
    a, rep = run.args, run.rep
    failed = [c for c in rep.checks if c.status == "FAIL"]
    mode = (
        f"CPU rehearsal: gloo, {a.ranks} processes, `stepscope serve --simulate {a.ranks}`"
        if a.cpu
        else f"{a.ranks} GPUs, NCCL, `stepscope serve` on NVML"
    )
    head = [
        "# Multi-GPU validation (issue 7)",
        "",
        f"Mode: {mode}. Host: {os.uname().nodename}, {os.cpu_count()} CPUs, Python "
        f"{sys.version.split()[0]}, torch {_torch_version()}. Took {elapsed:.0f} s.",
        "",
        "Command: `python benchmarks/multi_gpu_validation.py " + " ".join(sys.argv[1:]) + "`",
        "",
        f"Exporter: `stepscope {rep.data.get('exporter_cmd', '').split('stepscope ', 1)[-1]}`"
        " (config: `interval: 1`, `mfu_window: 600`, `diagnosis: {window: "
        f"{a.window}}}`, ingest on a Unix socket in a temp dir). Every rank's environment: "
        + ", ".join(f"`{k}={v}`" for k, v in MULTICAST_OFF.items())
        + ("" if a.cpu else ", `NCCL_DEBUG=INFO`, `NCCL_DEBUG_FILE` per rank")
        + ".",
        "",
        f"**Result: {'PASS' if not failed else 'FAIL'}**",
        "",
        *table(
            ["check", "status", "detail"],
            [[c.name, f"**{c.status}**", c.detail.replace("|", "/")] for c in rep.checks],
        ),
        "",
    ]
    text = "\n".join(head + rep.sections) + "\n"
    (a.out / "multi_gpu_validation.md").write_text(text)
    rep.data["checks"] = [c.__dict__ for c in rep.checks]
    rep.data["args"] = {k: str(v) for k, v in vars(a).items()}
    (a.out / "multi_gpu_validation.json").write_text(json.dumps(rep.data, indent=2, default=str))
    with tarfile.open(a.out / "raw.tar.gz", "w:gz") as tar:
        tar.add(run.raw, arcname="raw")
    shutil.rmtree(run.raw, ignore_errors=True)
    print(text)
    return 0 if not failed else 1


def _torch_version() -> str:
    try:
        import torch

        return str(torch.__version__)
    except ImportError:
        return "absent"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--cpu", action="store_true", help="gloo + simulated GPUs (no CUDA)")
    ap.add_argument("--ranks", type=int, default=0, help="ranks (GPU default: all GPUs; CPU: 2)")
    ap.add_argument("--seconds", type=float, default=0.0, help="measured s of the DDP phase")
    ap.add_argument(
        "--slow-seconds",
        type=float,
        default=0.0,
        help="measured s of the straggler phase (default window + 6/10)",
    )
    ap.add_argument("--window", type=int, default=0, help="diagnosis window s (CPU 8, GPU 15)")
    ap.add_argument(
        "--delay",
        type=float,
        default=0.0,
        help="s the slowed rank sleeps before each backward (CPU 0.15, GPU 0.1)",
    )
    ap.add_argument("--slow-rank", type=int, default=-1, help="default: the last rank")
    ap.add_argument("--promtool", default="", help="promtool binary (default: on PATH)")
    ap.add_argument("--startup-timeout", type=float, default=150.0)
    # worker mode (the script starts itself once per rank)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--job", default="", help=argparse.SUPPRESS)
    ap.add_argument("--ingest", default="", help=argparse.SUPPRESS)
    ap.add_argument("--uuid", default="", help=argparse.SUPPRESS)
    ap.add_argument("--started", default="", help=argparse.SUPPRESS)
    ap.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    return worker(args) if args.worker else orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
