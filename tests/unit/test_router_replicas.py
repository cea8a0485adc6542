"""`--dp-size`: what each replica is launched with."""

from __future__ import annotations

import pytest

from langrt.router.replicas import replica_flags, replica_threads
from langrt.server_args import ServerArgs


def test_replicas_get_the_launch_settings_but_not_its_address():
    args = ServerArgs(dp_size=2, port=31000, host="0.0.0.0", max_total_tokens=4096, disable_radix_cache=True, api_key="k")
    flags = replica_flags(args)
    assert flags == ["--max-total-tokens", "4096", "--disable-radix-cache", "--api-key", "k"]


def test_threads_are_shared_out_unless_given():
    assert replica_threads(ServerArgs(dp_size=2, num_threads=3)) == 3
    assert replica_threads(ServerArgs(dp_size=64)) == 1


def test_dp_size_must_be_positive_and_engines_refuse_it():
    with pytest.raises(ValueError, match="dp-size"):
        ServerArgs(dp_size=0)
    from langrt.engine import Engine

    with pytest.raises(ValueError, match="dp-size N"):
        Engine(dp_size=2)
