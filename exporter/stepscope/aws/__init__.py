"""AWS: the node's EC2 placement from IMDSv2 (``stepscope_node_info``) and
``stepscope discover`` (EC2 instances as a Prometheus file_sd target list).

botocore/boto3 are optional: they are imported inside these features only, so
``stepscope serve`` runs without them (no node info then).
"""
