"""--lora-paths / --max-loras-per-batch on the command line, and which adapter an OpenAI
request's `model` names."""

from __future__ import annotations

import pytest

from langrt.cli import build_parser, server_args_from
from langrt.entrypoints.lora_api import adapter_of_model
from langrt.server_args import ServerArgs


def test_lora_paths_parse_to_named_pairs():
    ns = build_parser().parse_args(
        ["generate", "hi", "--lora-paths", "sql=/a/sql", "/b/chat", "--max-loras-per-batch", "2"]
    )
    args = server_args_from(ns)
    assert args.lora_paths == ("sql=/a/sql", "/b/chat") and args.max_loras_per_batch == 2
    assert args.lora_adapters == [("sql", "/a/sql"), ("/b/chat", "/b/chat")]


@pytest.mark.parametrize("paths, why", [(("a=/x", "a=/y"), "twice"), (("=/x",), "NAME=DIR"), (("a=",), "NAME=DIR")])
def test_bad_lora_paths_are_refused(paths, why):
    with pytest.raises(ValueError, match=why):
        ServerArgs(lora_paths=paths)


def test_openai_model_field_names_an_adapter():
    loaded = {"sql"}
    assert adapter_of_model("base:sql", "base", loaded) == "sql"
    assert adapter_of_model("sql", "base", loaded) == "sql"
    assert adapter_of_model("base:new", "base", loaded) == "new"  # not loaded: the scheduler refuses it by name
    assert adapter_of_model("base", "base", loaded) is None
    assert adapter_of_model("gpt-4o", "base", loaded) is None  # whatever a client sends: the base model
    assert adapter_of_model(None, "base", loaded) is None
