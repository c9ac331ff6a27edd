"""`serve`: the fleet as one OpenAI-compatible URL -- for the tools people already use.

    gateway = Gateway(ServeConfig(port=8300), restarter=FleetRestarter(fleet), ready=ready_targets)
    url = await gateway.start(await targets_from_fleet(fleet))   # http://127.0.0.1:8300/v1

Modules, one job each: ``requests`` (what is checked before a server sees a request), ``errors``
(OpenAI's error shape), ``backend`` (one server: limit, health, counters), ``router`` (least-loaded
pick by model, the bounded queue per model), ``forward`` (one request through the fleet, retried
when nothing reached the client), ``supervisor`` (health, hangs, limits, outages and the fleet's
new servers), ``metrics`` (Prometheus), ``app`` (the HTTP face), ``gateway`` (all of it, started
and stopped). The limits, health rules and recovery are generate's (:mod:`servefleet.generate`).
"""

from servefleet.serve.gateway import Gateway, ServeConfig, check_bind, is_loopback, read_key_file

__all__ = ["Gateway", "ServeConfig", "check_bind", "is_loopback", "read_key_file"]
