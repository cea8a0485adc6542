"""ServerArgs: every runtime setting, its default, and its validation, in one frozen dataclass.

`auto` values are resolved once by `resolve()` into a new object; nothing mutates an instance.
The CLI is generated from the fields' metadata so flags and fields cannot drift.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass, field

from langrt import envs

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float16", "bfloat16")
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
MODEL_IMPLS = ("auto", "langrt", "transformers")  # langrt/model/registry.py resolves them
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton")
QUANTIZATIONS = ("auto", "none", "int8", "int4", "fp8")
SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs", "random")
GRAMMAR_BACKENDS = ("langrt", "xgrammar", "llguidance")
# backend -> (module to import, what to install); langrt's needs nothing more
GRAMMAR_PACKAGES = {"xgrammar": ("xgrammar", "xgrammar==0.2.7"), "llguidance": ("llguidance", "llguidance>=1.9")}
REASONING_PARSERS = ("qwen3", "deepseek-r1")  # constrained/reasoning_syntax.PARSERS
SPECULATIVE_ALGORITHMS = ("NGRAM", "DRAFT")
# Drafts per request and pass at most, per algorithm (--speculative-num-draft-tokens overrides).
# Why 16 for n-grams: a pass of 17 rows costs about 1.5x one of 9 (SmolLM2, bf16, 2 cores) while
# a copy that holds keeps twice the tokens; bench_speculative's extraction workload ran 1.86x vs
# no drafts with 16, 1.72x with 8 (same run order, batch 1), even at batch 4 (1.44x / 1.41x), and
# text with nothing to copy about the same (1.23x / 1.24x): the adaptive length keeps misses short.
# Why 8 for a draft model: each draft is a step of the draft model, run one after another.
SPEC_DRAFT_TOKENS = {"NGRAM": 16, "DRAFT": 8}


def _flag(help: str, choices: tuple[str, ...] | None = None, **kw):
    return field(metadata={"help": help, "choices": choices}, **kw)


@dataclass(frozen=True)
class ServerArgs:
    model_path: str | None = _flag(
        "HF model directory or .gguf file (default: the built-in SmolLM2-135M-Instruct)", default=None
    )
    tokenizer_path: str | None = _flag("tokenizer directory or .gguf file (default: the model's)", default=None)
    load_format: str = _flag("weights format; dummy = seeded random weights", LOAD_FORMATS, default="auto")
    model_impl: str = _flag(
        "code that runs the model: langrt = its native module (docs/models.md lists them); transformers = the model's own transformers code with langrt's paged attention (any causal LM transformers has; no --tp-size or --quantization int8/int4); auto = native where langrt has the architecture, else transformers",
        MODEL_IMPLS,
        default="auto",
    )
    dtype: str = _flag(
        "serving dtype; auto = bfloat16 where the device runs it fast, else float32/float16", DTYPES, default="auto"
    )
    device: str = _flag("auto = cuda when present, else cpu", DEVICES, default="auto")
    attention_backend: str = _flag(
        "attention implementation; auto = triton on cuda, cpu (torch with langrt's C++ kernel for decode rows) on cpu",
        ATTENTION_BACKENDS,
        default="auto",
    )
    context_length: int | None = _flag(
        "maximum tokens per request (prompt + output); default: the model's", default=None
    )
    max_total_tokens: int | None = _flag("KV pool size in tokens; default: from --mem-fraction-static", default=None)
    mem_fraction_static: float | None = _flag(
        "fraction of free device memory (CPU: available RAM) for the KV pool; default 0.85 cuda, 0.1 cpu", default=None
    )
    max_running_requests: int | None = _flag(
        "requests decoded together at most; default 256 cpu, 1024 cuda", default=None
    )
    chunked_prefill_size: int | None = _flag(
        "prompt tokens computed per forward pass at most; longer prompts are prefilled in chunks (-1: no limit); default 8192 cuda, 2048 cpu",
        default=None,
    )
    disable_radix_cache: bool = _flag("do not reuse KV across requests (the baseline for benchmarks)", default=False)
    hicache_size: float = _flag(
        "GB of host memory for K/V the radix cache evicts, loaded back when a request's prefix returns instead of computed again (0: none; docs/hicache.md)",
        default=0.0,
    )
    hicache_dir: str | None = _flag(
        "directory for a disk tier below --hicache-size: evicted K/V written as checked files, found again after a restart (keyed by the model's files and settings and the token prefix; docs/hicache.md)",
        default=None,
    )
    hicache_disk_size: float = _flag(
        "GB the --hicache-dir files may take at most (least recently used removed first)", default=16.0
    )
    grammar_compile_timeout: float = _flag(
        "seconds a grammar may take to compile before its request fails (a regex whose automaton explodes)",
        default=10.0,
    )
    grammar_backend: str = _flag(
        "engine for regex / json_schema / ebnf / choices / structural_tag constraints: langrt's own (the only one with jump-forward), or the xgrammar or llguidance package (docs/grammar_backends.md)",
        GRAMMAR_BACKENDS,
        default="langrt",
    )
    reasoning_parser: str | None = _flag(
        "reasoning models: split the output's thinking (<think>...</think>) into reasoning_content on /v1/chat/completions, and hold response_format / regex / tool-call grammars to the answer after it (qwen3, deepseek-r1; docs/reasoning.md)",
        default=None,
    )
    lora_paths: tuple[str, ...] = _flag(
        "LoRA adapters to serve beside the base model, each NAME=DIR (a PEFT adapter directory: adapter_config.json + adapter_model.safetensors) or DIR (named DIR); a request picks one with lora_path (native) or model='BASE:NAME' (OpenAI); docs/lora.md",
        default=(),
    )
    max_loras_per_batch: int = _flag(
        "different LoRA adapters one forward pass holds at most (requests for others wait for a later pass)", default=8
    )
    disable_jump_forward: bool = _flag(
        "decode grammar-forced text token by token instead of appending it in one step", default=False
    )
    disable_mask_prefetch: bool = _flag(
        "compute constrained requests' token masks after each forward pass instead of on a thread during it",
        default=False,
    )
    speculative_algorithm: str | None = _flag(
        "speculative decoding: NGRAM = drafts copied from where the request's last tokens occurred before (its prompt and output, recent outputs); DRAFT = drafts a smaller model with the same tokenizer generates (--speculative-draft-model-path); verified in the next pass, outputs are what they would be without it (docs/architecture.md)",
        default=None,
    )
    speculative_draft_model_path: str | None = _flag(
        "the draft model of --speculative-algorithm DRAFT: an HF directory or .gguf file of a model with the target's tokenizer",
        default=None,
    )
    speculative_num_draft_tokens: int | None = _flag(
        "drafts per request and pass at most (with --speculative-algorithm; each request's length adapts below it to how its drafts fare; default 16 for NGRAM, 8 for DRAFT)",
        default=None,
    )
    schedule_policy: str = _flag("admission order of waiting requests", SCHEDULE_POLICIES, default="lpm")
    max_queued_requests: int = _flag(
        "requests waiting beyond the running batch at most; more get HTTP 503", default=4096
    )
    host: str = _flag("HTTP address to bind (127.0.0.1: this machine only)", default="127.0.0.1")
    port: int = _flag("HTTP port", default=30000)
    api_key: str | None = _flag("require 'Authorization: Bearer KEY' on every route but /health", default=None)
    served_model_name: str | None = _flag(
        "model name reported by the OpenAI API (default: the model path)", default=None
    )
    chat_template: str | None = _flag(
        "chat template for /v1/chat/completions: a name (chatml, llama-3-instruct, qwen, default) or a .jinja file (default: the tokenizer's)",
        default=None,
    )
    max_request_bytes: int = _flag("largest HTTP request body accepted; larger get 413", default=16 * 1024 * 1024)
    body_read_timeout: float = _flag(
        "seconds a client may take to send its request body; slower ones get 408 (a stalled upload must not hold a connection forever)",
        default=30.0,
    )
    tp_size: int = _flag(
        "tensor parallel ranks: the model's heads, MLP rows and vocabulary split over N processes (torch.distributed: gloo on CPU, NCCL on CUDA, one GPU each); rank 0 schedules, the others run their part of each pass (langrt/parallel/)",
        default=1,
    )
    dp_size: int = _flag(
        "data parallel replicas: N whole servers (each its own scheduler, KV pool and radix cache) on private ports behind a cache-aware router on --port (langrt/router/)",
        default=1,
    )
    quantization: str = _flag(
        "weight format; auto = a GGUF file's Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and Q2_K-Q6_K blocks served as stored on CPU (where langrt's kernels build), else weights in --dtype; none = always --dtype; int8 / int4 = plain weights quantized at load (CPU) to int8 / int4 in groups of 32 (the LM head at int8); fp8 = not on CPUs",
        QUANTIZATIONS,
        default="auto",
    )
    cpu_dense_copy: bool = _flag(
        "also keep a bfloat16 copy of every quantized matrix (GGUF blocks, --quantization int8/int4) for prompts and passes of many rows in bfloat16 on CPU: oneDNN's GEMM on it is faster where the CPU has AVX512-BF16/AMX, at 2 bytes a weight beside the blocks (~3 GB for a 1.5B model, 3.5x a Q4_K_M file); without it those passes multiply the blocks (skipped where the copies exceed a quarter of the available RAM)",
        default=False,
    )
    enable_torch_compile: bool = _flag(
        "compile each layer's attention-free halves with torch.compile (slower start; see benchmarks/README.md for when it pays)",
        default=False,
    )
    disable_cuda_graph: bool = _flag(
        "decode without CUDA graphs (on CUDA with --attention-backend triton, each decode batch size up to --cuda-graph-max-bs is captured once at start and replayed, taking the step's kernel launches off the host)",
        default=False,
    )
    cuda_graph_max_bs: int | None = _flag(
        "largest decode batch replayed as a CUDA graph (smaller ones are padded to the next captured size; larger ones run eagerly); default 160, at most --max-running-requests",
        default=None,
    )
    random_seed: int = _flag("seed for dummy weights and unseeded sampling", default=0)
    num_threads: int | None = _flag(
        "torch CPU threads in each model process (each tensor-parallel rank); default: the cores it may use, shared out over the --tp-size ranks",
        default=None,
    )
    disable_malloc_tuning: bool = _flag(
        "leave the C allocator of the model process at its defaults (by default it keeps freed memory for the next pass, so CPU passes stop refaulting their activations; it holds on to its peak heap)",
        default=False,
    )
    disable_dashboard: bool = _flag(
        "do not serve the live dashboard (GET /dashboard, /dashboard/state, /dashboard/events; docs/dashboard.md)",
        default=False,
    )
    is_embedding: bool = _flag(
        "serve embeddings (/v1/embeddings, /encode, Engine.encode) instead of generation: encoder models (BERT family) always, decoder models with --pooling (docs/embeddings.md)",
        default=False,
    )
    pooling: str | None = _flag(
        "how --is-embedding pools a model's hidden states: last (token), mean, cls; default: the model directory's sentence-transformers settings, else mean for encoders and last for decoders",
        ("last", "mean", "cls", None),
        default=None,
    )
    log_level: str = _flag("logging level", ("debug", "info", "warning", "error"), default="info")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value not in choices:
                raise ValueError(f"--{_flag_name(f.name)} must be one of {', '.join(choices)}; got {value!r}")
        _check_positive(
            self,
            "context_length",
            "max_total_tokens",
            "max_running_requests",
            "num_threads",
            "max_request_bytes",
            "dp_size",
            "tp_size",
            "cuda_graph_max_bs",
        )
        if not self.body_read_timeout > 0:
            raise ValueError(f"--body-read-timeout must be positive; got {self.body_read_timeout}")
        if self.max_queued_requests < 0:
            raise ValueError(f"--max-queued-requests must be >= 0; got {self.max_queued_requests}")
        if self.chunked_prefill_size is not None and (self.chunked_prefill_size == 0 or self.chunked_prefill_size < -1):
            raise ValueError(f"--chunked-prefill-size must be positive or -1; got {self.chunked_prefill_size}")
        if self.quantization == "fp8":
            raise ValueError(
                "--quantization fp8: CPUs have no fp8 arithmetic and langrt has no fp8 GPU path yet; "
                "use --quantization int8 or int4 (CPU)"
            )
        if self.quantization in ("int8", "int4") and self.enable_torch_compile:
            raise ValueError(
                f"--quantization {self.quantization} and --enable-torch-compile: the compiled layers take plain weights; choose one"
            )
        if not 0 < self.port < 65536:
            raise ValueError(f"--port must be in 1..65535; got {self.port}")
        if not self.grammar_compile_timeout > 0:
            raise ValueError(f"--grammar-compile-timeout must be positive; got {self.grammar_compile_timeout}")
        missing = _missing_grammar_package(self.grammar_backend)
        if missing is not None:
            raise ValueError(missing)
        _check_speculative(self)
        _check_hicache(self)
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}; got {self.reasoning_parser!r}"
            )
        _check_positive(self, "max_loras_per_batch")
        self.lora_adapters  # a malformed --lora-paths entry fails here, before the model loads
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise ValueError(f"--mem-fraction-static must be in (0, 1); got {self.mem_fraction_static}")

    @property
    def lora_adapters(self) -> list[tuple[str, str]]:
        """--lora-paths as (name, directory) pairs; a bare DIR is named DIR."""
        pairs = [tuple(p.split("=", 1)) if "=" in p else (p, p) for p in self.lora_paths]
        for name, path in pairs:
            if not name or not path:
                raise ValueError(f"--lora-paths entries are NAME=DIR or DIR; got {name}={path!r}")
        names = [n for n, _ in pairs]
        if len(set(names)) != len(names):
            raise ValueError(f"--lora-paths names an adapter twice: {', '.join(sorted(names))}")
        return pairs

    def resolve(self) -> "ServerArgs":
        """A copy with device, dtype, attention backend, threads and memory fraction made concrete."""
        import torch

        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for, but torch sees no CUDA device")
        if device == "cuda" and self.tp_size > 1 and self.tp_size > torch.cuda.device_count():
            raise ValueError(
                f"--tp-size {self.tp_size} on CUDA needs a GPU per rank; torch sees {torch.cuda.device_count()}"
            )
        dtype = self.dtype if self.dtype != "auto" else _best_dtype(device)
        if self.quantization in ("int8", "int4") and (device != "cpu" or dtype not in ("float32", "bfloat16")):
            raise ValueError(
                f"--quantization {self.quantization} runs langrt's CPU kernels, with float32 or bfloat16 activations; "
                f"got --device {device} --dtype {dtype}"
            )
        return dataclasses.replace(
            self,
            device=device,
            dtype=dtype,
            attention_backend=_attention_backend(self.attention_backend, device),
            mem_fraction_static=self.mem_fraction_static or (0.85 if device == "cuda" else 0.1),
            max_running_requests=self.max_running_requests or (1024 if device == "cuda" else 256),
            chunked_prefill_size=self.chunked_prefill_size or (8192 if device == "cuda" else 2048),
            num_threads=self.num_threads or max(1, _cores() // self.tp_size),
        )

    def to_json(self) -> dict:
        """Every setting, for /get_server_info (the API key itself is never reported)."""
        out = dataclasses.asdict(self)
        out["api_key"] = "<set>" if self.api_key else None
        return out

    @property
    def torch_dtype(self):
        import torch

        assert self.dtype != "auto", "resolve() first"
        return getattr(torch, self.dtype)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _flag_name(name: str) -> str:
    return name.replace("_", "-")


def _missing_grammar_package(backend: str) -> str | None:
    """Why `backend` cannot run here (its package is not installed), or None. Cheap: nothing is
    imported, so a missing package stops `langrt launch` before any process starts."""
    if backend not in GRAMMAR_PACKAGES:
        return None
    module, install = GRAMMAR_PACKAGES[backend]
    if importlib.util.find_spec(module) is not None:
        return None
    return f"--grammar-backend {backend} needs the {module} package, which is not installed: pip install '{install}'"


def _check_positive(args: ServerArgs, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ValueError(f"--{_flag_name(name)} must be positive; got {value}")


def _check_speculative(args: ServerArgs) -> None:
    algorithm = args.speculative_algorithm
    if algorithm is not None and algorithm not in SPECULATIVE_ALGORITHMS:
        raise ValueError(
            f"--speculative-algorithm {algorithm}: langrt has {', '.join(SPECULATIVE_ALGORITHMS)} "
            "(EAGLE is not implemented)"
        )
    if (algorithm == "DRAFT") != (args.speculative_draft_model_path is not None):
        raise ValueError(
            "--speculative-algorithm DRAFT needs --speculative-draft-model-path (a smaller model with the same tokenizer), "
            "and --speculative-draft-model-path needs --speculative-algorithm DRAFT"
        )
    if args.speculative_num_draft_tokens is None and algorithm is not None:  # the algorithm's default
        object.__setattr__(args, "speculative_num_draft_tokens", SPEC_DRAFT_TOKENS[algorithm])
    if args.speculative_num_draft_tokens is not None and args.speculative_num_draft_tokens < 1:
        raise ValueError(f"--speculative-num-draft-tokens must be positive; got {args.speculative_num_draft_tokens}")


def _check_hicache(args: ServerArgs) -> None:
    if args.hicache_size < 0 or not args.hicache_disk_size > 0:
        raise ValueError(
            f"--hicache-size must be >= 0 and --hicache-disk-size positive; got {args.hicache_size}, {args.hicache_disk_size}"
        )
    if not args.hicache_size and args.hicache_dir is None:
        return
    if args.disable_radix_cache:
        raise ValueError(
            "--hicache-size / --hicache-dir keep what the radix cache evicts; they need it: drop --disable-radix-cache"
        )
    if args.tp_size > 1:
        raise ValueError(
            "--hicache-size / --hicache-dir: the tiers copy one pool's K/V, not tensor-parallel ranks' parts; use --tp-size 1"
        )


def _attention_backend(asked: str, device: str) -> str:
    """auto: the Triton kernels on CUDA (when triton is installed); on CPU the cpu backend
    (langrt's C++ kernel where the CPU has AVX-512 or AVX2; plain torch where not). The Triton backend runs on CPU only in Triton's interpreter (TRITON_INTERPRET=1),
    which tests use."""
    import importlib.util

    if asked == "auto":
        if device == "cuda":
            return "triton" if importlib.util.find_spec("triton") is not None else "torch"
        return "cpu" if device == "cpu" else "torch"
    if asked == "triton" and device == "cpu" and envs.TRITON_INTERPRET.get() != "1":
        raise ValueError(
            "--attention-backend triton needs --device cuda; on CPU use --attention-backend cpu or torch "
            "(or set TRITON_INTERPRET=1 to run the kernels in Triton's interpreter, for tests)"
        )
    return asked


def _best_dtype(device: str) -> str:
    """bfloat16 where matmuls run natively in it (CUDA sm80+, CPUs with AVX512-BF16 or AMX)."""
    import torch

    if device == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    from langrt.cpu_features import fast_bf16

    return "bfloat16" if fast_bf16() else "float32"
