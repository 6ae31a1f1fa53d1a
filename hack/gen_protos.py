"""Generate Python protobuf/gRPC stubs for every dranet_proto/*.proto.

Run ``make protos`` after editing a .proto file. The generated ``*_pb2.py``,
``*_pb2.pyi`` (type stubs, so type checkers see the message classes and their fields)
and ``*_pb2_grpc.py`` files are committed; tests/repo/test_protos.py regenerates them
into a temp dir and fails if the committed ones differ.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "dranet_proto"


def generate(out_dir: Path) -> list[Path]:
    """Generate stubs for all protos into ``out_dir``; return the written files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    protos = sorted(PROTO_DIR.glob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    for proto in protos:
        rc = protoc.main(
            [
                "protoc",
                f"-I{PROTO_DIR}",
                f"-I{include}",
                f"--python_out={out_dir}",
                f"--pyi_out={out_dir}",
                f"--grpc_python_out={out_dir}",
                str(proto),
            ]
        )
        if rc != 0:
            raise SystemExit(f"protoc failed for {proto.name}")
    written = sorted(p for p in out_dir.glob("*_pb2*") if p.suffix in (".py", ".pyi"))
    for path in written:
        # protoc emits absolute imports ("import x_pb2"); make them package-relative.
        text = re.sub(r"^import (\w+_pb2) as", r"from . import \1 as", path.read_text(), flags=re.M)
        if path.suffix == ".pyi":
            # NRI's enum Field has a value named None: protoc writes "None: Field", which is not
            # Python and stops type checkers. Keep it as a comment; the value is Field.Value("None").
            text = re.sub(r"^(\s*)(None: .*)$", r'\1# \2  (a Python keyword: use Value("None"))', text, flags=re.M)
        path.write_text(text)
    return written


if __name__ == "__main__":
    files = generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_DIR)
    print("\n".join(str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f) for f in files))
