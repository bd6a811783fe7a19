"""The kubelet's pod-resources API (v1), as Python stubs generated from ``api.proto``.

``api_pb2`` holds the messages, ``api_pb2_grpc`` the client stub and the servicer. Both
are generated, never edited: ``regenerate.sh`` beside them says how. Importing them needs
grpcio and protobuf (the ``kubernetes`` extra).
"""
