"""The REST codec's fast paths read exactly what the reference reading does: JSON ``data``
arrays decoded by simdjson straight into typed arrays give the tensors (or the error
messages) of the standard library's ``json`` reading, document by document; binary
tensors are views of the request body; answers carry the values ``json`` wrote."""
from __future__ import annotations

import json

import numpy as np
import pytest

from runtime.serving import rest_answer, rest_codec
from runtime.serving.protocol import BadRequest, InferOutput, InferRequest, InferResponse, JsonNumbers

U64_MAX = 2 ** 64 - 1


def _doc(dense, fs, dense_type="FP32", fs_type="UINT64", dense_shape=None, fs_shape=None, extra=""):
    """A request body with the two inputs' ``data`` given as JSON text."""
    return ('{"id":"r","inputs":[{"name":"dense_features","datatype":"%s","shape":%s,"data":%s},'
            '{"name":"feasigns","datatype":"%s","shape":%s,"data":%s}]%s}'
            % (dense_type, json.dumps(dense_shape or [1, 3]), dense, fs_type, json.dumps(fs_shape or [1, 2]), fs,
               extra)).encode()


# (case, body): documents the two readings must agree on, tensor by tensor or error by error
DOCS = [
    ("plain", _doc("[1.5,2,-3e2]", "[7,%d]" % U64_MAX)),
    ("null-missing", _doc("[null,2.0,3]", "[1,2]")),
    ("ints-as-floats", _doc("[1,2,3]", "[1,2]")),
    ("nested", _doc("[[1.0,2.0,3.0]]", "[[1,2]]")),
    ("nested-empty-in-flat", _doc("[1.0,[],[2.0,3.0]]", "[1,2]")),
    ("nested-in-flat", _doc("[1.0,[2.0],3.0]", "[1,2]")),
    ("ragged", _doc("[[1.0,2.0],[3.0]]", "[1,2]", dense_shape=[2, 1])),
    ("bracket-in-string", _doc("[1.0,2.0,3.0]", "[1,2]", extra=',"parameters":{"note":"a[b"}')),
    ("bool-dense", _doc("[true,2.0,3.0]", "[1,2]")),
    ("string-dense", _doc('["1.5",2.0,3.0]', "[1,2]")),
    ("nan-literal", _doc("[1.0,NaN,3.0]", "[1,2]")),
    ("infinity-literal", _doc("[1.0,2.0,-Infinity]", "[1,2]")),
    ("fp32-overflow", _doc("[1.0,2.0,1e39]", "[1,2]")),
    ("fp32-huge", _doc("[1.0,2.0,1e400]", "[1,2]")),
    ("too-few", _doc("[1.0,2.0]", "[1,2]")),
    ("too-many", _doc("[1.0,2.0,3.0]", "[1,2,3]")),
    ("negative-feasign", _doc("[1.0,2.0,3.0]", "[-1,2]")),
    ("float-feasign", _doc("[1.0,2.0,3.0]", "[1.0,2]")),
    ("null-feasign", _doc("[1.0,2.0,3.0]", "[null,2]")),
    ("bool-feasign", _doc("[1.0,2.0,3.0]", "[true,2]")),
    ("feasign-past-uint64", _doc("[1.0,2.0,3.0]", "[%d,2]" % (U64_MAX + 1))),
    ("int64-past-range", _doc("[1.0,2.0,3.0]", "[%d,-2]" % (2 ** 63), fs_type="INT64")),
    ("int64-negative", _doc("[1.0,2.0,3.0]", "[-5,2]", fs_type="INT64")),
    ("uint8-range", _doc("[1.0,2.0,3.0]", "[255,256]", fs_type="UINT8")),
    ("int8-range", _doc("[1.0,2.0,3.0]", "[-128,-129]", fs_type="INT8")),
    ("bool-datatype", _doc("[1.0,2.0,3.0]", "[true,false]", fs_type="BOOL")),
    ("bytes-datatype", _doc("[1.0,2.0,3.0]", '["a","b"]', fs_type="BYTES")),
    ("fp64", _doc("[0.1,2.0,1e300]", "[1,2]", dense_type="FP64")),
    ("fp16-overflow", _doc("[0.1,2.0,70000]", "[1,2]", dense_type="FP16")),
    ("duplicate-key", b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1.0],"data":[2.0]}]}'),
    ("duplicate-top-key", b'{"inputs":[],"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[3.0]}]}'),
    ("data-not-array", _doc('"1,2,3"', "[1,2]")),
    ("not-object", b"[1,2]"),
    ("not-json", b'{"inputs": [1,'),
    ("utf16", _doc("[1.0,2.0,3.0]", "[1,2]").decode().encode("utf-16")),
    ("escaped-key", _doc("[1.0,2.0,3.0]", "[1,2]").replace(b'"data"', b'"d\\u0061ta"', 1)),
    # nulls: read as missing values of FP arrays first (rest_codec.MISSING), kept only when exact
    ("nulls-all", _doc("[null,null,null]", "[1,2]")),
    ("null-fp64", _doc("[null,2.0,1e300]", "[1,2]", dense_type="FP64")),
    ("null-fp16", _doc("[null,2.0,3.0]", "[1,2]", dense_type="FP16")),
    ("null-and-missing-literal-fp64", _doc("[null,1e99,3.0]", "[1,2]", dense_type="FP64")),
    ("null-and-missing-literal-fp32", _doc("[null,1e99,3.0]", "[1,2]")),
    ("null-and-missing-literal-fp16", _doc("[null,1e99,3.0]", "[1,2]", dense_type="FP16")),
    ("null-and-missing-literal-spelled", _doc("[null,10e98,3.0]", "[1,2]", dense_type="FP64")),
    ("null-and-missing-literal-in-int64", _doc("[null,2.0,3.0]", "[1,1e99]", fs_type="INT64")),
    ("null-and-overflow", _doc("[null,2.0,1e39]", "[1,2]")),
    ("null-and-nan-literal", _doc("[null,NaN,3.0]", "[1,2]")),
    ("null-and-bool", _doc("[null,true,3.0]", "[1,2]")),
    ("null-and-string", _doc('[null,"null",3.0]', "[1,2]")),
    ("null-nested", _doc("[[null,2.0,3.0]]", "[[1,2]]")),
    ("null-in-int64", _doc("[1.0,2.0,3.0]", "[null,2]", fs_type="INT64")),
    ("null-in-bytes", _doc("[null,2.0,3.0]", '["a",null]', fs_type="BYTES")),
    ("null-id", _doc("[null,2.0,3.0]", "[1,2]", extra=',"outputs":null').replace(b'"id":"r"', b'"id":null')),
    ("null-in-id-string", _doc("[null,2.0,3.0]", "[1,2]").replace(b'"id":"r"', b'"id":"not null"')),
    ("null-parameter", _doc("[null,2.0,3.0]", "[1,2]", extra=',"parameters":{"x":null}')),
    ("null-in-key", _doc("[null,2.0,3.0]", "[1,2]", extra=',"parameters":{"nullable":1}')),
    ("null-data", _doc("null", "[1,2]")),
    ("null-escaped-in-string", _doc("[null,2.0,3.0]", "[1,2]").replace(b'"id":"r"', b'"id":"a\\nullb"')),
    ("missing-text-in-string", _doc("[null,2.0,3.0]", "[1,2]").replace(
        b'"id":"r"', b'"id":"%s"' % rest_codec.MISSING_TEXT.encode())),
    # a null outside the FP arrays and a MISSING sent as a number: as many as the nulls, but not them
    ("null-in-string-and-missing-literal", _doc("[1.0,1e99,3.0]", "[1,2]", dense_type="FP64")
     .replace(b'"id":"r"', b'"id":"null"')),
    ("null-in-key-and-missing-literal", _doc("[1.0,1e99,3.0]", "[1,2]", dense_type="FP64",
                                             extra=',"parameters":{"null":1}')),
    ("null-parameter-and-missing-literal", _doc("[1.0,1e99,3.0]", "[1,2]", dense_type="FP64",
                                                extra=',"parameters":{"x":null}')),
    ("null-only-outside-data", _doc("[1.0,2.0,3.0]", "[1,2]", extra=',"parameters":{"x":null}')),
]


