"""Codegen: `Graph` + verified `Plan` + `Chip` -> SPMD `Program`."""

from .lower import CodegenError, Placement, generate, stream
from .program import Buffer, Program

__all__ = ["Buffer", "CodegenError", "Placement", "Program", "generate", "stream"]
