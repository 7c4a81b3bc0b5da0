"""An unreachable or overloaded object store is a retryable error (exit 75), an access or not-found failure a
terminal one (exit 1); either way the message is one plain line.

The object store is a local HTTP server answering every request with one S3 status and error body, or a
port nobody listens on: what delta-rs sees of an outage (no Delta table is involved)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ticdc_delta.cli import EXIT_RETRYABLE, EXIT_TERMINAL, exit_code_for
from ticdc_delta.delta.sink import read_table, storage_error, storage_unreachable
from ticdc_delta.errors import one_line
from ticdc_delta.delta.state_store import PipelineState, StateStore
from ticdc_delta.errors import SinkError, StorageUnavailableError

# what delta-rs 1.6.6 raised (an OSError) for an S3 endpoint refusing connections, RUST_BACKTRACE unset
REFUSED_TEXT = (
    "Kernel error -> Generic S3 error\n          \x1b[31m↳\x1b[0m Error performing GET "
    "http://127.0.0.1:1/lake/x/_delta_log/_last_checkpoint in 102.061081ms, after 1 retries, max_retries\n"
    "           \x1b[31m↳\x1b[0m 1, retry_timeout\n            \x1b[31m↳\x1b[0m 2s  - HTTP error\n"
    "             \x1b[31m↳\x1b[0m error sending request\n              \x1b[31m↳\x1b[0m client error (Connect)\n"
    "               \x1b[31m↳\x1b[0m tcp connect error\n"
    "                \x1b[31m↳\x1b[0m Connection refused (os error 111)\n"
)
# ... and for a damaged log with RUST_BACKTRACE=1 (a DeltaError): the backtrace is part of the text
BACKTRACE_TEXT = (
    "Kernel error: Json error: Encountered unexpected 'n' whilst parsing object\n   0: <unknown>\n"
    "   1: <unknown>\n  12: start_thread\n             at ./nptl/pthread_create.c:442:8\n"
)


def test_one_line_joins_delta_rs_causes_without_colours_or_backtrace() -> None:
    assert one_line(REFUSED_TEXT) == (
        "Kernel error -> Generic S3 error: Error performing GET http://127.0.0.1:1/lake/x/_delta_log/_last_checkpoint"
        " in 102.061081ms, after 1 retries, max_retries: 1, retry_timeout: 2s - HTTP error: error sending request:"
        " client error (Connect): tcp connect error: Connection refused (os error 111)"
    )
    assert one_line(BACKTRACE_TEXT) == "Kernel error: Json error: Encountered unexpected 'n' whilst parsing object"


@pytest.mark.parametrize(
    "exc",
    [
        OSError(REFUSED_TEXT),
        OSError("Generic S3 error: Error performing GET http://s3/x in 3ms - HTTP error: error sending request: "
                "client error (Connect): dns error: failed to lookup address information: Name or service not known"),
        OSError("Generic S3 error: Error performing PUT http://s3/x in 30s - HTTP error: operation timed out"),
        OSError("Generic S3 error: Error performing GET http://s3/x - Server returned non-2xx status code: "
                "503 Service Unavailable: <Error><Code>SlowDown</Code></Error>"),
        OSError("Generic S3 error: Error performing GET http://s3/x - Server returned non-2xx status code: "
                "429 Too Many Requests: "),
        OSError("Generic GCS error: status: 502, connection reset by peer"),
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError("read"),
    ],
)
def test_an_unreachable_or_overloaded_storage_is_retryable(exc: BaseException) -> None:
    assert storage_unreachable(exc)
    error = storage_error("cannot read Delta table s3://lake/t", exc)
    assert isinstance(error, StorageUnavailableError) and exit_code_for(error) == EXIT_RETRYABLE
    assert "\n" not in str(error) and "\x1b" not in str(error) and str(error).startswith("cannot read Delta table")


@pytest.mark.parametrize(
    "exc",
    [
        OSError("Kernel error -> The operation lacked the necessary privileges to complete for path t: Error "
                "performing GET http://s3/x in 1.7ms, after 3 retries, max_retries: 10, retry_timeout: 180s - Server returned "
                "non-2xx status code: 403 Forbidden: <Error><Code>AccessDenied</Code></Error>"),
        OSError("Generic S3 error: Error performing list request: Error performing GET http://s3/x in 503.2ms - Server "
                "returned non-2xx status code: 404 Not Found: <Error><Code>NoSuchBucket</Code></Error>"),
        OSError("Generic S3 error: connection refused; InvalidAccessKeyId"),  # credentials first
        PermissionError(13, "Permission denied"),
        OSError(BACKTRACE_TEXT),
        ValueError("Invalid table location: relative URL without a base"),
    ],
)
def test_access_missing_and_invalid_stay_terminal(exc: BaseException) -> None:
    assert not storage_unreachable(exc)
    error = storage_error("cannot read Delta table s3://lake/t", exc)
    assert type(error) is SinkError and exit_code_for(error) == EXIT_TERMINAL
    assert "\n" not in str(error) and "\x1b" not in str(error)


def _s3(status: int, code: str) -> Iterator[dict[str, str]]:
    body = f"<Error><Code>{code}</Code><Message>the store says no</Message></Error>".encode()

    class Answer(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield _options(f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()


def _options(endpoint: str) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret", "max_retries": "0",
            "retry_timeout": "1s"}


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:  # a port just free: nobody listens on it
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def slow_down() -> Iterator[dict[str, str]]:
    yield from _s3(503, "SlowDown")


@pytest.fixture
def access_denied() -> Iterator[dict[str, str]]:
    yield from _s3(403, "AccessDenied")


CALLS: dict[str, Callable[[dict[str, str]], object]] = {
    "read_table": lambda opts: read_table("s3://lake/tidb/shop/orders", storage_options=opts),
    "StateStore.save": lambda opts: StateStore("s3://lake/ckpt/state", "cf", storage_options=opts).save(
        0, PipelineState(0)),
    "StateStore.load": lambda opts: StateStore("s3://lake/ckpt/state", "cf", storage_options=opts).load(),
    "StateStore.committed_batch_id": lambda opts: StateStore(
        "s3://lake/ckpt/state", "cf", storage_options=opts).committed_batch_id(),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_refused_connection_is_retryable(call: str, closed_port: int) -> None:
    with pytest.raises(StorageUnavailableError, match=r"s3://lake/.*Connection refused") as raised:
        CALLS[call](_options(f"http://127.0.0.1:{closed_port}"))
    assert exit_code_for(raised.value) == EXIT_RETRYABLE
    assert "\n" not in str(raised.value) and "\x1b" not in str(raised.value)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_throttling_store_is_retryable(call: str, slow_down: dict[str, str]) -> None:
    with pytest.raises(StorageUnavailableError, match=r"503 Service Unavailable.*SlowDown") as raised:
        CALLS[call](slow_down)
    assert exit_code_for(raised.value) == EXIT_RETRYABLE


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_denied_access_stays_terminal(call: str, access_denied: dict[str, str]) -> None:
    with pytest.raises(SinkError, match=r"s3://lake/.*403 Forbidden.*AccessDenied") as raised:
        CALLS[call](access_denied)
    assert exit_code_for(raised.value) == EXIT_TERMINAL
    assert "\n" not in str(raised.value) and "\x1b" not in str(raised.value)
