"""`--dp-size`: what each replica is launched with."""

from __future__ import annotations

import types

import pytest

from langrt.router import replicas
from langrt.router.replicas import replica_flags, replica_threads
from langrt.server_args import ServerArgs


def test_replicas_get_the_launch_settings_but_not_its_address():
    args = ServerArgs(
        dp_size=2, port=31000, host="0.0.0.0", max_total_tokens=4096, disable_radix_cache=True, api_key="k"
    )
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


def test_replica_ports_avoid_the_public_port_and_each_other(monkeypatch):
    """The system may hand out the public port (not bound until the replicas are up) or one
    just given to another replica: those are passed over. (A replica once took the public port
    in a whole-suite run: the launch answered 404 to /list_workers, then exited 1.)"""
    handed_out = iter([31000, 40001, 40001, 31000, 40002])

    class FakeSocket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(handed_out)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr("socket.socket", FakeSocket)
    launched = []
    monkeypatch.setattr(
        replicas.subprocess, "Popen", lambda command, **kw: launched.append(command) or types.SimpleNamespace()
    )
    made = replicas.Replicas(ServerArgs(dp_size=2, port=31000))
    assert made.urls == ["http://127.0.0.1:40001", "http://127.0.0.1:40002"]
    assert [c[c.index("--port") + 1] for c in launched] == ["40001", "40002"]
