"""A rank that opts in to NCCL transport reporting, for tests/unit/train/test_nccl_transport.py.

argv: ingest URL, job, steps, the NCCL debug log to replay. torch.distributed runs on
gloo (CPU): NCCL cannot run here, so once the reporter has pointed NCCL's debug output
at its file, this worker writes there what NCCL would (the fixture, with this process's
host and pid), then trains. Prints the path the reporter configured and the transport
it learnt.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time

import torch
import torch.distributed as dist

from stepscope.train import StepReporter

ingest, job, steps, replay = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rep = StepReporter(job, ingest=ingest, warmup_steps=0, nccl_transport=True)
# what NCCL does with NCCL_DEBUG_FILE at its first log line: %h short host name, %p pid
template = os.environ["NCCL_DEBUG_FILE"]
host = socket.gethostname().split(".", 1)[0]
path = template.replace("%h", host).replace("%p", str(os.getpid()))
with open(replay) as src:
    text = re.sub(r"^[^\s:]+:\d+:", f"{host}:{os.getpid()}:", src.read(), flags=re.M)
with open(path, "w") as out:
    out.write(text)

dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
rep.watch_ddp(model)
deadline = time.monotonic() + 60
i = known = 0
# step until the sender thread has read the file, then a few steps that carry it
while (i < steps or known < 5) and time.monotonic() < deadline:
    with rep.step(tokens=8):
        model(torch.randn(4, 8)).sum().backward()
    i += 1
    known += rep.nccl_transport is not None
    time.sleep(0.05)  # the workload's pace
print("debug", os.environ["NCCL_DEBUG"], os.environ["NCCL_DEBUG_SUBSYS"], template, flush=True)
print("transport", rep.nccl_transport, flush=True)
rep.close()
dist.destroy_process_group()
