"""The adapters a server holds, by name: loaded at start-up (--lora-paths) or at run time
(/load_lora_adapter), unloaded at run time (/unload_lora_adapter).

A request names its adapter; the scheduler resolves the name here once, when the request
arrives, and the request keeps the LoraAdapter object: unloading an adapter refuses new
requests for it while those already admitted finish with the weights they started with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from langrt.errors import InvalidRequest
from langrt.lora.adapter import LoraAdapter, LoraError, load_adapter
from langrt.model.lora_layer import supports


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    path: str
    rank: int
    targets: tuple[str, ...]


class LoraRegistry:
    def __init__(self, runner, max_per_batch: int):
        """`runner`: the ModelRunner whose model the adapters extend (read when one loads)."""
        assert max_per_batch >= 1, "--max-loras-per-batch must be >= 1"
        self._runner = runner
        self.max_per_batch = max_per_batch
        self._adapters: dict[str, LoraAdapter] = {}
        self._loads = 0  # adapters loaded so far: each load's cache namespace

    @classmethod
    def for_runner(cls, runner, args) -> "LoraRegistry":
        """The registry of a ModelRunner's model, holding --lora-paths' adapters."""
        registry = cls(runner, args.max_loras_per_batch)
        for name, path in args.lora_adapters:
            registry.load(name, path)
        return registry

    def within_cap(self, candidates: list, running: list) -> list:
        """The candidate requests (in order) an admission round may take so that one pass holds
        at most max_per_batch different adapters besides the base model: those of `running`
        first, then new ones as the candidates bring them. Requests for adapters past the cap
        wait for a later round."""
        active = {id(r.lora) for r in running if r.lora is not None}
        kept = []
        for req in candidates:
            if req.lora is not None and id(req.lora) not in active:
                if len(active) >= self.max_per_batch:
                    continue
                active.add(id(req.lora))
            kept.append(req)
        return kept

    def load(self, name: str, path: str) -> AdapterInfo:
        """Read the adapter at `path` under `name`; raises LoraError naming what does not fit."""
        if not name or ":" in name:
            raise LoraError(
                f"LoRA adapter name {name!r}: give a non-empty name without ':' (model='base:name' splits on it)"
            )
        if name in self._adapters:
            raise LoraError(f"LoRA adapter {name!r} is already loaded; unload it first to replace it")
        why = supports(self._runner.model)
        if why is not None:
            raise LoraError(f"LoRA adapter {name!r}: this model cannot take adapters: {why}")
        self._loads += 1
        r = self._runner
        adapter = load_adapter(name, path, r.config, r.dtype, r.device, namespace=self._loads << 32)
        self._adapters[name] = adapter
        return _info(adapter)

    def unload(self, name: str) -> None:
        if self._adapters.pop(name, None) is None:
            self._unknown(name, "lora_name")

    def resolve(self, name: str | None) -> LoraAdapter | None:
        """A request's `lora_path` -> its adapter (None: the base model); InvalidRequest if unknown."""
        if name is None:
            return None
        adapter = self._adapters.get(name)
        if adapter is None:
            self._unknown(name, "lora_path")
        return adapter

    def _unknown(self, name: str, param: str) -> NoReturn:
        loaded = ", ".join(sorted(self._adapters)) or "none"
        raise InvalidRequest(
            f"unknown LoRA adapter {name!r} (loaded: {loaded}); start the server with --lora-paths "
            f"{name}=DIR or load it with POST /load_lora_adapter",
            param=param,
        )

    def list(self) -> list[AdapterInfo]:
        return [_info(a) for a in self._adapters.values()]


def lora_control(registry: LoraRegistry, name: str, path: str | None) -> dict:
    """A LoraRequest's answer: load (path given) or unload `name` -> {"adapters": {name: path}}
    after it, or {"error": why} (nothing changed)."""
    try:
        if path is None:
            registry.unload(name)
        else:
            registry.load(name, path)
    except (LoraError, InvalidRequest) as e:
        return {"error": str(e) if isinstance(e, LoraError) else e.message}
    return {"adapters": {a.name: a.path for a in registry.list()}}


def _info(adapter: LoraAdapter) -> AdapterInfo:
    return AdapterInfo(adapter.name, adapter.path, adapter.rank, adapter.targets)


__all__ = ["LoraRegistry", "AdapterInfo", "LoraError", "lora_control"]
