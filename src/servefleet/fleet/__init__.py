"""The fleet layer: the fleet file, state records and the lifecycle of its servers.

``Fleet`` is the entry point (``Fleet.load(path)``, ``await fleet.up()``, ``await fleet.down()``,
``await fleet.restart(name)``, ``await fleet.status()``, ``await fleet.ready_endpoints()``).
The fleet file format is documented in ``servefleet.fleet.spec`` and in ``examples/``.
"""

from servefleet.fleet.core import DEFAULT_FLEET_FILE, Endpoint, Fleet, Relaunch, find_fleet_file
from servefleet.fleet.lifecycle import Action, StartOutcome, StopResult
from servefleet.fleet.loader import load_fleet_file
from servefleet.fleet.spec import FleetSpec, HostSpec, ServerSpec
from servefleet.fleet.state import ServerState, StateStore
from servefleet.fleet.status import Liveness, ServerStatus

__all__ = [
    "DEFAULT_FLEET_FILE",
    "Action",
    "Endpoint",
    "Fleet",
    "FleetSpec",
    "HostSpec",
    "Liveness",
    "Relaunch",
    "ServerSpec",
    "ServerState",
    "ServerStatus",
    "StartOutcome",
    "StateStore",
    "StopResult",
    "find_fleet_file",
    "load_fleet_file",
]