def _outcome(body: bytes):
    """The tensors the model would get from ``body``, then the request's id, parameters and
    requested outputs (or the error message)."""
    try:
        req = rest_codec.decode_rest_request(body)
        outputs = None if req.outputs is None else [(o.name, o.parameters) for o in req.outputs]
        return [(i.name, i.datatype, i.array()) for i in req.inputs] + [("", "", (req.id, req.parameters, outputs))]
    except BadRequest as exc:
        return str(exc)


def _reference(body: bytes, monkeypatch):
    """``_outcome`` with simdjson taken out: the standard library's reading throughout."""
    with monkeypatch.context() as m:
        def refuse(text, recursive=False):
            raise ValueError("simdjson disabled")

        m.setattr(rest_codec, "_parse", refuse)
        return _outcome(body)


@pytest.mark.parametrize("small", [True, False], ids=["read-at-once", "read-lazily"])
@pytest.mark.parametrize("case,body", DOCS, ids=[c for c, _ in DOCS])
def test_simdjson_reading_equals_the_json_reading(case, body, small, monkeypatch):
    want = _reference(body, monkeypatch)
    monkeypatch.setattr(rest_codec, "SMALL_DOCUMENT", 1 << 20 if small else 0)
    got = _outcome(body)
    if isinstance(want, str):
        assert got == want, case
        return
    assert not isinstance(got, str), (case, got)
    assert [(n, d) for n, d, _ in got] == [(n, d) for n, d, _ in want]
    assert got[-1] == want[-1], case  # id, parameters, outputs
    for (_, _, a), (_, _, b) in zip(got[:-1], want[:-1]):
        assert a.dtype == b.dtype, case
        if a.dtype == object:
            assert a.tolist() == b.tolist(), case
        else:
            np.testing.assert_array_equal(a, b, err_msg=case)


