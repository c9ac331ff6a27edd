"""One exception tree for servefleet. Foreign errors are translated once, at the boundary.

ServefleetError
├── ConfigError            a fleet file or an argument is invalid (names file, server, field)
├── HostError              a command could not be run where it was asked to
│   ├── CommandError       a command ran and failed (return code, shortened argv, stderr tail)
│   └── HostUnreachable    the host could not be reached at all (SSH connect failure, timeout)
├── LaunchError            a server process could not be started or died at once
├── EngineError            an engine profile cannot do what was asked (unknown engine, no argv)
└── StateError             a state file is missing, corrupt, or belongs to another server
"""

from __future__ import annotations

__all__ = [
    "ServefleetError",
    "ConfigError",
    "OptionError",
    "HostError",
    "CommandError",
    "HostUnreachable",
    "LaunchError",
    "EngineError",
    "StateError",
]


class ServefleetError(Exception):
    """Base of every error servefleet raises on purpose."""


class ConfigError(ServefleetError):
    """Invalid configuration; the message names the file, the server and the field."""


class OptionError(ConfigError):
    """A command-line option out of its range: a usage error (the message names the option)."""


class HostError(ServefleetError):
    """A host could not do what was asked."""


class CommandError(HostError):
    def __init__(self, argv: list[str], returncode: int, stderr: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        shown = " ".join(argv)
        if len(shown) > 200:
            shown = shown[:197] + "..."
        tail = stderr.strip().splitlines()[-3:] if stderr else []
        reason = (": " + " | ".join(tail)) if tail else ""
        super().__init__(f"command failed with exit code {returncode}: {shown}{reason}")


class HostUnreachable(HostError):
    """The host itself could not be reached (distinct from a failing server on it)."""

    reason: str | None = None  # the short cause, where known (the SSH layer sets it: "connection refused", ...)


class LaunchError(ServefleetError):
    """A server could not be started."""


class EngineError(ServefleetError):
    """An engine profile was asked for something it does not know."""


class StateError(ServefleetError):
    """A state record is missing or unusable."""
