"""A Protocol Buffer schema definition (the text of one ``.proto`` file) compiled by protoc.

Python's protobuf runtime has no ``.proto`` parser; ``grpcio-tools`` ships protoc itself as an
extension module, maintained by the gRPC project, so the server compiles a definition with the
reference compiler instead of a hand-written or third-party parser. The definition is written to
a private temporary directory as ``schema.proto`` (protoc reads files), compiled there with that
directory as the only import path (so a definition cannot import other files: Pub/Sub's rule),
and the result is the file's ``FileDescriptorProto``, which ``core/schemas.py`` loads into a
private descriptor pool.

protoc runs in-process twice: once through ``get_protos``, which collects syntax and semantic
errors as values (the client is told each one with its line and column), and, for a definition
that compiled, once through its command line entry to write the descriptor set. A compile takes
a few milliseconds; definitions are compiled at CreateSchema, CommitSchema, ValidateSchema and
once per revision a process first validates against (control/schemas.py caches them).
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import _protoc_compiler, protoc

from pubsubd.core.errors import InvalidArgument

# The one file protoc sees; its name shows in error messages ("schema.proto:3:5: ...").
FILE_NAME = "schema.proto"
# At most this many of protoc's errors are quoted back to the client.
MAX_ERRORS_SHOWN = 5


def compile_definition(definition: str) -> descriptor_pb2.FileDescriptorProto:
    """The compiled file of ``definition``; raises InvalidArgument quoting protoc's errors."""
    with tempfile.TemporaryDirectory(prefix="pubsubd-proto-") as tmp:
        root = Path(tmp)
        (root / FILE_NAME).write_text(definition, encoding="utf-8")
        with warnings.catch_warnings():
            # protoc's warnings (e.g. no syntax given: proto2) are not the client's errors.
            warnings.simplefilter("ignore")
            try:
                _protoc_compiler.get_protos(FILE_NAME.encode(), [str(root).encode()])
            except _protoc_compiler.ProtocErrors as e:
                found = _errors(e)
                if "import" in definition and "not found" in found:
                    found += " (imports of other .proto files are not supported)"
                raise InvalidArgument(f"definition: not a valid .proto file: {found}") from None
        out = root / "descriptor_set.pb"
        code = protoc.main(
            ["protoc", f"--proto_path={root}", f"--descriptor_set_out={out}", str(root / FILE_NAME)]
        )
        if code != 0 or not out.exists():
            raise InvalidArgument("definition: not a valid .proto file (protoc refused it)")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    if len(files) != 1:
        raise InvalidArgument("definition: imports of other .proto files are not supported")
    return files[0]


def _errors(e: Exception) -> str:
    found = []
    for err in e.errors():  # type: ignore[attr-defined]
        if isinstance(err.message, bytes):
            text = err.message.decode("utf-8", "replace")
        else:
            text = str(err.message)
        # protoc counts lines and columns from 0; -1: not at a place in the file.
        found.append(
            f"line {err.line + 1} column {err.column + 1}: {text}" if err.line >= 0 else text
        )
    if not found:
        return str(e)
    more = len(found) - MAX_ERRORS_SHOWN
    shown = "; ".join(found[:MAX_ERRORS_SHOWN])
    return shown + (f"; and {more} more" if more > 0 else "")
