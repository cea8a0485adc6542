"""Constrained generation end to end: outputs follow their grammar; jump-forward; errors."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from langrt.errors import InvalidRequest
from grammar_texts import JSON_GBNF

REGEXES = [
    r"[0-9]{1,4}",
    r"(yes|no|maybe)",
    r"[a-z]+( [a-z]+){0,4}\.",
    r'\{"id": [0-9]{1,3}, "tags": \["[a-z]{1,8}"(, "[a-z]{1,8}"){0,2}\]\}',
    r"(é|ü|ñ)[a-zñ]{0,6}",
]


def ends_well(text: str, meta: dict, regex: str) -> bool:
    """A constrained output either fullmatches, or stopped at max_new_tokens on the way."""
    import regex as partial

    if meta["finish_reason"]["type"] == "length":
        return partial.fullmatch(regex, text, partial=True) is not None
    return re.fullmatch(regex, text) is not None


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    import langrt
    from langrt.constrained.native import regex_dfa

    # outlines-core (no C++ builder) is cut off by the time limit: a short one keeps the exploding
    # grammar's test quick. The C++ builder stops at the state limit, which takes over 2 s on
    # slower cores beside a generation: the default limit, so its refusal is by states on any CPU.
    timeout = 10.0 if regex_dfa.available() else 2.0
    with langrt.Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=8192, context_length=1024,
                       log_level="warning", grammar_compile_timeout=timeout) as engine:  # fmt: skip
        yield engine


# The three sweeps (every regex / schema / grammar, several seeds each) are most of this file's
# time: slow, so CI runs them and the default run stays short.
@pytest.mark.slow
def test_random_model_follows_every_regex(tiny):
    prompts = ["Hello", "Once upon a time", "1 2 3", "The answer is"]
    for regex in REGEXES:
        for seed in range(3):
            params = {"regex": regex, "max_new_tokens": 40, "temperature": 1.0, "seed": seed}
            outs = tiny.generate(prompts, params)
            for out in outs:
                assert ends_well(out["text"], out["meta_info"], regex), (regex, out["text"], out["meta_info"])


JSON_SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "n": {"type": "integer", "minimum": -5, "maximum": 500},
     "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["x", "y", 3]}, "maxItems": 3}},
     "required": ["name", "n"], "additionalProperties": False},
    {"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"type": "string", "format": "date"}, {"type": "null"}]},
    {"type": "array", "prefixItems": [{"const": "id"}, {"type": "string", "format": "uuid"}], "items": False},
    {"type": "object"},
]  # fmt: skip


def ends_valid(text: str, meta: dict, schema: dict) -> bool:
    """A JSON-schema output finished (not cut by max_new_tokens) and validates."""
    if meta["finish_reason"]["type"] != "stop":
        return False
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return validator.is_valid(json.loads(text))


def replays_as_prefix(output_ids: list[int], grammar) -> bool:
    """Every token of an output cut by the length limit is one a fresh matcher of the same
    grammar allows there (the grammar admitting only valid texts is test_json_schema.py's)."""
    matcher = grammar.matcher()
    return all(matcher.accept_token(t) for t in output_ids)


@pytest.fixture(scope="module")
def compiler(smollm_path):
    from langrt.constrained.grammar import GrammarCompiler
    from langrt.constrained.vocab import vocabulary_from_decoder
    from langrt.tokenizer.text_decoder import load_text_decoder

    decoder = load_text_decoder(smollm_path)
    return GrammarCompiler(vocabulary_from_decoder(decoder, 49152, {decoder.eos_token_id}))


@pytest.mark.slow
def test_random_model_follows_every_json_schema(tiny, compiler):
    finished = cut = 0
    for schema in JSON_SCHEMAS:
        grammar = compiler.compile_json_schema(schema)
        for seed in range(3):
            params = {"json_schema": json.dumps(schema), "max_new_tokens": 60, "temperature": 1.0, "seed": seed}
            for out in tiny.generate(["Hello", "JSON:"], params):
                meta = out["meta_info"]
                if meta["finish_reason"]["type"] == "length":
                    assert meta["completion_tokens"] == 60 and replays_as_prefix(out["output_ids"], grammar), (
                        schema,
                        out,
                    )
                    cut += 1
                    continue
                assert ends_valid(out["text"], meta, schema), (schema, out["text"], meta)
                finished += 1
    assert finished >= 6, f"most random generations should complete within 60 tokens ({finished} did, {cut} were cut)"


def test_an_output_cut_by_the_length_limit_is_never_valid():
    cut = {"finish_reason": {"type": "length", "length": 60}}
    assert not ends_valid('{"name": "x", "n": 1}', cut, JSON_SCHEMAS[0]), (
        "complete text, but cut: not a finished output"
    )
    assert ends_valid('{"name": "x", "n": 1}', {"finish_reason": {"type": "stop"}}, JSON_SCHEMAS[0])


def test_unsupported_schema_keyword_is_named(tiny):
    with pytest.raises(Exception) as info:
        tiny.generate(
            "x", {"json_schema": json.dumps({"type": "array", "items": {"type": "string"}, "uniqueItems": True})}
        )
    assert getattr(info.value, "param", None) == "uniqueItems" and "uniqueItems" in str(info.value)


def test_choices(tiny):
    outs = tiny.generate(["a", "b", "c"], {"choices": ["alpha", "beta", "gamma (3)"], "temperature": 1.0, "seed": 1})
    for out in outs:
        assert out["text"] in ("alpha", "beta", "gamma (3)")
        assert out["meta_info"]["finish_reason"]["type"] == "stop"


ARITH_GBNF = r"""
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= num | "(" expr ")"
num  ::= [0-9]{1,3}
"""


def balanced_arithmetic(text: str) -> bool:
    depth = 0
    for c in text:
        depth += (c == "(") - (c == ")")
        if depth < 0 or c not in "0123456789+-()":
            return False
    return depth == 0 and re.fullmatch(r"[0-9(]([0-9()+-]*[0-9)])?", text) is not None


@pytest.mark.slow
def test_random_model_follows_an_ebnf_grammar(tiny):
    """A recursive grammar (parentheses nest without bound) and a JSON grammar, sampled."""
    finished = 0
    for seed in range(4):
        for out in tiny.generate(
            ["Hello", "1 + (2"], {"ebnf": ARITH_GBNF, "max_new_tokens": 40, "temperature": 1.0, "seed": seed}
        ):
            if out["meta_info"]["finish_reason"]["type"] == "stop":
                finished += 1
                assert balanced_arithmetic(out["text"]), out["text"]
            else:
                assert set(out["text"]) <= set("0123456789+-()"), out["text"]
        for out in tiny.generate(
            ["JSON:"], {"ebnf": JSON_GBNF, "max_new_tokens": 60, "temperature": 1.0, "seed": seed}
        ):
            if out["meta_info"]["finish_reason"]["type"] == "stop":
                finished += 1
                json.loads(out["text"])
    assert finished >= 4


def test_bad_ebnf_is_refused_with_its_position(tiny):
    with pytest.raises(InvalidRequest) as info:
        tiny.generate("x", {"ebnf": 'root ::= "a" | b'})
    assert info.value.param == "ebnf" and "line 1, column 16" in info.value.message and "'b'" in info.value.message


def test_jump_forward_same_text_fewer_steps(tiny_llama_dir):
    import langrt

    regex = r'\{"name": "[a-z]{1,10}", "kind": "(cat|dog)", "legs": [0-9]\}'
    prompts = ["Describe an animal:", "JSON please:"]
    texts, passes = {}, {}
    for jump in (True, False):
        with langrt.Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=4096, context_length=512,
                           log_level="warning", disable_jump_forward=not jump) as engine:  # fmt: skip
            outs = engine.generate(prompts, {"regex": regex, "max_new_tokens": 80, "temperature": 0})
            texts[jump] = [o["text"] for o in outs]
            stats = engine.cache_stats()
            passes[jump] = stats["forward_passes"]
            if jump:
                assert stats["jump_forward_tokens"] > 0
    assert texts[True] == texts[False]
    assert all(re.fullmatch(regex, t) for t in texts[True])
    assert passes[True] < passes[False]


