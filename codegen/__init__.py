"""Codegen: `Graph` + verified `Plan` + `Chip` -> SPMD `Program`."""

from .lower import CodegenError, Placement, StreamedOverflow, generate, stream, streamed_layout
from .program import Buffer, Program

__all__ = ["Buffer", "CodegenError", "Placement", "Program", "StreamedOverflow", "generate",
           "stream", "streamed_layout"]
