"""Host signals the diagnosis needs: CPU busy, iowait, pressure, DataLoader workers.

``model`` holds the plain data (imported by the Snapshot), ``source.HostSource``
reads them with psutil.
"""
