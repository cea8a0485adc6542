"""The HF transformers baseline as a frontend backend: the same programs, run with `generate`.

`HFBackend` implements the frontend's Backend protocol over a transformers model, so a workload's
program logic is literally the same code for langrt and for the baseline. What it does is what a
careful transformers user would write by hand:
- no K/V reuse across calls: every `generate` starts from the whole prompt;
- batching: calls that arrive together (the forks of a program, the items of a batch, the same
  stage of different programs) are gathered for `GATHER_S` of quiet, grouped by identical
  settings, sorted by length and run as padded `generate` batches;
- `select`: each choice scored by one forward pass over prefix + choice (the choices of many
  selects batched together); the prefix-alone row the frontend adds to find the token boundary
  is only tokenized, since its logprobs are not used;
- constrained `gen` (regex / json_schema): an outlines-core token index as a logits processor,
  as with `outlines.generate.regex` on a transformers model;
- no cache warm-up requests: it reports `caches_prefixes = False`, so the frontend sends none
  (and one that came anyway would do nothing).

Only the settings the workloads use are supported; anything else raises NotImplementedError
naming the setting.
"""

from __future__ import annotations

import json
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from langrt_frontend.chat_template import ChatTemplate, resolve_chat_template

GATHER_S = 0.02  # quiet time that closes a batch: calls of one program stage arrive within ms
MAX_ROWS = 32
MAX_BATCH_TOKENS = 16384  # rows x padded length per forward: bounds activation memory
# Settings a request may carry only at their neutral values.
_NEUTRAL = {"min_new_tokens": (None, 0), "n": (None, 1), "stop_token_ids": (None, []), "stop_regex": (None, []),
            "min_p": (None, 0.0), "frequency_penalty": (None, 0.0), "presence_penalty": (None, 0.0),
            "ignore_eos": (None, False)}  # fmt: skip
_HANDLED = {"max_new_tokens", "stop", "temperature", "top_p", "top_k", "regex", "json_schema", "skip_special_tokens",
            "spaces_between_special_tokens"}  # fmt: skip
JSON_WHITESPACE = r"[ ]?"  # as langrt's "compact" policy: at most one space between JSON tokens


@dataclass
class _Job:
    kind: str  # "generate" | "score"
    ids: list[int]
    key: tuple  # jobs with equal keys may share a batch
    params: dict
    start: int = 0  # score: first position whose logprob is returned
    future: Future = field(default_factory=Future)


