"""Every message that crosses a process boundary, as small dataclasses.

    main (TokenizerManager) --GenerateRequest / AbortRequest / ControlRequest--> scheduler
    scheduler --TokenUpdates / ControlReply / SchedulerReady / RequestFailed--> detokenizer
    detokenizer --TextUpdates (and everything else, passed through in order)--> main

They travel pickled over ZMQ `ipc://` sockets in a private 0700 directory (see `ipc.py`); a
pickle from a stranger is code execution, so nothing here is ever read from a network socket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langrt.sampling.sampling_params import SamplingParams
from langrt.server_args import ServerArgs

# ---- main -> scheduler ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RequestOptions:
    """What a request's answer carries besides its text, set once per request."""

    return_logprob: bool = False
    logprob_start_len: int = -1  # first prompt position with a logprob; -1: output only
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    lora_path: str | None = None  # the name of the LoRA adapter to run under (None: the base model)


@dataclass(frozen=True)
class GenerateRequest:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    options: RequestOptions = RequestOptions()


@dataclass(frozen=True)
class AbortRequest:
    rid: str
    message: str = "aborted by the client"


@dataclass(frozen=True)
class ControlRequest:
    """Requests answered by a ControlReply with the same `request_id` (one in flight per kind)."""

    kind: str  # "flush_cache" | "server_info"
    request_id: int


@dataclass(frozen=True)
class LoraRequest:
    """Load (`path` given) or unload a LoRA adapter; answered by a ControlReply of kind "lora"
    whose payload is {"adapters": {name: path}} or {"error": message}."""

    request_id: int
    name: str
    path: str | None = None


@dataclass(frozen=True)
class EmbedRequest:
    """Embed each of `inputs` (token ids) with the --is-embedding model; answered by a ControlReply
    of kind "embed" whose payload is {"embeddings": float32 array [N, D], "cached_tokens": [int] (per input),
    "normalized": bool (unit-length vectors)} or {"error": message}."""

    request_id: int
    inputs: list[list[int]]


@dataclass(frozen=True)
class SnapshotRequest:
    """Asks the scheduler for the dashboard's state (scheduler/snapshot.py), answered by a
    SnapshotReply with the same `request_id`. The bounds keep it cheap to compute and send."""

    request_id: int
    max_nodes: int = 200  # radix tree nodes, the largest first
    max_depth: int = 16
    max_requests: int = 64  # of the running batch, and of the waiting queue

    def __post_init__(self):
        assert self.max_nodes >= 0 and self.max_depth >= 1 and self.max_requests >= 0


# ---- scheduler -> detokenizer -> main -------------------------------------------------------


@dataclass(frozen=True)
class SchedulerReady:
    """Sent once the model is loaded: what the main process needs to validate requests."""

    args: ServerArgs  # with every `auto` resolved
    context_len: int
    vocab_size: int
    max_total_tokens: int
    max_running_requests: int


@dataclass(frozen=True)
class DecodeSettings:
    """How a request's ids become text; sent with its first update."""

    prompt_tail: list[int]
    skip_special_tokens: bool
    spaces_between_special_tokens: bool
    stop_hold_chars: int  # text withheld from streams: a stop string may still start there


@dataclass
class TokenUpdate:
    """One request's progress since its previous update."""

    rid: str
    new_ids: list[int]  # output ids since the last update
    visible_new_ids: list[int]  # those to detokenize (a matched stop token is not)
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    spec_accepted_tokens: int | None = None  # speculative drafts kept so far (None: speculation off)
    settings: DecodeSettings | None = None  # first update only
    finish_reason: dict[str, Any] | None = None
    text_end: int | None = None  # at finish: cut the output text here (a stop string matched)
    input_logprobs: list[tuple[float | None, int, list | None]] = field(default_factory=list)
    output_logprobs: list[tuple[float, int, list | None]] = field(default_factory=list)


@dataclass
class TokenUpdates:
    updates: list[TokenUpdate]


@dataclass
class TextUpdate:
    """TokenUpdate plus the text the new ids add (`text_delta`), from the detokenizer."""

    token: TokenUpdate
    text_delta: str


@dataclass
class TextUpdates:
    updates: list[TextUpdate]


@dataclass(frozen=True)
class ControlReply:
    kind: str
    request_id: int
    payload: Any


@dataclass(frozen=True)
class RequestFailed:
    """The scheduler refused or lost a request; `status` is the HTTP status to report."""

    rid: str
    message: str
    status: int = 400
    param: str | None = None


@dataclass(frozen=True)
class SnapshotReply:
    """The scheduler's state for the dashboard, and what its loop has spent: seconds in steps
    (`busy_s`, over `steps`) and in snapshots (`snapshot_s`, this one included)."""

    request_id: int
    state: dict[str, Any]
    busy_s: float
    steps: int
    snapshot_s: float
