"""What the training SDK and the exporter both import: the datagram schema the SDK sends
and the ingest parses, and the parser of NCCL's debug log (the SDK reads its own rank's
file; ``stepscope nccl-check`` reads a job's). Nothing here imports the exporter.
"""
