"""The exporter's training side: what ranks report, aggregated per (job, rank).

- :mod:`~stepscope.training.datagram`: parse and validate one datagram (pure);
- :mod:`~stepscope.training.aggregate`: per-rank counters, histogram, MFU window;
- :mod:`~stepscope.training.ingest`: the socket listener on the event loop;
- :mod:`~stepscope.training.peak_flops`: datasheet peak FLOP/s per GPU model;
- :mod:`~stepscope.training.metrics`: the training view to metric families (pure).

The datagram schema itself is :mod:`stepscope.train.schema`, shared with the SDK.
"""
