"""What to send: prompts of controlled length, or a sample of the real job, as encoded bodies.

Random prompts are built from common short English words, each about one token in BPE
vocabularies, then measured with a :class:`TokenCounter` and corrected until they hit the
requested token count: the server's ``/tokenize`` when it has one (vLLM, SGLang, llama.cpp,
TGI: each engine profile's ``tokenize`` says how it is asked), a local Hugging Face tokenizer
when given, otherwise a words-as-tokens approximation (and the run says so). Lengths can vary
uniformly around the target (``--input-len-range 0.2``).

A dataset is a JSONL or Parquet file with one prompt per row: ``prompt`` (or ``text``) or
``messages`` (chat), and optionally ``max_tokens``/``output_len`` for the output length.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from servefleet.bench.client import PreparedRequest
from servefleet.engines.registry import tokenize_endpoints
from servefleet.errors import ConfigError
from servefleet.http import HttpClient, TransportError

if TYPE_CHECKING:
    from servefleet.engines.base import TokenizeEndpoint

__all__ = [
    "Prompt",
    "TokenCounter",
    "ServerTokenizer",
    "LocalTokenizer",
    "WordCounter",
    "random_prompts",
    "load_dataset",
    "encode_bodies",
    "find_server_tokenizer",
]

_JSON = {"Content-Type": "application/json"}

_WORDS = (
    "the of and to in is was for on that with as by at from his it an are this which be or had "
    "not but one they their all were her she there been has have when who will more no if out so "
    "said what up its about into than them can only other new some could time these two may then "
    "do first any my now such like our over man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people how "
    "too little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since "
    "against go came right used take three"
).split()


@dataclass(frozen=True)
class Prompt:
    text: str | None = None  # completions prompt / single user message
    messages: list[dict[str, Any]] | None = None  # chat messages from a dataset
    input_tokens: int | None = None  # as counted (None: unknown)
    output_tokens: int = 128  # max_tokens


class TokenCounter(Protocol):
    name: str
    exact: bool

    async def count(self, texts: Sequence[str]) -> list[int]: ...


class WordCounter:
    """Approximation when nothing better exists: one token per word of the built vocabulary."""

    name = "words"
    exact = False

    async def count(self, texts: Sequence[str]) -> list[int]:
        return [len(t.split()) for t in texts]


class LocalTokenizer:
    """A Hugging Face tokenizer from a local path (``--tokenizer``); needs ``transformers``."""

    exact = True

    def __init__(self, path: str) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigError("--tokenizer needs the 'serve' extra (transformers)") from exc
        self.name = f"tokenizer:{path}"
        if not Path(path).exists():
            raise ConfigError(
                f"--tokenizer {path}: no such folder (give a local tokenizer folder, with its tokenizer.json "
                "or tokenizer_config.json; nothing is downloaded)"
            )
        try:
            self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as exc:  # a folder without tokenizer files, a damaged one
            raise ConfigError(
                f"--tokenizer {path}: not a tokenizer folder ({str(exc).splitlines()[0][:200]})"
            ) from None

    async def count(self, texts: Sequence[str]) -> list[int]:
        return [len(self._tok.encode(t, add_special_tokens=False)) for t in texts]


class ServerTokenizer:
    """The server's own token count, asked the way its engine profile says (``endpoint``)."""

    exact = True

    def __init__(
        self, client: HttpClient, base_url: str, model: str | None, endpoint: TokenizeEndpoint, parallel: int = 16
    ) -> None:
        self.client = client
        self.url = base_url.rstrip("/") + endpoint.path
        self.model = model
        self.endpoint = endpoint
        self.name = f"server:{endpoint.path} ({endpoint.label})"
        self._sem = asyncio.Semaphore(parallel)

    async def _one(self, text: str) -> int:
        async with self._sem:
            resp = await self.client.post(self.url, orjson.dumps(self.endpoint.body(text, self.model)), headers=_JSON)
        if not resp.ok:
            raise ValueError(f"{self.endpoint.path} answered HTTP {resp.status}")
        return self.endpoint.count(resp.json())

    async def count(self, texts: Sequence[str]) -> list[int]:
        return list(await asyncio.gather(*(self._one(t) for t in texts)))


async def find_server_tokenizer(
    client: HttpClient, base_url: str, model: str | None, engine: str | None
) -> ServerTokenizer | None:
    """The first token-counting request of ``engine`` (``engines.registry.tokenize_endpoints``: every
    known engine's when it is None) the server answers sensibly, or None."""
    for endpoint in tokenize_endpoints(engine):
        tok = ServerTokenizer(client, base_url, model, endpoint)
        try:
            counts = await asyncio.wait_for(tok.count(["the of and to in"]), timeout=10)
        except (TimeoutError, TransportError, KeyError, TypeError, ValueError, AttributeError):
            continue
        if counts and 1 <= counts[0] <= 20:
            return tok
    return None


