"""The exporter's training side: what ranks report, aggregated per (job, rank).

- :mod:`~stepscope.shared.datagram`: parse and validate one datagram (pure);
- :mod:`~stepscope.ingest.aggregate`: per-rank counters, histogram, MFU window;
- :mod:`~stepscope.ingest.listener`: the socket listener on the event loop;
- :mod:`~stepscope.ingest.peak_flops`: datasheet peak FLOP/s per GPU model;
- :mod:`~stepscope.ingest.metrics`: the training view to metric families (pure).

The datagram schema itself is :mod:`stepscope.shared.datagram`, shared with the SDK.
"""
