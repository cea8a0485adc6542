"""--quantization int8 / int4 on an HF checkpoint of plain weights, side by side in one run.

The built-in model is saved as an HF directory of float32 safetensors (its GGUF blocks' values),
then served with --quantization none, int8 and int4, in bfloat16 and float32. Reports batch-1
decode tok/s (128 greedy tokens, EOS ignored) and how many of the greedy tokens equal the
unquantized model's (same dtype, 4 prompts; each sequence counted up to its first difference).

    .venv/bin/python benchmarks/bench_quantize.py [--quick]

Results: results/bench_quantize[_quick].json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_offline import cpu_flags_summary, prompts, timed  # noqa: E402

import langrt  # noqa: E402
from langrt.builtin import builtin_model_path  # noqa: E402
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def save_plain_copy(path: Path) -> Path:
    """The built-in model as float32 safetensors with its tokenizer (what an HF checkpoint is)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = builtin_model_path()
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # transformers saves no model it marks as GGUF
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(path)
    return path


class Runner:
    def __init__(self, path: Path, dtype: str, quantization: str):
        self.name = f"{quantization}_{dtype}"
        self.engine = langrt.Engine(str(path), dtype=dtype, quantization=quantization, log_level="warning")
        self.tokenizer = self.engine.tokenizer

    def generate(self, texts: list[str], new_tokens: int) -> int:
        outs = self.engine.generate(texts, {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True})
        return sum(o["meta_info"]["completion_tokens"] for o in outs)

    def flush(self) -> None:
        """Called by bench_offline.timed before every timed run: no prompt served from the cache."""
        if not self.engine.flush_cache():
            raise RuntimeError("flush_cache refused: requests still running")

    def greedy_ids(self, texts: list[str], new_tokens: int) -> list[list[int]]:
        outs = self.engine.generate(texts, {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True})
        return [o["output_ids"] for o in outs]


def agreement(ours: list[list[int]], reference: list[list[int]]) -> float:
    """Share of greedy tokens equal to the reference's, each sequence up to its first difference."""
    same = 0
    for a, b in zip(ours, reference):
        for x, y in zip(a, b):
            if x != y:
                break
            same += 1
    return same / sum(len(b) for b in reference)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="16 tokens, one repeat")
    args = parser.parse_args()
    new_tokens, repeats = (16, 1) if args.quick else (128, 2)
    results = {
        "cpu_flags": cpu_flags_summary(),
        "threads": torch.get_num_threads(),
        "new_tokens": new_tokens,
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = save_plain_copy(Path(tmp))
        for dtype in ("bfloat16", "float32"):
            reference = None
            for quantization in ("none", "int8", "int4"):
                runner = Runner(path, dtype, quantization)
                texts = prompts(runner.tokenizer, 4)
                ids = runner.greedy_ids(texts, new_tokens)
                reference = reference or ids
                row = timed(runner, texts[:1], new_tokens, repeats)
                row["greedy_agreement"] = agreement(ids, reference)
                results["runs"][runner.name] = row
                print(f"{runner.name:16s} {row['tok_s']:7.1f} tok/s, step {row['decode_step_ms']:.1f} ms, "
                      f"greedy tokens as unquantized {100 * row['greedy_agreement']:.0f}%", flush=True)  # fmt: skip
                runner.engine.shutdown()
    for dtype in ("bfloat16", "float32"):
        base = results["runs"][f"none_{dtype}"]["tok_s"]
        for quantization in ("int8", "int4"):
            results["runs"][f"{quantization}_{dtype}"]["speedup_vs_none"] = (
                results["runs"][f"{quantization}_{dtype}"]["tok_s"] / base
            )
    out = RESULTS / f"bench_quantize{'_quick' if args.quick else ''}.json"
    write_results(out, results)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
