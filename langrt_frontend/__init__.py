"""langrt's frontend language: SGLang-compatible `@function` programs (API.md §1).

Light by design: importing it must not import torch. The DSL itself is built in its own issue.
"""

from langrt.version import __version__

__all__ = ["__version__"]
