"""Emulator: `Program` + `Chip` + inputs -> outputs + `Timeline` (it never reads the `Plan`)."""

from .machine import EmulatorError, Machine, PhaseRecord, Timeline, emulate

__all__ = ["EmulatorError", "Machine", "PhaseRecord", "Timeline", "emulate"]
