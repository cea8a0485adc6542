"""Fixtures shared by the e2e modules."""

from __future__ import annotations

import pytest

from server_utils import LaunchedServer


@pytest.fixture(scope="session")
def frontend_server():
    """`langrt launch` on the built-in model for the frontend's tests, one per session: the
    native backends' (test_frontend_server.py) and then the OpenAI backend's
    (test_frontend_server_openai.py, which sorts after it) share it, saving a launch."""
    # One torch thread: on a shared 2-core machine two threads spin against other load and
    # run many times slower; alone, one thread costs little on this 135M model.
    s = LaunchedServer("--max-total-tokens", "32768", "--num-threads", "1")
    yield s
    assert s.stop() == 0
