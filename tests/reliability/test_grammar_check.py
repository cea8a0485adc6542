"""The main process's grammar check: worker processes, a time limit, killed when past it."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from langrt.errors import InvalidRequest, UnsupportedSchema
from langrt.server.grammar_check import GrammarChecker
from langrt.sampling.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

SLOW_SCHEMA = json.dumps({"enum": [f"value-{i}" for i in range(60_000)]})  # ~20 s to turn into a regex


def run(coroutine):
    return asyncio.run(coroutine)


def test_verdicts_come_back_with_their_param():
    async def main():
        checker = GrammarChecker(timeout_s=10)
        try:
            await checker.check(SamplingParams(regex="[0-9]+"))
            await checker.check(SamplingParams())  # unconstrained: no worker needed
            await checker.check(SamplingParams(ebnf="root ::= 'a' root?"))
            with pytest.raises(InvalidRequest) as bad:
                await checker.check(SamplingParams(ebnf="root ::= 'a' | nowhere"))
            assert bad.value.param == "ebnf" and "line 1, column 16" in bad.value.message
            with pytest.raises(UnsupportedSchema):
                await checker.check(SamplingParams(json_schema=json.dumps({"type": "string", "pattern": "(?<=a)b"})))
        finally:
            await checker.close()

    run(main())


def test_a_slow_check_is_cut_off_and_does_not_block_the_next():
    async def main():
        checker = GrammarChecker(timeout_s=1.5)
        try:
            start = time.monotonic()
            slow = asyncio.create_task(checker.check(SamplingParams(json_schema=SLOW_SCHEMA)))
            await asyncio.sleep(0.2)
            await checker.check(SamplingParams(regex="(yes|no)"))  # the other worker answers meanwhile
            assert time.monotonic() - start < 1.5
            with pytest.raises(InvalidRequest, match="time limit of 1.5 s") as e:
                await slow
            assert e.value.param == "json_schema" and time.monotonic() - start < 3
            assert checker._busy == set() and len(checker._idle) == 1, "the slow worker was killed, not kept"
            await checker.check(SamplingParams(regex="[a-z]+"))  # and the checker still serves
        finally:
            await checker.close()

    run(main())
