"""``python -m servefleet.sim [options]``: run the simulated engine (see ``--help``)."""

from __future__ import annotations

import json
import sys

from servefleet.sim.cli_args import parse_args
from servefleet.sim.startup import run
from servefleet.sim.theory import dry_run_report


def main(argv: list[str] | None = None) -> int:
    config, flags = parse_args(sys.argv[1:] if argv is None else argv)
    if flags.dry_run:
        print(json.dumps(dry_run_report(config), indent=2))
        return 0
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
