"""Temporary re-export while the code moves to aiayn.errors."""

from aiayn.errors import DataError

__all__ = ["DataError"]
