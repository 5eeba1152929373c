"""Post-process protoc's Python output for pubsubd.

- Drop the gencode/runtime version check: protoc from grpcio-tools stamps the protobuf version it
  ships with, and the check fails at import with any older runtime, while pyproject allows
  protobuf>=5.29. The generated descriptor-building code works with every runtime from 5.29 on.
- Name the module by its real import path (pubsubd._gen.pubsubd.v1.replay_pb2).
"""

import re
import sys
from pathlib import Path


def main(root: str) -> None:
    for path in Path(root).rglob("*_pb2.py"):
        text = path.read_text()
        text = re.sub(
            r"_runtime_version\.ValidateProtobufRuntimeVersion\(\n(?:    .*\n)*?\)\n", "", text
        )
        text = text.replace("from google.protobuf import runtime_version as _runtime_version\n", "")
        rel = path.relative_to(root).with_suffix("")
        module = ".".join(rel.parts)
        text = text.replace(f"'{module}'", f"'pubsubd._gen.{module}'")
        path.write_text(text)
    for pkg in [Path(root), *[p for p in Path(root).rglob("*") if p.is_dir()]]:
        (pkg / "__init__.py").touch()


if __name__ == "__main__":
    main(sys.argv[1])