TREE_SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["leaf", "node"]},
        "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2},
    },
    "required": ["label", "kids"],
    "additionalProperties": False,
}


def test_jump_forward_on_a_grammar_same_text_fewer_steps(tiny_llama_dir):
    """A recursive schema runs on the pushdown automaton (grammar rules): jump-forward drafts its
    forced text across rule boundaries, and the tokens are those without jump-forward."""
    import langrt

    params = {"json_schema": json.dumps(TREE_SCHEMA), "max_new_tokens": 120, "temperature": 0}
    texts, passes = {}, {}
    for jump in (True, False):
        with langrt.Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=4096, context_length=512,
                           log_level="warning", disable_jump_forward=not jump) as engine:  # fmt: skip
            outs = engine.generate(["A tree:", "JSON please:"], params)
            texts[jump] = [(o["text"], o["meta_info"]["finish_reason"]["type"]) for o in outs]
            passes[jump] = engine.cache_stats()["forward_passes"]
    assert texts[True] == texts[False]
    for text, finish in texts[True]:
        assert text.startswith('{"label": ') or text.startswith('{"label":')
        if finish != "length":
            jsonschema.validate(json.loads(text), TREE_SCHEMA)
    assert passes[True] < passes[False]


def test_bad_regex_is_refused_with_its_position(tiny):
    with pytest.raises(InvalidRequest) as info:
        tiny.generate("x", {"regex": "ab(c"})
    assert info.value.param == "regex" and "position" in info.value.message


