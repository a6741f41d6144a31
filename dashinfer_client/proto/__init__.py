"""gRPC stubs of proto/dashinfer.proto, generated at build time (setup.py): dashinfer_pb2 (messages)
and dashinfer_pb2_grpc (service). Imported only by ClientEngine and the server, never by
`import dashinfer_client`."""


def load():
    """-> (dashinfer_pb2, dashinfer_pb2_grpc); a clear ImportError when they were not generated."""
    try:
        from . import dashinfer_pb2, dashinfer_pb2_grpc
    except ModuleNotFoundError as e:
        if e.name and e.name.endswith("dashinfer_pb2") or "dashinfer_pb2" in str(e):
            raise ImportError("the gRPC stubs are not generated: build the package "
                              "(python setup.py build_ext --inplace, or pip install .)") from e
        raise
    return dashinfer_pb2, dashinfer_pb2_grpc
