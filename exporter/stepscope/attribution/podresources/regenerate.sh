#!/bin/sh
# Regenerates the Python stubs of the kubelet's pod-resources API from api.proto:
# api_pb2.py (messages), api_pb2.pyi (their types, for mypy) and api_pb2_grpc.py (the
# client stub and the servicer the tests serve). Run from anywhere, in the venv with the
# test extra (it has grpcio-tools):
#
#   pip install "grpcio-tools==1.85.1"
#   exporter/stepscope/attribution/podresources/regenerate.sh
#
# The generated code refuses to import with a grpcio or protobuf older than the
# generator's (it checks at import), so pyproject.toml's "kubernetes" extra pins at
# least those versions: after changing the grpcio-tools version, raise the extra's
# floors to the versions named in the new api_pb2.py / api_pb2_grpc.py headers.
#
# -I is the exporter/ directory, so the generated import of the messages is the
# package path (stepscope.attribution.podresources.api_pb2), not a bare "api_pb2".
# The gRPC method path (/v1.PodResourcesLister/List) comes from the proto's package
# and service names and does not depend on where the file lives.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exporter=$(cd "$here/../../.." && pwd)
cd "$exporter"
python -m grpc_tools.protoc -I . \
    --python_out=. --pyi_out=. --grpc_python_out=. \
    stepscope/attribution/podresources/api.proto
