"""gpubench: measure how fast data moves on GPU machines, save it as JSON, compare it later."""

__version__ = "0.1.0"
