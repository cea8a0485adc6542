"""langrt's logits against llama.cpp's on the same GGUF file (the built-in model), prompt by
prompt: the only numeric check against llama.cpp. Small enough for CI (`--quick`: one prompt,
one thread, a minute or two), and run by tests/numerics/test_llama_cpp_logits.py wherever
llama-cpp-python imports.

    .venv/bin/python benchmarks/check_llama_cpp.py [--quick]

For each prompt: llama.cpp's logits at every position (`logits_all`), and langrt's from one
prefill pass, once on the file's blocks as stored (`--quantization auto`) and once dequantized
(`none`); per position the relative distance |ours - theirs| / |theirs|, averaged. llama.cpp
rounds activations to int8 for its block products and keeps K/V in float16, so the two differ by
a few percent; the check is that langrt on the blocks stays within MAX_DISTANCE of llama.cpp and
within MAX_BLOCKS_SHIFT of what its dequantized model gives (the blocks add no error of their
own). Exit status 1 where a bound fails, 2 where llama-cpp-python is not installed (a check that
could not run is not a pass). Results: results/check_llama_cpp[_quick].json.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # runner_driver: a ModelRunner driven without a scheduler
sys.path.insert(0, str(Path(__file__).parent))
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
# Why 0.06: the distance measured when the check was written was ~0.04 (llama.cpp's int8
# activations and float16 K/V); half as much again leaves room for another llama.cpp build.
MAX_DISTANCE = 0.06
# Why 0.005: the blocks and the dequantized weights hold the same values, so langrt's two paths
# differ only by summation order; a wrong block decoding moves the distance by far more.
MAX_BLOCKS_SHIFT = 0.005
PROMPTS = ["Name three rivers in Europe.", "Write a haiku about the sea.", "What is 17 times 23? Explain briefly."]
INSTALL = "pip install llama-cpp-python (it builds llama.cpp for this CPU in a few minutes)"


@dataclass
class Distances:
    prompt: str
    tokens: int
    blocks: float  # langrt --quantization auto vs llama.cpp
    dequantized: float  # langrt --quantization none vs llama.cpp

    @property
    def passed(self) -> bool:
        return self.blocks < MAX_DISTANCE and abs(self.blocks - self.dequantized) < MAX_BLOCKS_SHIFT


def relative_distance(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Per position |ours - theirs| / |theirs| (L2 over the vocabulary), averaged over positions."""
    return ((ours.float() - theirs).norm(dim=-1) / theirs.norm(dim=-1)).mean().item()


def llama_cpp_logits(llm, prompt: list[int]) -> torch.Tensor:
    llm.reset()
    llm.eval(prompt)
    return torch.tensor(np.array(llm.scores[: len(prompt)]))


def langrt_logits(runners: dict, prompt: list[int]) -> dict[str, torch.Tensor]:
    from runner_driver import RunnerDriver

    return {name: RunnerDriver(runner).prefill([prompt])[0] for name, runner in runners.items()}


def measure(model_path: Path, prompts: list[str], threads: int = 1) -> list[Distances]:
    """Distances for each prompt (chat-templated), langrt's runners and llama.cpp on `model_path`."""
    import llama_cpp
    from runner_driver import make_runner

    from langrt.tokenizer.loader import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    llm = llama_cpp.Llama(str(model_path), n_threads=threads, n_ctx=512, logits_all=True, verbose=False)
    runners = {q: make_runner(model_path, quantization=q, max_total_tokens=2048) for q in ("auto", "none")}
    out = []
    for text in prompts:
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer.encode(chat, add_special_tokens=False)
        theirs = llama_cpp_logits(llm, ids)
        ours = langrt_logits(runners, ids)
        out.append(
            Distances(text, len(ids), relative_distance(ours["auto"], theirs), relative_distance(ours["none"], theirs))
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one prompt (CI scale)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    try:
        import llama_cpp
    except ImportError:
        print(f"check_llama_cpp: llama-cpp-python is not installed, nothing was checked: {INSTALL}", file=sys.stderr)
        return 2
    from langrt.builtin import builtin_model_path

    torch.set_num_threads(args.threads)
    rows = measure(builtin_model_path(), PROMPTS[:1] if args.quick else PROMPTS, args.threads)
    for r in rows:
        print(f"{r.prompt!r} ({r.tokens} tokens): blocks {r.blocks:.4f}, dequantized {r.dequantized:.4f} "
              f"-> {'ok' if r.passed else 'FAILED'}")  # fmt: skip
    results = {
        "model": str(builtin_model_path().name), "llama_cpp_version": llama_cpp.__version__,
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode(),
        "max_distance": MAX_DISTANCE, "max_blocks_shift": MAX_BLOCKS_SHIFT,
        "prompts": [{**asdict(r), "passed": r.passed} for r in rows], "passed": all(r.passed for r in rows),
    }  # fmt: skip
    out = write_results(RESULTS / f"check_llama_cpp{'_quick' if args.quick else ''}.json", results, dtype="float32")
    print(f"wrote {out}")
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
