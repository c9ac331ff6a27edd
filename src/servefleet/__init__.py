"""servefleet: launch, verify, benchmark and drive fleets of LLM inference servers."""

__version__ = "0.1.0"
