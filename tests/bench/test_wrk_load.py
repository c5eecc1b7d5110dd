"""bench/wrk_load.py (make bench-serving-peers' pure parts): wrk's report parsed, request
bodies written for bench/wrk_post.lua (and sent by it, where wrk is installed), and two
servers' v2 answers compared."""
from __future__ import annotations

import importlib.util
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "wrk_load.py"
_spec = importlib.util.spec_from_file_location("wrk_load", _PATH)
wrk_load = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wrk_load)

# wrk 4.1.0's report (Debian's package) with --latency, against a server answering 501
REPORT = """Running 1s test @ http://127.0.0.1:18555
  1 threads and 2 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.63ms    2.52ms  23.85ms   90.52%
    Req/Sec     1.83k   463.54     2.54k    80.00%
  Latency Distribution
     50%  701.00us
     75%    1.64ms
     90%    4.08ms
     99%   14.06ms
  1833 requests in 1.01s, 0.97MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 1833
Requests/sec:   1819.95
Transfer/sec:      0.96MB
"""


def test_parse_wrk_reads_counts_rates_percentiles_and_errors():
    r = wrk_load.parse_wrk(REPORT)
    assert r["requests"] == 1833
    assert r["duration_s"] == pytest.approx(1.01)
    assert r["rps"] == pytest.approx(1819.95)
    assert r["p50_ms"] == pytest.approx(0.701)
    assert r["p99_ms"] == pytest.approx(14.06)
    assert r["non_2xx"] == 1833
    assert r["socket_errors"] == 5


def test_parse_wrk_units_and_a_clean_run():
    text = (REPORT.replace("701.00us", "1.50s").replace("14.06ms", "2.00m")
            .replace("  Non-2xx or 3xx responses: 1833\n", "")
            .replace("  Socket errors: connect 0, read 2, write 0, timeout 3\n", ""))
    r = wrk_load.parse_wrk(text)
    assert r["p50_ms"] == pytest.approx(1500.0)
    assert r["p99_ms"] == pytest.approx(120000.0)
    assert r["non_2xx"] == 0 and r["socket_errors"] == 0


@pytest.mark.parametrize("drop, needle", [
    ("  1833 requests in 1.01s, 0.97MB read\n", "requests in"),
    ("Requests/sec:   1819.95\n", "Requests/sec"),
    ("     99%   14.06ms\n", "--latency"),
])
def test_parse_wrk_names_what_is_missing(drop, needle):
    with pytest.raises(wrk_load.WrkError, match=needle):
        wrk_load.parse_wrk(REPORT.replace(drop, ""))


def test_write_bodies_one_a_line_and_refuses_line_breaks(tmp_path):
    p = wrk_load.write_bodies([b'{"a":1}', b'{"b":[2,3]}'], tmp_path / "bodies.txt")
    assert p.read_bytes().splitlines() == [b'{"a":1}', b'{"b":[2,3]}']
    with pytest.raises(ValueError, match=r"bodies\[1\]"):
        wrk_load.write_bodies([b"{}", b'{\n"a":1}'], tmp_path / "x.txt")
    with pytest.raises(ValueError, match="no request bodies"):
        wrk_load.write_bodies([], tmp_path / "y.txt")


def _answer(version="7", data=(0.1, 0.25), shape=(2, 1), datatype="FP32", name="probability"):
    return {"model_name": "ctr", "model_version": version,
            "outputs": [{"name": name, "datatype": datatype, "shape": list(shape), "data": list(data)}]}


def test_compare_answers_equal_as_float32():
    # json.dumps of a float32 widened to double vs orjson's shortest float32 form: one value
    wide = [float(__import__("numpy").float32(0.1)), 0.25]
    assert wide[0] != 0.1
    assert wrk_load.compare_answers(_answer(data=wide), _answer(data=(0.1, 0.25))) == []
    assert wrk_load.compare_answers(_answer(version=7), _answer(version="7")) == []


@pytest.mark.parametrize("other, needle", [
    (_answer(data=(0.1, 0.26)), "probability.data: 1 of 2 elements differ (first: element 1"),
    (_answer(version="8"), "model_version"),
    (_answer(shape=(1, 2)), "probability.shape"),
    (_answer(datatype="FP64"), "probability.datatype"),
    (_answer(name="score"), "outputs:"),
    ({"error": "boom"}, "kserve: no 'outputs' array"),
])
def test_compare_answers_names_the_difference(other, needle):
    diffs = wrk_load.compare_answers(_answer(), other, ("ours", "kserve"))
    assert diffs and any(needle in d for d in diffs), diffs


class _Recorder(BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (scripts/install-wrk.sh)")
def test_wrk_post_lua_sends_every_body_in_turn(tmp_path):
    """The Lua script POSTs the file's bodies, each whole, to the path with the content type."""
    sent = [b'{"k":%d,"pad":"%s"}' % (k, b"x" * 100 * k) for k in range(3)]
    bodies = wrk_load.write_bodies(sent, tmp_path / "bodies.txt")
    _Recorder.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.handle_error = lambda request, address: None  # wrk closes its connections mid-answer at the end
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        r = wrk_load.run_wrk(f"http://127.0.0.1:{server.server_port}", "/v2/models/ctr/infer", bodies,
                             connections=1, duration_s=1.0)
    finally:
        server.shutdown()
        server.server_close()
    got = _Recorder.bodies
    assert r["requests"] > 3 and r["non_2xx"] == 0
    assert {p for p, _, _ in got} == {"/v2/models/ctr/infer"}
    assert {c for _, c, _ in got} == {"application/json"}
    assert {b for _, _, b in got} == set(sent)
    order = [sent.index(b) for _, _, b in got]
    assert all((b - a) % 3 == 1 for a, b in zip(order, order[1:]))  # in turn, one connection