def test_exploding_grammar_fails_alone(tiny):
    """A grammar past the compile limits fails its own request; the others finish normally.
    The C++ regex builder stops at the state limit; outlines-core (LANGRT_CPU_KERNELS=0) is cut
    off at the time limit."""
    import threading

    from langrt.constrained.native import regex_dfa

    refusal = "over the limit of" if regex_dfa.available() else "time limit"
    results = {}

    def long_request():
        results["long"] = tiny.generate("Hello", {"max_new_tokens": 200, "ignore_eos": True, "temperature": 0})

    thread = threading.Thread(target=long_request)
    thread.start()
    with pytest.raises(InvalidRequest, match=refusal):
        tiny.generate("x", {"regex": "(a|b)*a(a|b){24}", "max_new_tokens": 5})
    thread.join(60)
    assert results["long"]["meta_info"]["completion_tokens"] == 200


@pytest.mark.slow
def test_smollm_regex_and_json(smollm_path):
    import langrt

    with langrt.Engine(log_level="warning", max_total_tokens=16384) as engine:
        tok = engine.tokenizer

        def chat(q):
            return tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)

        out = engine.generate(chat("What is 17 + 25?"), {"regex": r"[0-9]+", "max_new_tokens": 8, "temperature": 0})
        assert re.fullmatch(r"[0-9]+", out["text"]) and out["meta_info"]["finish_reason"]["type"] == "stop"
        out = engine.generate(chat("Is the sky blue?"), {"choices": ["yes", "no"], "temperature": 0})
        assert out["text"] in ("yes", "no")
        regex = r'\{"city": "[A-Za-z ]{1,20}", "country": "[A-Za-z ]{1,20}"\}'
        out = engine.generate(
            chat("Name a city and its country as JSON."), {"regex": regex, "max_new_tokens": 60, "temperature": 0}
        )
        assert re.fullmatch(regex, out["text"]), out["text"]
        assert set(json.loads(out["text"])) == {"city", "country"}
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0,
                  "maximum": 120}, "city": {"type": "string", "maxLength": 30}}, "required": ["name", "age", "city"]}  # fmt: skip
        out = engine.generate(chat("Extract as JSON: Maria Lopez, 34, lives in Seville."),
                              {"json_schema": json.dumps(schema), "max_new_tokens": 60, "temperature": 0})  # fmt: skip
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        value = json.loads(out["text"])
        jsonschema.validate(value, schema)
        assert value["age"] == 34 and "Seville" in value["city"], value


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 30},
        "employed": {"type": "boolean"},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "employed", "languages"],
    "additionalProperties": False,
}
PEOPLE = [
    "Alice Moreau is a 34-year-old nurse living in Lyon. She speaks French and English, and is employed.",
    "Bruno Silva, 51, a baker from Porto, speaks Portuguese and Spanish; he is looking for work.",
    "Chen Wang is 27 and works as a data analyst in Chengdu. Chen speaks Mandarin and English.",
    "Dara Okafor, a 45-year-old pilot in Lagos, speaks Yoruba, English and French. Dara is employed.",
]


