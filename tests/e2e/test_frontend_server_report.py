"""Program reports (issue 28): examples/fork_and_vote.py run against the shared frontend server
renders a report that shows the fork's shared prefix and what the cache served. (Named to sort
after test_frontend_server_openai.py, so the shared server still stops right after its users.)"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import langrt_frontend as sgl

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_fork_and_vote_report_shows_the_forks_shared_prefix(frontend_server, tmp_path):
    sys.path.insert(0, str(EXAMPLES))
    from fork_and_vote import QUESTION, fork_and_vote

    state = fork_and_vote.run(question=QUESTION, n=3, max_tokens=6, backend=sgl.RuntimeEndpoint(frontend_server.url))
    assert state.error() is None
    page = state.report(tmp_path / "fork_and_vote.html").read_text()

    forks = re.findall(
        r"<div class='shared-prefix fork' data-members='(\d+)' data-chars='(\d+)'>(.*?)</div></div>", page, re.S
    )
    assert len(forks) == 1, "one fork point: the three candidates continue from the same text"
    members, chars, body = forks[0]
    assert int(members) >= 4, "the fork's cache warm-up and its three candidate gens"
    assert QUESTION in body and int(chars) > len(QUESTION)
    served = int(re.search(r"they were served (\d+) prompt tokens from the cache", body).group(1))
    assert served > 0, "the candidates found the fork's prefix cached"
    continuing = re.search(r"<b>fork</b>: \d+ requests continue from its end \(([^)]*)\)", body).group(1)
    assert continuing.count(" gen candidate") == 3, continuing

    rows = re.findall(
        r"<tr><td>(\d+)</td><td>[^<]*</td><td>(\w+)</td><td>([^<]*)</td><td class='num'>(\d+)</td><td class='num'>(\d+)</td>",
        page,
    )
    candidates = [r for r in rows if r[1] == "gen" and r[2] == "candidate"]
    assert len(candidates) == 3 and all(int(r[4]) > 0 for r in candidates), "each candidate reused the prefix"
    assert [r[2] for r in rows if r[1] == "select"] == ["best"]
    assert page.count("class='kind-gen'") == 3 and "id='timeline'" in page
