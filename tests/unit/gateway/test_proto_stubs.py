"""The committed protobuf/gRPC modules are what grpcio-tools generates from the .proto files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import eventbus.eventing._proto as proto_pkg

PROTO_DIR = Path(proto_pkg.__file__).parent
GENERATED = [
    "cloudevents_pb2.py",
    "cloudevents_pb2.pyi",
    "eventbus_pb2.py",
    "eventbus_pb2.pyi",
    "eventbus_pb2_grpc.py",
]


def regenerate(out: Path) -> None:
    for name in ("cloudevents.proto", "eventbus.proto"):
        shutil.copy(PROTO_DIR / name, out / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I.",
            "--python_out=.",
            "--grpc_python_out=.",
            "--pyi_out=.",
            "cloudevents.proto",
            "eventbus.proto",
        ],
        cwd=out,
        check=True,
    )
    (out / "cloudevents_pb2_grpc.py").unlink()
    for name in ("eventbus_pb2.py", "eventbus_pb2_grpc.py"):
        path = out / name
        text = path.read_text()
        text = text.replace(
            "import cloudevents_pb2 as", "from eventbus.eventing._proto import cloudevents_pb2 as"
        )
        text = text.replace(
            "\nimport eventbus_pb2 as", "\nfrom eventbus.eventing._proto import eventbus_pb2 as"
        )
        path.write_text(text)


def test_committed_stubs_are_current(tmp_path: Path) -> None:
    regenerate(tmp_path)
    stale = [n for n in GENERATED if (tmp_path / n).read_text() != (PROTO_DIR / n).read_text()]
    assert not stale, f"stale generated modules {stale}: run `make proto`"
