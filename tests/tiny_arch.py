"""Tiny random-weight checkpoints of any transformers architecture, and langrt's logits on them
next to transformers' own.

`write_tiny_checkpoint` saves a seeded model built from a transformers config class and model
class (the built-in model's tokenizer beside it, as conftest.build_tiny_model does), so an
architecture test needs only the classes and the few config values that matter to it.
`langrt_pieces` runs langrt's ModelRunner (float32) the way serving does: a batch of prompts of
mixed lengths, then a pass where one prompt reuses another's cached prefix (whole, and cut
short) beside a fresh one, then greedy decode steps through the paged cache. Each piece is the
logits langrt computed for some positions of a sequence; `max_logit_error` holds them to a
transformers forward over the whole sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from langrt.builtin import builtin_model_path
from runner_driver import RunnerDriver, make_runner

# Small enough for seconds per test on 2 cores; vocab is the borrowed tokenizer's.
TINY_DIMS = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    vocab_size=49152,
)
FIRST_ORDINARY_TOKEN = 17  # ids below are SmolLM2's control tokens


def write_tiny_checkpoint(config_cls, model_cls, path, seed: int = 0, **config_kwargs):
    """Save a seeded random `model_cls(config_cls(TINY_DIMS | config_kwargs))` with the built-in
    tokenizer into `path`; -> the transformers model (float32, eval). `config_cls` may be any
    callable taking those keywords (one building a nested multimodal config, say).

    Every tensor is random, biases too (a misplaced bias shows); norm weights are 1 + N(0, 0.1)
    (for Gemma's (1 + w) norms that is a scale around 2, which is as good a test)."""
    from langrt.tokenizer.loader import load_tokenizer

    tokenizer = load_tokenizer(builtin_model_path())
    settings = {**TINY_DIMS, "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = config_cls(**{**settings, **config_kwargs})
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.copy_(0.08 * torch.randn_like(param))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


@dataclass
class Piece:
    """langrt's logits for positions start.. of the sequence `ids` (computed in one pass)."""

    phase: str  # "prefill", "prefix_reuse" or "decode"
    ids: list[int]
    start: int
    logits: torch.Tensor  # [len(ids) - start, vocab]

    def __post_init__(self):
        assert self.logits.shape[0] == len(self.ids) - self.start, "one row of logits per computed position"


def random_prompts(seed: int, lengths) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(FIRST_ORDINARY_TOKEN, TINY_DIMS["vocab_size"], (n,), generator=gen).tolist() for n in lengths]


def langrt_pieces(model_dir, lengths=(5, 23, 41), decode_steps: int = 3, seed: int = 0, **runner_kw) -> list[Piece]:
    """Run langrt (float32) over `model_dir`: prefill prompts of `lengths` in one batch; then one
    pass extending prompt 0 by 7 tokens on its whole cached K/V, prompt 1's first 9 tokens plus 6
    new ones on part of its cached K/V, and a fresh 11-token prompt; then `decode_steps` greedy
    steps of every sequence together."""
    runner = make_runner(model_dir, **{"max_total_tokens": 4096, "max_running_requests": 32, **runner_kw})
    driver = RunnerDriver(runner)
    prompts = random_prompts(seed, lengths)
    pieces = [Piece("prefill", p, 0, x) for p, x in zip(prompts, driver.prefill(prompts))]
    more = random_prompts(seed + 1, (7, 6, 11))
    reused = [prompts[0] + more[0], prompts[1][:9] + more[1], more[2]]
    reuse = [(0, len(prompts[0])), (1, 9), None]
    starts = [len(prompts[0]), 9, 0]
    for seq, logits, start in zip(reused, driver.prefill(reused, prefix_from=reuse), starts):
        pieces.append(Piece("prefix_reuse", seq, start, logits))
    pieces += _greedy_steps(driver, [piece.logits[-1] for piece in pieces[-3:]], first=len(prompts), steps=decode_steps)
    return pieces


def _greedy_steps(driver: RunnerDriver, last: list[torch.Tensor], first: int, steps: int) -> list[Piece]:
    """Decode sequences first.. together, each taking its argmax token."""
    indices = list(range(first, first + len(last)))
    pieces = []
    for _ in range(steps):
        logits = driver.decode(indices, [int(x.argmax()) for x in last])
        last = list(logits)
        pieces += [
            Piece("decode", list(driver.seqs[i]), len(driver.seqs[i]) - 1, x[None]) for i, x in zip(indices, last)
        ]
    return pieces


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    """transformers' float32 logits for every position of one sequence (no cache)."""
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


def hf_logits_stepwise(hf_model, ids: list[int]) -> torch.Tensor:
    """transformers' float32 logits for every position, fed one token at a time through its KV
    cache (as it generates): for rope scalings whose tables depend on the pass's last position
    (LongRoPE), this is each position's own rotation."""
    from transformers import DynamicCache

    cache = DynamicCache(config=hf_model.config)
    rows = []
    with torch.no_grad():
        for position, token in enumerate(ids):
            out = hf_model(
                torch.tensor([[token]]), position_ids=torch.tensor([[position]]), cache=cache, use_cache=True
            )
            rows.append(out.logits[0, -1].float())
    return torch.stack(rows)


def max_logit_error(hf_model, pieces: list[Piece], reference=hf_logits) -> dict[str, float]:
    """Worst |langrt - transformers| logit, per phase; `reference(hf_model, ids)` gives
    transformers' logits of a whole sequence."""
    worst: dict[str, float] = {}
    for piece in pieces:
        error = (piece.logits - reference(hf_model, piece.ids)[piece.start :]).abs().max().item()
        worst[piece.phase] = max(worst.get(piece.phase, 0.0), error)
    return worst
