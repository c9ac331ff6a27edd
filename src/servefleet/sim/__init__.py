"""A simulated OpenAI-compatible inference engine for tests, benchmarks and the no-GPU demo.

It prints a real SGLang or vLLM start-up log (``--style``), serves ``/v1/completions`` and
``/v1/chat/completions`` (streaming too), ``/v1/models``, ``/health``, ``/metrics`` and SGLang's
``/server_info``, models continuous batching (one scheduler loop; by default realistic timing, where
throughput peaks below max running and declines past it and streamed events cost the API process;
``--timing knee`` for the old flat knee; formula in :mod:`servefleet.sim.theory`), and injects faults: start-up failures with each engine's
real text, hangs, crashes, slow and failing requests. It exists for tests and demos; it never
replaces supporting the real engines.

Run it with ``python -m servefleet.sim --help`` or ``servefleet sim --help``. :func:`transcript` renders,
in-process, the exact start-up text a configuration prints (every failure of every style) for tests
of log classifiers.
"""

from servefleet.sim.config import SimConfig
from servefleet.sim.script import transcript
from servefleet.sim.theory import SteadyState, steady_state, steps_per_request, theoretical_output_tokens_per_s

__all__ = [
    "SimConfig",
    "SteadyState",
    "steady_state",
    "steps_per_request",
    "theoretical_output_tokens_per_s",
    "transcript",
]
