"""Exceptions of the diaspora package. Every one carries the plugin's own message."""

from __future__ import annotations


class DiasporaError(Exception):
    """A call into the plugin failed. `status` is the C ABI's status name
    ("DIASPORA_ERR_INVALID", ...), `message` the plugin's last error for the handle."""

    def __init__(self, message: str, status: str = "DIASPORA_ERR_INTERNAL"):
        super().__init__(message)
        self.status = status
        self.message = message


class SpecError(DiasporaError):
    """The spec was refused when opening. `message` holds every problem, one
    "FILE:LINE:COL: error: KEY.PATH: ..." line each (the format `diaspora validate` prints)."""

    def __init__(self, message: str):
        super().__init__(message, "DIASPORA_ERR_CONFIG")

    @property
    def problems(self) -> list[str]:
        return [line for line in self.message.splitlines() if line.strip()]


class LibraryError(DiasporaError):
    """libdiaspora_plugin.so could not be found or loaded (every candidate and why)."""


class AbiError(DiasporaError):
    """The library found does not serve this package's ABI (1.x with x >= 0)."""

    def __init__(self, message: str):
        super().__init__(message, "DIASPORA_ERR_VERSION")


class ClosedError(DiasporaError):
    """The handle is closed or closing."""

    def __init__(self, message: str = "the plugin handle is closed"):
        super().__init__(message, "DIASPORA_ERR_CLOSED")
