"""Wheels holding chunks of a file, in a local directory pip can download from (no network)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from vllm_adaptivespec.models.specs import WheelPart, chunked_parts


def write_wheel(index: Path, package: str, version: str, members: dict[str, bytes]) -> Path:
    module = package.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    files = {
        **members,
        f"{module}/__init__.py": b"",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist_info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{dist_info}/RECORD"]).encode()
    index.mkdir(parents=True, exist_ok=True)
    path = index / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def write_chunked_wheels(index: Path, prefix: str, data: bytes, count: int,
                         version: str = "1.0") -> tuple[WheelPart, ...]:
    """``data`` split over wheels ``<prefix>1..count`` in the layout `specs.chunked_parts` describes."""
    parts = chunked_parts(prefix, count, version)
    step = -(-len(data) // count)
    for i, part in enumerate(parts):
        write_wheel(index, part.package, version, {part.member: data[i * step:(i + 1) * step]})
    return parts


def local_pip_args(index: Path) -> list[str]:
    return ["--no-index", "--find-links", str(index)]
