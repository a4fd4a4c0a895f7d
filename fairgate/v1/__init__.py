"""The fairgate.v1 gRPC contract: code generated from protos/fairgate/v1 by gateway.proto_gen.

Import the modules directly, e.g. `from fairgate.v1 import gateway_pb2, gateway_pb2_grpc`.
"""

__all__ = ["admin_pb2", "admin_pb2_grpc", "gateway_pb2", "gateway_pb2_grpc"]
