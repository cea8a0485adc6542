"""6: faults. SIGTERM during load; a killed detokenizer (the killed scheduler is
tests/e2e/test_server_errors.py's); a killed tensor-parallel rank; a killed grammar compiler."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.stress import faults

pytestmark = pytest.mark.slow


def test_sigterm_under_load_ends_every_request(tiny_model):
    """In-flight requests (streams, waits, chat, constrained) each end with an abort status, a
    503 or a closed connection within the shutdown grace, none hangs; late arrivals are
    refused; the server exits 0 and leaves no ipc file or process behind."""
    result = asyncio.run(
        faults.run_sigterm([*tiny_model, "--max-total-tokens", "16384"], requests=16, new_tokens=1500, late=6)
    )
    assert result["lost"] == 0 and result["late_arrivals"]["lost"] == 0, (
        result["failures"],
        result["late_arrivals"]["failures"],
    )
    assert result["http_5xx_other"] == 0
    assert result["ends"].get("aborted", 0) >= 8, f"in-flight requests should get an abort status: {result['ends']}"
    assert "shutting down" in " ".join(result["abort_messages"])
    assert result["exit_code"] == 0 and result["exit_after_signal_s"] < 10
    assert result["end_after_signal_s"]["max"] < 10
    assert result["ipc_directory_removed"] and result["processes_left"] == []


def test_killed_detokenizer_means_503_then_exit(tiny_model):
    result = asyncio.run(
        faults.run_kill_child(
            [*tiny_model, "--max-total-tokens", "8192"], child="detokenizer", requests=8, new_tokens=1500
        )
    )
    assert result["first_503_after_s"] is not None and result["first_503_after_s"] < 2, result["health_statuses"]
    assert result["exit_code"] not in (0, None) and result["exit_after_kill_s"] < 5
    assert result["lost"] == 0, result["failures"]
    assert result["ipc_directory_removed"] and result["processes_left"] == []


def test_killed_tensor_parallel_rank_means_503_then_exit(tiny_model):
    """--tp-size 2: rank 1 (a model worker) is killed mid-decode. Rank 0 sees gloo's connection
    close, the server sees a child gone: 503, exit, nothing left, like a dead scheduler."""
    flags = [*tiny_model, "--max-total-tokens", "8192", "--tp-size", "2"]
    result = asyncio.run(faults.run_kill_child(flags, child="tp-worker", requests=8, new_tokens=1500))
    assert result["first_503_after_s"] is not None and result["first_503_after_s"] < 2, result["health_statuses"]
    assert result["exit_code"] not in (0, None) and result["exit_after_kill_s"] < 5
    assert result["lost"] == 0, result["failures"]
    assert result["ipc_directory_removed"] and result["processes_left"] == []


def test_killed_main_process_takes_its_children_and_ipc_files(tiny_model):
    """kill -9 of the HTTP process: it cannot clean up, so its children notice, remove the ipc
    directory and exit; clients see their connections close."""
    result = asyncio.run(
        faults.run_kill_child([*tiny_model, "--max-total-tokens", "8192"], child="main", requests=4, new_tokens=1500)
    )
    assert result["exit_code"] == -9 and result["lost"] == 0, result["failures"]
    assert result["ends"] == {"closed": 4}
    assert result["ipc_directory_removed"] and result["processes_left"] == []
    assert result["cleaned_up_after_kill_s"] < 5


def test_killed_grammar_compiler_fails_one_request(server):
    result = asyncio.run(faults.run_kill_grammar_worker(server))
    assert result["slow_request_status"] == 400 and "worker" in result["slow_request_message"], result
    assert result["slow_request_end_after_kill_s"] < 2
    assert result["next_constrained_status"] == 200 and result["new_worker"] not in (None, result["killed_worker"])
    assert result["healthy"]