def _length(rng: random.Random, target: int, spread: float) -> int:
    if spread <= 0:
        return target
    lo, hi = max(1, round(target * (1 - spread))), max(1, round(target * (1 + spread)))
    return rng.randint(lo, hi)


async def random_prompts(
    n: int,
    input_len: int,
    output_len: int,
    counter: TokenCounter,
    *,
    input_range: float = 0.0,
    output_range: float = 0.0,
    seed: int = 0,
    rounds: int = 4,
) -> list[Prompt]:
    """``n`` distinct prompts of (about) ``input_len`` tokens, counted by ``counter``.

    Each round measures every prompt still off target and adds or drops words by the
    difference; after ``rounds`` the last measured count is recorded as the prompt's length.
    """
    if input_len < 1 or output_len < 1:
        raise ConfigError("--input-len and --output-len must be at least 1")
    rng = random.Random(seed)
    targets = [_length(rng, input_len, input_range) for _ in range(n)]
    outputs = [_length(rng, output_len, output_range) for _ in range(n)]
    words = [[rng.choice(_WORDS) for _ in range(t)] for t in targets]
    counts: list[int | None] = [None] * n
    todo = list(range(n))
    for _ in range(rounds):
        if not todo:
            break
        measured = await counter.count([" ".join(words[i]) for i in todo])
        still = []
        for i, c in zip(todo, measured, strict=True):
            counts[i] = c
            diff = targets[i] - c
            if diff > 0:
                words[i].extend(rng.choice(_WORDS) for _ in range(diff))
                still.append(i)
            elif diff < 0 and len(words[i]) > 1:
                del words[i][max(1, len(words[i]) + diff) :]
                still.append(i)
        todo = still
        if not counter.exact:
            break
    if todo and counter.exact:  # the last corrections were not measured yet
        measured = await counter.count([" ".join(words[i]) for i in todo])
        for i, c in zip(todo, measured, strict=True):
            counts[i] = c
    return [
        Prompt(text=" ".join(w), input_tokens=c, output_tokens=o)
        for w, c, o in zip(words, counts, outputs, strict=True)
    ]


def load_dataset(path: str | Path, n: int, output_len: int | None, seed: int = 0) -> list[Prompt]:
    """``n`` prompts sampled (with a fixed seed) from a JSONL or Parquet file; cycled if fewer."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: dataset not found")
    rows: list[dict[str, Any]]
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        # from an Arrow buffer, in this thread: Arrow's pools can abort the process at exit (plan/check.py)
        rows = pq.ParquetFile(pa.BufferReader(path.read_bytes())).read(use_threads=False).to_pylist()
    else:
        rows = []
        with path.open() as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{lineno}: not JSON ({exc.msg})") from exc
    prompts = []
    for i, row in enumerate(rows):
        text = row.get("prompt", row.get("text"))
        messages = row.get("messages")
        if not isinstance(text, str) and not isinstance(messages, list):
            raise ConfigError(f"{path}: row {i + 1} has no 'prompt', 'text' or 'messages'")
        out = row.get("max_tokens") or row.get("output_len") or row.get("output_tokens") or output_len
        if not out:
            raise ConfigError(f"{path}: row {i + 1} has no output length; give --output-len")
        prompts.append(
            Prompt(
                text=text if isinstance(text, str) else None,
                messages=messages if isinstance(messages, list) else None,
                input_tokens=row.get("input_tokens"),
                output_tokens=int(out),
            )
        )
    if not prompts:
        raise ConfigError(f"{path}: no prompts")
    rng = random.Random(seed)
    rng.shuffle(prompts)
    return [prompts[i % len(prompts)] for i in range(n)]


def encode_bodies(
    prompts: Sequence[Prompt],
    *,
    api: str,
    model: str | None,
    stream: bool,
    options: dict[str, Any],
    start_index: int = 0,
    max_tokens: int | None = None,
) -> list[PreparedRequest]:
    """JSON bodies, encoded once before any point runs (``options``: ignore_eos, stream_options,
    temperature and any ``--extra-body``). ``max_tokens`` overrides the prompts' (warm-up)."""
    out = []
    for i, p in enumerate(prompts):
        body: dict[str, Any] = {}
        if model:
            body["model"] = model
        if api == "chat":
            body["messages"] = p.messages if p.messages is not None else [{"role": "user", "content": p.text or ""}]
        else:
            body["prompt"] = p.text if p.text is not None else _flatten(p.messages or [])
        tokens = max_tokens or p.output_tokens
        body["max_tokens"] = tokens
        if stream:
            body["stream"] = True
        body.update(options)
        out.append(
            PreparedRequest(
                index=start_index + i,
                body=json.dumps(body, separators=(",", ":")).encode(),
                input_tokens=p.input_tokens,
                max_tokens=tokens,
            )
        )
    return out


def _flatten(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content", "")) for m in messages)
