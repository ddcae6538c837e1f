"""The stack's REST client against a real HTTP server on loopback: Airflow answers a DELETE
with 204 and no body, which must not read as a broken reply."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cairn_stack.airflow_api import AirflowAPI
from cairn_stack.settings import StackSettings


class _Airflow(BaseHTTPRequestHandler):
    def _json(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self._json(201, {"access_token": "t"})

    def do_GET(self) -> None:
        if self.headers["Authorization"] != "Bearer t":
            self._json(401, {"detail": "no token"})
        else:
            self._json(200, {"dag_id": self.path.rsplit("/", 1)[-1]})

    def do_DELETE(self) -> None:
        if self.path.endswith("/missing"):
            self._json(404, {"detail": "DAG missing not found"})
            return
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[AirflowAPI]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Airflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = StackSettings(airflow_port=server.server_address[1])
        yield AirflowAPI(settings)
    finally:
        server.shutdown()


def test_a_reply_with_no_body_is_none_and_json_replies_are_parsed(api):
    assert api.call("DELETE", "/api/v2/dags/archive__x") is None
    assert api.call("GET", "/api/v2/dags/archive__x") == {"dag_id": "archive__x"}


def test_an_error_reply_names_the_call_and_the_status(api):
    with pytest.raises(RuntimeError, match=r"DELETE /api/v2/dags/missing: 404 .*not found"):
        api.call("DELETE", "/api/v2/dags/missing")