@pytest.mark.slow
def test_jump_forward_on_smollm_extraction(smollm_path):
    """SmolLM2, float32, four extractions at once: with jump-forward the tokens are the same, in
    fewer passes. Either way a row where the grammar allows few tokens (forced text, digits) is
    chosen among those tokens (its full logits row is not computed): full rows only where the
    output's text is free, fewer than the tokens not drafted."""
    from runner_driver import make_scheduler

    from langrt.request import Req
    from langrt.sampling.sampling_params import SamplingParams

    outputs, stats, full_rows = {}, {}, {}
    for jump in (True, False):
        scheduler = make_scheduler(smollm_path, max_total_tokens=8192, disable_jump_forward=not jump)
        tokenizer, runner = scheduler.tokenizer, scheduler.runner
        rows = []
        compute_logits = runner.compute_logits
        runner.compute_logits = lambda hidden: rows.append(hidden.shape[0]) or compute_logits(hidden)
        reqs = []
        for i, text in enumerate(PEOPLE):
            messages = [{"role": "user", "content": f"Extract the person's details as JSON.\n\n{text}"}]
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            params = SamplingParams(max_new_tokens=120, temperature=0, json_schema=json.dumps(PERSON))
            reqs.append(Req(f"r{i}", tokenizer.encode(prompt), params))
            scheduler.add_request(reqs[-1])
        while scheduler.has_work:
            scheduler.step()
        outputs[jump] = [r.output_ids for r in reqs]
        stats[jump] = scheduler.stats
        full_rows[jump] = sum(rows)
        for r in reqs:
            assert r.finish_reason.type == "stop"
            jsonschema.validate(json.loads(tokenizer.decode(r.output_ids, skip_special_tokens=True)), PERSON)
    assert outputs[True] == outputs[False]
    produced = sum(len(o) for o in outputs[True])
    jumped = stats[True].jump_forward_tokens
    assert jumped > 0.3 * produced
    assert stats[True].forward_passes < 0.7 * stats[False].forward_passes
    # the rows of many choices are the output's free text; with jump-forward, also those after a
    # rejected draft (all of a pass's rows are answered before the drafts are checked)
    assert full_rows[False] <= full_rows[True] <= produced - jumped
    assert full_rows[False] < 0.5 * produced


def test_jump_forward_outputs_a_certain_end_without_another_pass(tiny_llama_dir):
    """Where the grammar allows one token at a time up to its end (`}` after the last digit),
    jump-forward outputs them in the pass that sampled the last free token and the request ends
    there; without jump-forward each takes a pass. Same tokens either way; max_new_tokens still
    cuts the output where it would have."""
    from runner_driver import make_scheduler

    from langrt.messages import RequestOptions
    from langrt.request import Req
    from langrt.sampling.sampling_params import SamplingParams

    regex = r'\{"legs": [0-9], "arms": [0-9]\}'
    outputs, ended_with_last_free, tails = {}, {}, {}
    for jump in (True, False):
        scheduler = make_scheduler(
            tiny_llama_dir, max_total_tokens=4096, context_length=512, disable_jump_forward=not jump
        )
        tok = scheduler.tokenizer
        reqs = [Req(f"r{i}", tok.encode(p), SamplingParams(max_new_tokens=n, temperature=0, regex=regex))
                for i, (p, n) in enumerate([("Legs and arms:", 60), ("JSON:", 60), ("Count:", 3)])]  # fmt: skip
        # logprobs asked for: every token needs its logits, so nothing is output without a pass
        reqs.append(
            Req(
                "lp",
                tok.encode("JSON:"),
                SamplingParams(max_new_tokens=60, temperature=0, regex=regex),
                options=RequestOptions(return_logprob=True),
            )
        )
        for req in reqs:
            scheduler.add_request(req)
        ended_with_last_free[jump] = {}
        while scheduler.has_work:
            scheduler.step()
            for r in reqs[:2]:  # after the step that output the second digit: had the request ended?
                if sum(c.isdigit() for c in tok.decode(r.output_ids)) == 2:
                    ended_with_last_free[jump].setdefault(r.rid, r.finished)
        outputs[jump] = [r.output_ids for r in reqs]
        tails[jump] = scheduler.stats.certain_tail_tokens
        for r in reqs[:2]:
            assert re.fullmatch(regex, tok.decode(r.output_ids)) and r.finish_reason.type == "stop"
        assert reqs[2].finish_reason.type == "length" and len(reqs[2].output_ids) == 3
        assert reqs[3].output_ids == reqs[1].output_ids and len(reqs[3].output_logprobs.values) == len(
            reqs[3].output_ids
        )
    assert outputs[True] == outputs[False]
    assert tails[True] >= 2 and tails[False] == 0
    assert list(ended_with_last_free[True].values()) == [True, True]
    assert list(ended_with_last_free[False].values()) == [False, False]


