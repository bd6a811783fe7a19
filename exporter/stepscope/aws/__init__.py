"""AWS: the node's EC2 placement from IMDSv2 (``stepscope_node_info``) and
``stepscope discover`` (EC2 instances as a Prometheus file_sd target list).

The IMDSv2 read uses only the standard library, so ``stepscope serve`` and the image need
no AWS SDK. boto3 (the ``aws`` extra) is imported inside ``stepscope discover`` only.
"""