@pytest.mark.parametrize("body", [b"", b"n", b"nul", b"null", b"nulll", b"nnull", b"nullnull", b"null,null",
                                  b'{"a":[null,1,null]}', b"nu ll", b"NULL", b"xnul", b"nulx", b"nuxl",
                                  b"nulnull", b"null" * 1000 + b"nul"])
def test_spell_nulls_is_replace(body):
    """``spell_nulls`` writes what ``bytes.replace`` writes, and counts what it replaced."""
    text, count = rest_codec.spell_nulls(body)
    assert text == body.replace(b"null", rest_codec.MISSING_TEXT.encode())
    assert count == body.count(b"null")
    assert type(text) is bytes


def test_numbers_go_straight_into_typed_arrays(monkeypatch):
    """In a document over ``SMALL_DOCUMENT`` bytes, a flat array of numbers never becomes a
    list of Python numbers (``JsonNumbers``), nor does an FP one with nulls (missing dense
    values) unless a null lies where no FP array accounts for it."""
    monkeypatch.setattr(rest_codec, "SMALL_DOCUMENT", 0)
    req = rest_codec.decode_rest_request(_doc("[1.5,2,-3e2]", "[7,%d]" % U64_MAX))
    dense, fs = req.inputs
    assert isinstance(dense.data, JsonNumbers) and dense.data.values.dtype == np.float32
    assert isinstance(fs.data, JsonNumbers) and fs.data.values.dtype == np.uint64
    np.testing.assert_array_equal(fs.array(), np.array([7, U64_MAX], dtype=np.uint64))
    # missing values (null) too: read as rest_codec.MISSING, then NaN
    req = rest_codec.decode_rest_request(_doc("[null,2,3]", "[1,2]"))
    assert isinstance(req.inputs[0].data, JsonNumbers) and isinstance(req.inputs[1].data, JsonNumbers)
    np.testing.assert_array_equal(req.inputs[0].array(), np.array([np.nan, 2, 3], dtype=np.float32))
    # a null the FP arrays cannot account for (here in a string): read as sent, values as JSON
    req = rest_codec.decode_rest_request(_doc("[null,2,3]", "[1,2]", extra=',"parameters":{"n":"null"}'))
    assert isinstance(req.inputs[0].data, list) and req.parameters == {"n": "null"}
    assert np.isnan(req.inputs[0].array()[0])
    # a "[" in a string only costs the fast path, never the reading
    req = rest_codec.decode_rest_request(_doc("[1.0,2.0,3.0]", "[1,2]", extra=',"id":"x[y"'))
    assert isinstance(req.inputs[1].data, list) and req.id == "x[y"