def test_rows_among_allowed_are_the_masked_full_rows():
    """From the allowed tokens' logits alone: a greedy row's pick is the argmax of the masked
    full row (ties go to the lowest id; a row allowing one token takes it without any logit
    computed), and a sampled row gets the masked full row itself (-inf outside the allowed
    tokens), even where one token alone is allowed (its draw uses the noise it always did)."""
    from types import SimpleNamespace

    import torch

    from langrt.scheduler.token_emitter import Emission, _among_allowed

    full = torch.tensor(
        [[0.5, 2.0, 2.0, -1.0, 3.0], [1.0, 1.0, 0.0, 1.0, -2.0], [0.0, 0.0, 0.0, 0.0, 9.0], [4.0, 1.0, 2.0, 3.0, 5.0]]
    )
    asked = []

    def compute_logits_of(hidden, rows, token_ids):
        asked.extend(zip(rows.tolist(), token_ids.tolist()))
        return full[rows, token_ids]

    runner = SimpleNamespace(compute_logits_of=compute_logits_of, vocab_size=5)
    greedy, sampled = (SimpleNamespace(params=SimpleNamespace(is_greedy=g)) for g in (True, False))
    emissions = [
        Emission(greedy, [0, 1, 2], [7, 7]),
        Emission(greedy, [2], []),
        Emission(sampled, [3], []),
        Emission(sampled, [1], []),
    ]
    allowed = [[torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor([0, 1, 3], dtype=torch.int32), None],
               [torch.tensor([2], dtype=torch.int32)], [torch.tensor([0, 2, 3], dtype=torch.int32)],
               [torch.tensor([4], dtype=torch.int32)]]  # fmt: skip
    chosen, sparse = _among_allowed(emissions, allowed, torch.zeros(4, 4), runner)

    def masked(row, ids):
        out = torch.full((5,), float("-inf"))
        out[ids.long()] = full[row, ids.long()]
        return out

    for k, e in enumerate(emissions[:2]):
        for i, ids in enumerate(allowed[k]):
            assert chosen[k][i] == (None if ids is None else int(masked(e.rows[i], ids).argmax()))
    assert chosen == [[1, 0, None], [2], [None], [None]]
    assert sorted(sparse) == [1, 3]
    assert torch.equal(sparse[3], masked(3, allowed[2][0])) and torch.equal(sparse[1], masked(1, allowed[3][0]))
    assert (2, 2) not in asked and (1, 4) in asked  # greedy's one-token row: nothing computed


def test_logits_of_single_tokens_equal_the_full_rows(tiny_llama_dir):
    """compute_logits_of gives, for each (row, token), the value compute_logits has there."""
    import torch
    from runner_driver import make_runner

    for dtype in ("float32", "bfloat16"):
        runner = make_runner(tiny_llama_dir, dtype=dtype, max_total_tokens=512, context_length=128)
        hidden = torch.randn(5, runner.config.hidden_size, generator=torch.Generator().manual_seed(0)).to(runner.dtype)
        full = runner.compute_logits(hidden)
        rows = torch.tensor([0, 0, 3, 4, 4, 4])
        tokens = torch.tensor([0, 7, runner.vocab_size - 1, 5, 6, 9])
        picked = runner.compute_logits_of(hidden, rows, tokens)
        assert picked.dtype == torch.float32
        torch.testing.assert_close(picked, full[rows, tokens], rtol=1e-5 if dtype == "float32" else 1e-2, atol=1e-5)


