"""`servefleet serve`: the fleet's ready servers behind one OpenAI-compatible URL, until SIGTERM or Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from servefleet.cli.common import FleetOpt, JsonOpt
from servefleet.errors import ConfigError, OptionError


def serve(
    fleet_file: FleetOpt = None,
    url: Annotated[
        list[str] | None,
        typer.Option("--url", help="a server not in a fleet (repeatable): used as it is, never restarted"),
    ] = None,
    host: Annotated[
        str,
        typer.Option("--host", help="address to listen on; anything but loopback needs --api-key or --api-key-file"),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="port to listen on (0: a free one, printed)")
    ] = 8300,
    api_key: Annotated[
        list[str] | None,
        typer.Option("--api-key", help="a key clients must send as 'Authorization: Bearer KEY' (repeatable)"),
    ] = None,
    api_key_file: Annotated[
        Path | None,
        typer.Option(
            "--api-key-file", help="keys, one a line (# comments): as --api-key, kept out of the process list"
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            min=1,
            help="requests in flight per server, fixed \\[default: from capacity, then measured]",
        ),
    ] = None,
    max_queue: Annotated[
        int | None,
        typer.Option(
            "--max-queue",
            min=0,
            help="requests waiting per model before 429 + Retry-After \\[default: its servers' limits, >= 8]",
        ),
    ] = None,
    queue_timeout: Annotated[
        float,
        typer.Option(
            "--queue-timeout",
            min=0.1,
            help="seconds a request may wait for a server before 429 (503 when none of its model is up)",
        ),
    ] = 60.0,
    max_body: Annotated[int, typer.Option("--max-body", min=1, help="largest request body in bytes (413 beyond)")] = 16
    * 2**20,
    max_attempts: Annotated[
        int,
        typer.Option(
            "--max-attempts",
            min=1,
            help="servers a request is sent to at most (again only when the first sent the client nothing)",
        ),
    ] = 3,
    grace: Annotated[
        float, typer.Option("--grace", min=0.0, help="on SIGTERM / Ctrl-C: seconds requests in flight get to finish")
    ] = 30.0,
    poll: Annotated[
        float,
        typer.Option(
            "--poll",
            min=0.1,
            help="--fleet: seconds between looks for servers that became ready (admitted while serving)",
        ),
    ] = 2.0,
    hang_after: Annotated[
        float,
        typer.Option(
            "--hang-after",
            min=0.1,
            help="a server with requests in flight and no progress this long (at least) is taken out as hung",
        ),
    ] = 60.0,
    probe_interval: Annotated[
        float,
        typer.Option(
            "--probe-interval",
            min=0.05,
            help="seconds without an answer, requests in flight, before the server is probed",
        ),
    ] = 10.0,
    probe_timeout: Annotated[float, typer.Option("--probe-timeout", min=0.05, help="seconds a probe may take")] = 5.0,
    give_up_after: Annotated[
        float,
        typer.Option(
            "--give-up-after", min=1.0, help="seconds a server taken out may take to come back before it is given up"
        ),
    ] = 600.0,
    request_timeout: Annotated[
        float, typer.Option("--request-timeout", min=1.0, help="seconds one request may take at a server")
    ] = 3600.0,
    as_json: JsonOpt = False,
) -> None:
    """Serve the fleet's ready servers as one OpenAI-compatible URL: /v1/completions, /v1/chat/completions (streaming passed
    through), /v1/models, /health, /metrics. Least-loaded dispatch by model, per-server limits, health by progress, dead
    fleet servers restarted, servers that become ready admitted; a bounded queue per model (429 + Retry-After when full).
    Prints the URL first (with --json, one JSON line), then events on stderr."""
    from servefleet.generate.health import HealthPolicy
    from servefleet.serve import Gateway, ServeConfig, check_bind, read_key_file

    if (fleet_file is None) == (not url):
        raise OptionError("give either --fleet FILE or --url URL (one or more)")
    keys = tuple(k for k in (api_key or []) if k) + (read_key_file(api_key_file) if api_key_file is not None else ())
    check_bind(host, keys)
    policy = HealthPolicy(
        hang_min_s=hang_after,
        probe_interval_s=probe_interval,
        probe_timeout_s=probe_timeout,
        recover_timeout_s=give_up_after,
    )
    config = ServeConfig(
        host=host,
        port=port,
        api_keys=keys,
        concurrency=concurrency,
        max_queue=max_queue,
        queue_timeout_s=queue_timeout,
        max_body_bytes=max_body,
        max_attempts=max_attempts,
        grace_s=grace,
        poll_interval_s=poll,
        request_timeout_s=request_timeout,
        health=policy,
    )

    def on_event(text: str) -> None:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def started(gw: Gateway) -> None:
            names = [b.name for b in gw.router.backends.values()]
            if as_json:
                sys.stdout.write(
                    json.dumps({"url": gw.url, "servers": names, "models": sorted(gw.router.models())}) + "\n"
                )
            else:
                sys.stdout.write(
                    f"serving {gw.url} ({len(names)} servers: {', '.join(names)}; models: {', '.join(sorted(gw.router.models()))})"
                    " -- SIGTERM or Ctrl-C to stop\n"
                )
            sys.stdout.flush()

        if fleet_file is None:
            from servefleet.generate.client import Client
            from servefleet.generate.endpoints import targets_from_urls

            async with Client() as probe:
                targets = await targets_from_urls(url or [], probe)
            gw = Gateway(config, on_event=on_event)
            await gw.serve(targets, stop, on_url=lambda _: started(gw))
            return
        from servefleet.cli.common import open_fleet
        from servefleet.generate.endpoints import FleetRestarter, targets_from_fleet

        async with open_fleet(fleet_file) as fleet:
            limits = replace(
                policy, max_restarts=fleet.spec.max_restarts, restart_window_s=fleet.spec.restart_window
            )  # the fleet file's
            config2 = config.model_copy(update={"health": limits})
            targets = await targets_from_fleet(fleet)
            if not targets:
                raise ConfigError(f"no server of {fleet_file} is ready; start them with `servefleet up {fleet_file}`")
            restarter = FleetRestarter(fleet)
            gw = Gateway(config2, restarter=restarter, ready=lambda: targets_from_fleet(fleet), on_event=on_event)
            try:
                await gw.start(targets)
                with restarter.recording(
                    f"servefleet serve at {gw.url}", []
                ):  # `down` / `drain` read it; admitted servers join it
                    for b in gw.router.backends.values():
                        restarter.using(b.name)
                    started(gw)
                    await stop.wait()
                    await gw.stop()
            finally:
                await gw.stop()

    asyncio.run(go())


def register(app: typer.Typer) -> None:
    app.command(
        "serve",
        short_help="Serve the fleet's ready servers as one OpenAI-compatible URL (least-loaded, back-pressure, restarts).",
    )(serve)
