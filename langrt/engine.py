"""langrt.Engine: offline generation on the runtime, without HTTP.

    engine = langrt.Engine()                      # the built-in SmolLM2-135M-Instruct
    out = engine.generate("The capital of France is", {"max_new_tokens": 8, "temperature": 0})
    out["text"], out["output_ids"], out["meta_info"]

The Engine drives the scheduler in the calling thread: `generate` submits its requests and steps
the scheduler until they finish.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from typing import Any, Mapping, Sequence

from langrt.errors import InvalidRequest
from langrt.managers.req import LogprobRecord, Req
from langrt.managers.scheduler import Scheduler
from langrt.model.loader import ModelSource
from langrt.model.model_runner import ModelRunner
from langrt.model.tokenizer import load_tokenizer
from langrt.sampling.sampling_params import SamplingParams
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)

SamplingInput = SamplingParams | Mapping[str, Any] | None


class Engine:
    def __init__(self, model_path: str | None = None, progress: bool = True, **server_args: Any):
        self.args = ServerArgs(model_path=model_path, **server_args).resolve()
        logging.basicConfig(level=self.args.log_level.upper(), format="[langrt] %(message)s")
        source = ModelSource.resolve(self.args.model_path)
        self.model_config = source.model_config()
        self.tokenizer = load_tokenizer(self.args.tokenizer_path or source.path)
        self.runner = ModelRunner(self.args, source, self.model_config, progress=progress)
        self.scheduler = Scheduler(self.runner, self.tokenizer, self.args)

    def generate(
        self,
        prompt: str | Sequence[str] | None = None,
        sampling_params: SamplingInput | Sequence[SamplingInput] = None,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool = False,
        rid: str | Sequence[str] | None = None,
    ) -> dict | list[dict]:
        """One prompt (str or token ids) -> one result dict; a list of prompts, or n > 1 -> a list.

        Each result: {"text", "output_ids", "meta_info"} as the native HTTP API returns it.
        """
        prompts, is_batch = self._prompts(prompt, input_ids)
        params = _per_item(sampling_params, len(prompts), "sampling_params")
        params = [p if isinstance(p, SamplingParams) else SamplingParams.from_dict(p) for p in params]
        rids = _per_item(rid, len(prompts), "rid") if rid is not None else [None] * len(prompts)
        if top_logprobs_num is not None and top_logprobs_num < 0:
            raise InvalidRequest("top_logprobs_num must be >= 0", param="top_logprobs_num")
        reqs = []
        for ids, p, r in zip(prompts, params, rids):
            reqs += self._expand(ids, p, r, return_logprob, logprob_start_len, top_logprobs_num or 0)
        for req in reqs:
            self.scheduler.validate(req)
        start = time.perf_counter()
        for req in reqs:
            self.scheduler.add_request(req)
        done_at = self._run(reqs)
        results = [self._result(r, done_at[r.rid] - start, return_text_in_logprobs) for r in reqs]
        return results if is_batch or len(results) > 1 else results[0]

    def _prompts(self, prompt, input_ids) -> tuple[list[list[int]], bool]:
        if (prompt is None) == (input_ids is None):
            raise InvalidRequest("give exactly one of prompt (text) and input_ids", param="text")
        if prompt is not None:
            texts = [prompt] if isinstance(prompt, str) else list(prompt)
            if not texts or any(not isinstance(t, str) or t == "" for t in texts):
                raise InvalidRequest("the prompt is empty (or not a string)", param="text")
            return [self.tokenizer.encode(t, add_special_tokens=True) for t in texts], not isinstance(prompt, str)
        is_batch = bool(input_ids) and not isinstance(input_ids[0], int)
        batch = [list(x) for x in input_ids] if is_batch else [list(input_ids)]
        if not batch or any(not ids or not all(isinstance(t, int) for t in ids) for ids in batch):
            raise InvalidRequest("input_ids must be a non-empty list of token ids (or a list of them)", param="input_ids")
        return batch, is_batch

    def _expand(self, ids, params: SamplingParams, rid, return_logprob, start, top_k) -> list[Req]:
        """n > 1 becomes n requests; sample i of a seeded request uses seed + i."""
        base = rid or uuid.uuid4().hex
        reqs = []
        for i in range(params.n):
            p = params if params.seed is None or i == 0 else _with_seed(params, params.seed + i)
            reqs.append(
                Req(
                    rid=base if params.n == 1 else f"{base}-{i}",
                    input_ids=ids,
                    params=p,
                    return_logprob=return_logprob,
                    logprob_start_len=-1 if start is None else start,
                    top_logprobs_num=top_k,
                )
            )
        return reqs

    def _run(self, reqs: list[Req]) -> dict[str, float]:
        pending = {r.rid for r in reqs}
        done_at: dict[str, float] = {}
        while pending:
            for req in self.scheduler.step():
                done_at[req.rid] = time.perf_counter()
                pending.discard(req.rid)
        return done_at

    def _result(self, req: Req, latency: float, text_in_logprobs: bool) -> dict:
        meta = {
            "id": req.rid,
            "prompt_tokens": req.prompt_len,
            "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,
            "finish_reason": req.finish_reason.to_json(),
            "e2e_latency": latency,
        }
        if req.return_logprob:
            meta.update(self._logprob_meta(req, text_in_logprobs))
        return {"text": req.output_text, "output_ids": list(req.output_ids), "meta_info": meta}

    def _logprob_meta(self, req: Req, with_text: bool) -> dict:
        def entries(record: LogprobRecord):
            return [[v, t, self._token_text(t, with_text)] for v, t in zip(record.values, record.token_ids)]

        def tops(record: LogprobRecord):
            return [
                None if top is None else [[v, t, self._token_text(t, with_text)] for v, t in top]
                for top in record.top
            ]

        meta = {
            "input_token_logprobs": entries(req.input_logprobs),
            "output_token_logprobs": entries(req.output_logprobs),
        }
        if req.top_logprobs_num:
            meta["input_top_logprobs"] = tops(req.input_logprobs)
            meta["output_top_logprobs"] = tops(req.output_logprobs)
        return meta

    def _token_text(self, token_id: int, with_text: bool) -> str | None:
        return self.tokenizer.decode([token_id]) if with_text else None

    def flush_cache(self) -> bool:
        """Empty the prefix cache; False (nothing changes) while requests are in flight."""
        return self.scheduler.flush_cache()

    def cache_stats(self) -> dict:
        """KV pool and prefix cache figures: sizes, hit rate, evictions, retractions, queues."""
        return self.scheduler.cache_stats()

    def shutdown(self) -> None:
        """Release the model and pools (the Engine is unusable afterwards)."""
        self.scheduler = self.runner = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _per_item(value, n: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise InvalidRequest(f"{name} has {len(value)} entries for {n} prompts", param=name)
        return list(value)
    return [value] * n


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return dataclasses.replace(params, seed=seed)
