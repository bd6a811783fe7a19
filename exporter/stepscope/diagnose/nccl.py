"""The NCCL log parser ``stepscope nccl-check`` uses: :mod:`stepscope.nccl_log`, shared
with the training SDK (which reads its own rank's NCCL debug file with it)."""

from stepscope.nccl_log import FAST, RankTransport, parse_nccl_log

__all__ = ["FAST", "RankTransport", "parse_nccl_log"]
