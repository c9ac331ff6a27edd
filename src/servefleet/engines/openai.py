"""Any OpenAI-compatible server started by the user's own command (``engine = "openai"``).

servefleet knows nothing engine-specific here: the command runs verbatim (``command`` in the
fleet file, then ``args``), readiness is the path the user names (``ready_path``, else
``/v1/models``), and only the engine-independent signatures apply (CUDA out of memory, port in use,
import errors, ...). Put ``--port`` etc. in the command yourself: servefleet does not rewrite it,
but reads the common spellings (``--port``, ``--host``, ``--served-model-name``) from the command
and the args, so a port there that differs from the fleet file's is caught before launch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from servefleet.capacity import Capacity
from servefleet.engines import native_args as na
from servefleet.engines.base import EngineProfile, LaunchSpec, Probe, Signature
from servefleet.engines.generic import as_int, build_signatures, first_model
from servefleet.errors import EngineError

if TYPE_CHECKING:
    from servefleet.http import HttpClient

__all__ = ["OpenAIEngine"]

S = Signature

OWN_SIGNATURES = (
    # uvicorn (FastAPI servers): "Uvicorn running on http://..." is printed after the socket is
    # bound; "Application startup complete." before it (a port conflict follows it).
    S.ready(r"Uvicorn running on (?:http|unix|socket)"),
    S.progress(
        r"Application startup complete\.|Waiting for application startup|Started server process",
        "HTTP server starting",
    ),
)

# The spellings most OpenAI-compatible servers share (vLLM's, SGLang's, uvicorn apps').
ARGS = na.ArgTable(
    na.Flag(("--port",), "port", na.to_int),
    na.Flag(("--host",), "host"),
    na.Flag(("--served-model-name",), "served_model_name", many=True),
)


class OpenAIEngine(EngineProfile):
    name: ClassVar[str] = "openai"
    probe: ClassVar[Probe] = Probe(("/v1/models",))
    signatures: ClassVar[tuple[Signature, ...]] = build_signatures(OWN_SIGNATURES)
    detect: ClassVar[tuple[re.Pattern[str], ...]] = ()  # anything can be behind it: never guessed
    memory_flag: ClassVar[str | None] = None
    supports_ignore_eos: ClassVar[bool] = False
    arg_table: ClassVar[na.ArgTable] = ARGS

    def native_args(self, args: Sequence[str], command: Sequence[str] = ()) -> na.NativeArgs:
        """The user's command carries the server's flags as much as the args do."""
        return super().native_args([*command, *args], command)

    def build_argv(self, spec: LaunchSpec) -> list[str]:
        """``command`` verbatim, then the extra args."""
        if not spec.command:
            raise EngineError('the openai engine runs your own command; set command = ["...", "..."] for the server')
        self.launch_args(spec)  # a --port in the command that is not the fleet file's port: an error
        return [*spec.command, *spec.extra_args]

    def probe_for(self, spec: LaunchSpec | None) -> Probe:
        if spec is not None and spec.ready_path:
            path = spec.ready_path if spec.ready_path.startswith("/") else "/" + spec.ready_path
            return Probe((path,))
        return self.probe

    async def capacity_from_server(self, client: HttpClient, base_url: str) -> Capacity:
        """Only what ``/v1/models`` says: the served name and, where listed, ``max_model_len``."""
        model = first_model(await client.get_json(base_url.rstrip("/") + "/v1/models"))
        facts: dict[str, Any] = {}
        if model:
            if isinstance(model.get("id"), str):
                facts["served_model"] = model["id"]
            if as_int(model.get("max_model_len")):
                facts["context_length"] = as_int(model["max_model_len"])
        return Capacity(**facts, source={k: "endpoint:/v1/models" for k in facts}) if facts else Capacity()
