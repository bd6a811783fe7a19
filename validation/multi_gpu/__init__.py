"""The parts of ``python -m validation.multi_gpu_validation`` (issue 7): what it reads
and reports (``report``), the exporter and the DDP phases (``run``, the ranks in
``rank``), and one module per check: ``gpus`` (labels, NVLink/PCIe bytes), ``ddp``,
``straggler``, ``rules`` (promtool) and ``nccl``."""
