"""Network signals: RDMA (EFA, InfiniBand) port counters from sysfs (``net.rdma``)."""
