"""Fixtures shared by the e2e modules."""

from __future__ import annotations

import pytest

from server_utils import LaunchedServer

_LAST_USER = pytest.StashKey[str]()  # node id of the last collected test using frontend_server
_SERVER = pytest.StashKey[LaunchedServer]()


@pytest.fixture(scope="session")
def frontend_server(request):
    """`langrt launch` on the built-in model for the frontend's tests, one per session: the
    native backends' (test_frontend_server.py) and then the OpenAI backend's
    (test_frontend_server_openai.py, which sorts after it) share it, saving a launch. It stops
    after the last test that uses it, not at the end of the session (its KV pool is ~1.4 GB)."""
    # One torch thread: on a shared 2-core machine two threads spin against other load and
    # run many times slower; alone, one thread costs little on this 135M model.
    s = LaunchedServer("--max-total-tokens", "32768", "--num-threads", "1")
    request.config.stash[_SERVER] = s
    yield s
    assert s.stop() == 0


def pytest_collection_finish(session):
    """After -k / --deselect and reordering: the items that will run, in order."""
    users = [item.nodeid for item in session.items if "frontend_server" in getattr(item, "fixturenames", ())]
    if users:
        session.config.stash[_LAST_USER] = users[-1]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    server = item.config.stash.get(_SERVER, None)
    if server is not None and item.nodeid == item.config.stash.get(_LAST_USER, None):
        assert server.stop() == 0, "the frontend server did not stop cleanly"
