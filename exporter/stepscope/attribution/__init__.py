"""Whose GPU is it: sources that attribute GPUs to jobs (the enrichment stage's input).

Each is a :class:`~stepscope.core.source.Source` whose ``gpu_labels`` hook gives extra
label pairs per GPU; the sampler merges them into the label schema in one place.
"""