def test_jump_forward_drafts_ride_in_the_prompts_pass(tiny_llama_dir):
    """Where the grammar forces the output's opening text, its drafts are computed in the pass
    that ends the prompt (not one pass later), kept only where the model agrees, and their
    slots come back when it does not; the tokens are those without jump-forward."""
    from runner_driver import make_scheduler

    from langrt.request import Req
    from langrt.sampling.sampling_params import SamplingParams

    regex = r'\{"name": "[a-z]{1,8}", "legs": [0-9]\}'
    outputs, passes = {}, {}
    for jump in (True, False):
        scheduler = make_scheduler(
            tiny_llama_dir, max_total_tokens=4096, context_length=512, disable_jump_forward=not jump
        )
        free_before = scheduler.runner.kv_pool.available_size
        reqs = [Req(f"r{i}", scheduler.tokenizer.encode(p), SamplingParams(max_new_tokens=60, temperature=0, regex=regex))
                for i, p in enumerate(["Describe an animal:", "JSON please:", "x"])]  # fmt: skip
        for req in reqs:
            scheduler.add_request(req)
        first_pass = {}  # tokens each request had after the pass that ended its prompt
        while len(first_pass) < len(reqs):
            scheduler.step()
            first_pass.update({r.rid: len(r.output_ids) for r in reqs if r.output_ids and r.rid not in first_pass})
        if jump:  # drafts computed with the prompts, the agreeing ones output at once
            assert scheduler.stats.drafted_tokens > 0 and max(first_pass.values()) > 1
            # no slot left to a rejected draft: every slot in use holds a computed token
            used = free_before - scheduler.runner.kv_pool.available_size
            assert used == scheduler.cache.stats()["kv_cached_tokens"] + sum(r.kv_len - r.cached_len for r in reqs)
        else:
            assert set(first_pass.values()) == {1}
        while scheduler.has_work:
            scheduler.step()
        outputs[jump] = [r.output_ids for r in reqs]
        passes[jump] = scheduler.stats.forward_passes
        text = [scheduler.tokenizer.decode(o) for o in outputs[jump]]
        assert all(re.fullmatch(regex, t) for t in text), text
    assert outputs[True] == outputs[False]
    assert passes[True] < passes[False]


def test_jump_forward_keeps_logprobs(tiny_llama_dir):
    """With logprobs asked for, drafts (in the prompt's pass and later) change nothing a client
    sees: the same tokens, input logprobs and output logprobs (top ones too) as without."""
    import langrt

    regex = r'\{"name": "[a-z]{1,8}", "legs": [0-9]\}'
    got = {}
    for jump in (True, False):
        with langrt.Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=4096, context_length=512,
                           log_level="warning", disable_jump_forward=not jump) as engine:  # fmt: skip
            outs = engine.generate(["Describe an animal:", "JSON please:"], {"regex": regex, "max_new_tokens": 60, "temperature": 0},
                                   return_logprob=True, logprob_start_len=0, top_logprobs_num=2)  # fmt: skip
            got[jump] = [o["meta_info"] for o in outs], [o["output_ids"] for o in outs]
            if jump:
                assert engine.cache_stats()["jump_forward_tokens"] > 0
    (on_meta, on_ids), (off_meta, off_ids) = got[True], got[False]
    assert on_ids == off_ids
    for a, b, ids in zip(on_meta, off_meta, on_ids):
        for key in ("input_token_logprobs", "output_token_logprobs"):
            assert [e[1] for e in a[key]] == [e[1] for e in b[key]]
            assert all(x[0] == y[0] or abs(x[0] - y[0]) < 1e-4 for x, y in zip(a[key], b[key]))
        assert [e[1] for e in a["output_token_logprobs"]] == ids
        assert [[t[1] for t in row] for row in a["output_top_logprobs"]] == [
            [t[1] for t in row] for row in b["output_top_logprobs"]
        ]


def test_jump_forward_keeps_seeded_sampling(tiny_llama_dir):
    """A seeded sampled request draws one random choice per output token, drafted or not: the
    same text with and without jump-forward."""
    import langrt

    regex = r'\{"name": "[a-z]{1,8}", "legs": [0-9]\}'
    texts = {}
    for jump in (True, False):
        with langrt.Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=4096, context_length=512,
                           log_level="warning", disable_jump_forward=not jump) as engine:  # fmt: skip
            outs = engine.generate(["Describe an animal:", "JSON please:", "x"],
                                   {"regex": regex, "max_new_tokens": 60, "temperature": 1.0, "seed": 7})  # fmt: skip
            texts[jump] = [o["text"] for o in outs]
            assert engine.cache_stats()["jump_forward_tokens"] > 0 or not jump
    assert texts[True] == texts[False]
    assert all(re.fullmatch(regex, t) for t in texts[True])
