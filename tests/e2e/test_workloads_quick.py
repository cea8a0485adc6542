"""benchmarks/workloads at CI scale: two workloads end to end on the three systems (langrt with
and without its radix cache, HF transformers), and the offline hit-rate optimum on hand-made
token sequences. Timings are not asserted (a shared CPU); structure and cache figures are."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.workloads.recording import optimal_hit_rate  # noqa: E402

SYSTEMS = ("langrt", "langrt_no_cache", "hf")


def test_optimum_counts_each_prefix_once_and_every_last_token():
    # Two equal prompts: the second reuses all but its last token (whose logits it asks for).
    assert optimal_hit_rate([([1, 2, 3], []), ([1, 2, 3], [])]) == pytest.approx(2 / 6)
    # Nothing shared, nothing to hit.
    assert optimal_hit_rate([([1, 2], [5]), ([3, 4], [6])]) == 0.0


def test_optimum_counts_decoded_tokens_as_cached():
    # The second prompt quotes the first one's answer [7, 8]: 7 was decoded (has K/V), 8 was
    # sampled last (has none yet), so it reuses 1, 2, 7: 3 of the 7 prompt tokens hit.
    assert optimal_hit_rate([([1, 2], [7, 8]), ([1, 2, 7, 8, 9], [])]) == pytest.approx(1 - 4 / 7)


@pytest.mark.slow
def test_quick_workloads_end_to_end(tmp_path):
    from benchmarks.workloads import run

    out = tmp_path / "workloads.json"
    results = run.main(["--quick", "--only", "few_shot_mmlu", "fork_vote", "--out", str(out)])
    written = json.loads(out.read_text())
    assert "commit" in written.pop("meta"), "the file records the run (results_meta)"
    assert written == json.loads(json.dumps(results))
    assert [w["name"] for w in results["workloads"]] == ["few_shot_mmlu", "fork_vote"]
    for row in results["workloads"]:
        for system in SYSTEMS:
            figures = row[system]
            assert figures["errors"] == 0, figures["first_errors"]
            assert (
                figures["programs_s"] > 0 and figures["output_tok_s"] > 0 and figures["requests"] >= figures["programs"]
            )
            assert figures["tokenization_mismatches"] == 0, "the optimum must see the runtime's own tokens"
        on, off, hf = row["langrt"], row["langrt_no_cache"], row["hf"]
        assert on["cache_hit_rate"] > off["cache_hit_rate"] == 0.0 and hf["cache_hit_rate"] == 0.0
        assert 0 < on["optimal_hit_rate"] <= 1 and on["cache_hit_rate"] <= on["optimal_hit_rate"] + 1e-9
        assert on["server"]["cached_prompt_tokens"] == on["cached_tokens"], "per-request and server counts agree"
        # Without a prefix cache only run_batch's one warm-up is sent (no fork or select warm-ups).
        assert max(off["warm_up_requests"], hf["warm_up_requests"]) <= 1 <= on["warm_up_requests"]
        assert set(row["ratios"]) >= {"langrt_vs_hf", "cache_on_vs_off", "no_cache_vs_hf", "fraction_of_optimum"}
        assert row["targets"] and all(set(t) == {"value", "target", "met"} for t in row["targets"].values())
    assert results["workloads"][0]["langrt"]["cache_hit_rate"] > 0.5, "4 questions after one ~1,100-token preamble"
    vote = results["workloads"][1]
    assert vote["langrt"]["warm_up_requests"] > vote["langrt_no_cache"]["warm_up_requests"], (
        "fork commits only with a cache"
    )
