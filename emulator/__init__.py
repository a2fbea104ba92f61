"""Emulator: `Program` + `Chip` + inputs -> outputs + `Timeline` (it never reads the `Plan`)."""

from .machine import EmulatorError, Machine, PhaseRecord, Prepared, Timeline, emulate
from .timing import TimingMachine

__all__ = ["EmulatorError", "Machine", "PhaseRecord", "Prepared", "Timeline", "TimingMachine",
           "emulate"]