class HFBackend:
    caches_prefixes = False  # the frontend then sends no cache warm-ups

    def __init__(self, dtype: str = "bfloat16", num_threads: int = 1):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from langrt.builtin import builtin_model_path

        torch.set_num_threads(num_threads)
        path = builtin_model_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        self.model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=getattr(torch, dtype))
        self.model.eval()
        self.dtype = dtype
        self.eos_id = self.tokenizer.eos_token_id
        self.special_texts = set(self.tokenizer.all_special_tokens)
        self.model_info = {
            "model_path": f"hf:{path.name}",
            "chat_template": self.tokenizer.chat_template,
            "stop_strings": [self.tokenizer.eos_token],
            "is_generation": True,
        }
        self.chat_template: ChatTemplate = resolve_chat_template(self.model_info)
        self.grammars = _GrammarIndex(self.tokenizer)
        self.tokenizer_lock = threading.Lock()  # a fast tokenizer may refuse concurrent calls
        self.jobs: queue.Queue = queue.Queue()
        self.worker = threading.Thread(target=self._loop, name="hf-baseline", daemon=True)
        self.worker.start()

    # ---- the Backend protocol --------------------------------------------------------------

    def get_model_info(self) -> dict:
        return self.model_info

    def get_server_info(self) -> dict:
        return {"backend": "hf-transformers", "dtype": self.dtype, "threads": torch.get_num_threads()}

    def flush_cache(self) -> bool:
        self.grammars.clear()  # the one thing kept across calls: compiled grammars
        return True

    def generate_stream(self, payload: dict):
        yield self.generate(payload)

    def generate(self, payload: dict):
        texts = payload["text"]
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        params = _checked(payload.get("sampling_params", {}))
        ids = [self.encode(t) for t in texts]
        if params.get("max_new_tokens", 128) == 0:
            responses = (
                self._score(payload, texts, ids)
                if payload.get("return_logprob")
                else [_response(i, [], "", 0) for i in ids]
            )
        else:
            responses = self._wait([self._submit("generate", i, params) for i in ids])
        return responses[0] if single else responses

    def encode(self, text: str) -> list[int]:
        with self.tokenizer_lock:
            return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        with self.tokenizer_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def shutdown(self) -> None:
        self.jobs.put(None)
        self.worker.join()

    # ---- requests to jobs ------------------------------------------------------------------

    def _submit(self, kind: str, ids: list[int], params: dict, start: int = 0) -> _Job:
        key = (kind, json.dumps(params, sort_keys=True))
        job = _Job(kind, ids, key, params, start)
        self.jobs.put(job)
        return job

    @staticmethod
    def _wait(jobs: list[_Job]) -> list:
        return [job.future.result() for job in jobs]

    def _score(self, payload: dict, texts: list[str], ids: list[list[int]]) -> list[dict]:
        starts = payload.get("logprob_start_len", 0)
        starts = starts if isinstance(starts, list) else [starts] * len(texts)
        # select's layout (langrt_frontend/select.py): the prefix alone, then prefix + each choice.
        # The prefix row only marks where the choices begin (its logprobs are not used), so it
        # is tokenized and not run.
        boundary_only = len(texts) > 1 and texts[1] != texts[0] and texts[1].startswith(texts[0])
        jobs = {i: self._submit("score", ids[i], {}, max(0, starts[i])) for i in range(boundary_only, len(texts))}
        responses = []
        for i, row in enumerate(ids):
            start = max(0, starts[i])
            entries = jobs[i].future.result() if i in jobs else [[None, t, None] for t in row[start:]]
            if payload.get("return_text_in_logprobs"):
                entries = [[lp, t, self.decode([t], False)] for lp, t, _ in entries]
            responses.append(_response(row, [], "", 0, input_token_logprobs=entries))
        return responses

    # ---- the batching worker ---------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            first = self.jobs.get()
            if first is None:
                return
            jobs = [first] + self._gather()
            for batch in _batches(jobs):
                try:
                    results = self._run_generate(batch) if batch[0].kind == "generate" else self._run_score(batch)
                except Exception as e:  # noqa: BLE001 - the calling program reports it
                    for job in batch:
                        job.future.set_exception(e)
                    continue
                for job, result in zip(batch, results):
                    job.future.set_result(result)

    def _gather(self) -> list[_Job]:
        jobs = []
        while True:
            try:
                job = self.jobs.get(timeout=GATHER_S)
            except queue.Empty:
                return jobs
            if job is None:
                self.jobs.put(None)  # stop after this batch
                return jobs
            jobs.append(job)

    @torch.inference_mode()
    def _run_generate(self, batch: list[_Job]) -> list[dict]:
        p = batch[0].params
        input_ids, mask = _pad([j.ids for j in batch], self.eos_id, left=True)
        kwargs = {
            "max_new_tokens": p.get("max_new_tokens", 128),
            "pad_token_id": self.eos_id,
            "eos_token_id": self.eos_id,
        }
        temperature = p.get("temperature", 1.0)
        if temperature > 0:
            kwargs.update(
                do_sample=True, temperature=temperature, top_p=p.get("top_p", 1.0), top_k=max(0, p.get("top_k", -1))
            )
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        stops = [s for s in p.get("stop", []) if s not in self.special_texts]
        if stops:
            kwargs.update(stop_strings=stops, tokenizer=self.tokenizer)
        regex = self.grammars.regex_of(p)
        if regex is not None:
            from transformers import LogitsProcessorList

            kwargs["logits_processor"] = LogitsProcessorList([self.grammars.processor(regex, len(batch), self.eos_id)])
        out = self.model.generate(input_ids=input_ids, attention_mask=mask, **kwargs)
        return [self._finish(j, row.tolist(), stops) for j, row in zip(batch, out[:, input_ids.shape[1] :])]

    def _finish(self, job: _Job, new: list[int], stops: list[str]) -> dict:
        ended = self.eos_id in new
        n = new.index(self.eos_id) + 1 if ended else len(new)
        text = self.decode([t for t in new[:n] if t != self.eos_id])
        cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
        if cut >= 0:
            text, n, reason = text[:cut], n - ended, {"type": "stop", "matched": "string"}  # the eos was padding
        elif ended:
            reason = {"type": "stop", "matched": self.eos_id}
        else:
            reason = {"type": "length", "length": n}
        return _response(job.ids, new[:n], text, n, finish_reason=reason)

    @torch.inference_mode()
    def _run_score(self, batch: list[_Job]) -> list[list]:
        """Input logprobs of each row from its `start`: one forward over the padded batch, the
        vocabulary projection only at the positions asked for."""
        input_ids, mask = _pad([j.ids for j in batch], self.eos_id, left=False)
        hidden = self.model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        results = []
        for row, job in enumerate(batch):
            first = max(job.start, 1)  # position 0 has no logprob
            logits = self.model.lm_head(hidden[row, first - 1 : len(job.ids) - 1]).float()
            targets = torch.tensor(job.ids[first:])
            values = torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0].tolist()
            entries = [[None, job.ids[0], None]] if job.start == 0 else []
            results.append(entries + [[v, t, None] for v, t in zip(values, job.ids[first:])])
        return results