def test_parser_reused_and_replaced_when_a_value_is_still_held():
    held = rest_codec._simd_document(_doc("[1.0,2.0,3.0]", "[1,2]"))  # keeps simdjson values alive
    for _ in range(3):
        req = rest_codec.decode_rest_request(_doc("[1.0,2.0,4.0]", "[1,2]"))
        assert req.inputs[0].array()[2] == 4.0
    assert held[0]["inputs"][0]["data"].as_list() == [1.0, 2.0, 3.0]


def test_binary_tensors_are_views_of_the_body():
    dense = np.arange(6, dtype="<f4").reshape(2, 3)
    fs = np.arange(4, dtype="<u8").reshape(2, 2) + (1 << 40)
    head = json.dumps({"inputs": [
        {"name": "dense_features", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}},
        {"name": "feasigns", "datatype": "UINT64", "shape": [2, 2], "parameters": {"binary_data_size": 32}}]}).encode()
    body = head + dense.tobytes() + fs.tobytes()
    req = rest_codec.decode_rest_request(body, len(head))
    whole = np.frombuffer(body, dtype=np.uint8)
    got_dense, got_fs = req.inputs[0].array(), req.inputs[1].array()
    assert np.shares_memory(got_dense, whole) and np.shares_memory(got_fs, whole)
    np.testing.assert_array_equal(got_dense, dense.ravel())
    np.testing.assert_array_equal(got_fs, fs.ravel())


@pytest.mark.parametrize("data", [
    np.array([[0.1], [1e-5], [0.3333333333], [1.0], [0.0]], dtype=np.float32),
    np.array([1, 2, U64_MAX], dtype=np.uint64),
    np.array([-3, 0, 2 ** 40], dtype=np.int64),
    np.array([True, False]),
    np.array(["a", "é"], dtype=object),
], ids=["fp32", "uint64", "int64", "bool", "bytes"])
def test_json_answer_holds_the_values_json_wrote(data):
    dtype = {"f": "FP32", "u": "UINT64", "i": "INT64", "b": "BOOL", "O": "BYTES"}[data.dtype.kind]
    out = InferOutput("probability", dtype, list(data.shape), data)
    resp = InferResponse("ctr", "7", [out], id="r", parameters={"model_version": 7})
    body, header_length = rest_answer.encode_response(resp, InferRequest(inputs=[]))
    assert header_length is None
    got = json.loads(body)
    want = {"model_name": "ctr", "model_version": "7", "id": "r", "parameters": {"model_version": 7},
            "outputs": [{"name": "probability", "datatype": dtype, "shape": list(data.shape),
                         "data": data.ravel().tolist()}]}
    assert got == want
    assert all(type(a) is type(b) for a, b in zip(got["outputs"][0]["data"], want["outputs"][0]["data"]))
