"""AdaptiveSpec for vLLM.

The algorithm (``config``, ``policy``, ``tree``, ``margin``) imports only torch and
pydantic; everything that touches vLLM lives in ``vllm_adaptivespec.engine``.
"""

from pathlib import Path

__version__ = (Path(__file__).parent / "VERSION").read_text().strip()
