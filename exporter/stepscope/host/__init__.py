"""Host signals the diagnosis needs: CPU busy, iowait, pressure, DataLoader workers.

``model`` holds the plain data, ``source.HostSource`` reads it with psutil,
``metrics`` serves the per-rank part node_exporter lacks.
"""