# ---- helpers --------------------------------------------------------------------------------------


def _checked(params: dict) -> dict:
    for name, value in params.items():
        if name in _NEUTRAL:
            if value not in _NEUTRAL[name]:
                raise NotImplementedError(f"the HF baseline does not support sampling_params.{name}={value!r}")
        elif name not in _HANDLED:
            raise NotImplementedError(f"the HF baseline does not support sampling_params.{name}")
    return {k: v for k, v in params.items() if k in _HANDLED}


def _response(
    prompt: list[int], output: list[int], text: str, completion_tokens: int, finish_reason=None, **meta
) -> dict:
    meta = {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens, "cached_tokens": 0,
            "finish_reason": finish_reason or {"type": "length", "length": 0}, **meta}  # fmt: skip
    return {"text": text, "output_ids": output, "meta_info": meta}


def _batches(jobs: list[_Job]) -> list[list[_Job]]:
    """Jobs grouped by key, longest first, cut to MAX_ROWS rows and MAX_BATCH_TOKENS padded tokens."""
    groups: dict[tuple, list[_Job]] = {}
    for job in jobs:
        groups.setdefault(job.key, []).append(job)
    batches = []
    for group in groups.values():
        group.sort(key=lambda j: -len(j.ids))
        current: list[_Job] = []
        for job in group:
            width = len(current[0].ids) if current else len(job.ids)
            if current and (len(current) == MAX_ROWS or (len(current) + 1) * width > MAX_BATCH_TOKENS):
                batches.append(current)
                current = []
            current.append(job)
        batches.append(current)
    return batches


def _pad(rows: list[list[int]], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, span] = torch.tensor(row)
        mask[i, span] = 1
    return ids, mask


class _GrammarIndex:
    """outlines-core indexes over the tokenizer's vocabulary, one per regex (compiled once)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.indexes: dict[str, object] = {}
        self._vocabulary = None

    def clear(self) -> None:
        self.indexes.clear()

    def regex_of(self, params: dict) -> str | None:
        if params.get("json_schema") is not None:
            from outlines_core.json_schema import build_regex_from_schema

            return build_regex_from_schema(params["json_schema"], JSON_WHITESPACE)
        return params.get("regex")

    def processor(self, regex: str, rows: int, eos_id: int):
        from outlines_core import Guide, Index

        if regex not in self.indexes:
            self.indexes[regex] = Index(regex, self.vocabulary(eos_id))
        return _GuidedLogits([Guide(self.indexes[regex]) for _ in range(rows)], eos_id)

    def vocabulary(self, eos_id: int):
        """Token id -> its bytes (GPT-2 byte-level BPE), special tokens left out."""
        if self._vocabulary is None:
            from outlines_core import Vocabulary

            decode = {c: b for b, c in _bytes_to_unicode().items()}
            special = set(self.tokenizer.all_special_ids)
            tokens: dict[bytes, list[int]] = {}
            for token, i in self.tokenizer.get_vocab().items():
                if i not in special:
                    raw = bytes(decode[c] for c in token) if all(c in decode for c in token) else token.encode()
                    tokens.setdefault(raw, []).append(i)
            self._vocabulary = Vocabulary(eos_id, tokens)
        return self._vocabulary


class _GuidedLogits:
    """A transformers logits processor: each row may only take tokens its guide allows."""

    def __init__(self, guides: list, eos_id: int):
        self.guides = guides
        self.eos_id = eos_id
        self.done = [False] * len(guides)
        self.started = False
        self.words = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.started:
            for row, guide in enumerate(self.guides):
                token = int(input_ids[row, -1])
                if not self.done[row]:
                    if token == self.eos_id:
                        self.done[row] = True
                    else:
                        guide.advance(token, return_tokens=False)
        self.started = True
        vocab = scores.shape[-1]
        if self.words is None:
            self.words = torch.zeros((len(self.guides), (vocab + 31) // 32), dtype=torch.int32)
        allowed = torch.zeros((len(self.guides), vocab), dtype=torch.bool)
        for row, guide in enumerate(self.guides):
            if self.done[row]:
                allowed[row, self.eos_id] = True
                continue
            words = self.words[row]
            words.zero_()
            guide.write_mask_into(words.data_ptr(), words.numel(), 4)
            bits = (words[:, None] >> torch.arange(32, dtype=torch.int32)) & 1
            allowed[row] = bits.flatten()[:vocab].bool()
        return scores.masked_fill(~allowed, float("-inf"))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable character table (byte-level BPE token strings use it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}
