"""Bench request bodies, decoded by the server's own codec; the stats delta; the cost maths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from queryserve.bench.bench import cost_per_million, endpoint_url
from queryserve.bench.payloads import build_payloads, read_queries
from queryserve.bench.server_stats import stats_delta
from queryserve.config import ModelConfig, TensorSpec
from queryserve.errors import BenchError
from queryserve.server.kserve_json import decode_infer_request

CONFIG = ModelConfig(
    name="embed", path=Path("."), backend="fake", pipeline="text_embedding", max_batch_size=8,
    inputs=(TensorSpec("text", "BYTES", (1,)),), outputs=(TensorSpec("embedding", "FP32", (4,)),))
QUERIES = ["wake me up at five am", "café olé ☕", "play jazz"]


@pytest.mark.parametrize("protocol", ["kserve", "kserve-binary"])
def test_kserve_bodies_decode_to_the_queries(protocol: str) -> None:
    payloads = build_payloads(protocol, QUERIES, model="embed", items_per_request=2)
    assert len(payloads.bodies) == 1 and payloads.items_per_request == 2
    headers = {k.lower(): v for k, v in (payloads.body_headers or [{}])[0].items()}
    request = decode_infer_request(payloads.bodies[0], headers, CONFIG)
    texts = [t.decode() if isinstance(t, bytes) else t for t in request.inputs["text"]]
    assert texts == QUERIES[:2]
    if protocol == "kserve-binary":
        assert payloads.content_type == "application/octet-stream"
        assert request.binary_default  # vectors come back binary too


def test_grpc_bodies_decode_to_the_queries_with_the_servers_grpc_codec() -> None:
    from queryserve.server.grpc import codec
    from queryserve.server.grpc.proto import grpc_service_pb2 as pb

    payloads = build_payloads("grpc", QUERIES, model="embed", items_per_request=2)
    message = pb.ModelInferRequest.FromString(payloads.bodies[0])
    request = codec.decode_infer_request(message, CONFIG)
    assert message.model_name == "embed"
    assert [t.decode() for t in request.inputs["text"]] == QUERIES[:2]  # type: ignore[union-attr]
    assert request.binary_default  # raw in, raw out: as perf_analyzer asks
    assert endpoint_url("grpc://127.0.0.1:8001", "grpc", "embed", None) == "grpc://127.0.0.1:8001"
    with pytest.raises(BenchError, match="add --protocol grpc"):
        endpoint_url("grpc://127.0.0.1:8001", "kserve", "embed", None)
    with pytest.raises(BenchError, match=r"e\.g\. grpc://127\.0\.0\.1:8001"):
        endpoint_url("http://127.0.0.1:8000", "grpc", "embed", None)


def test_openai_bodies_cycle_through_the_queries() -> None:
    payloads = build_payloads("openai", QUERIES, model="minilm", items_per_request=1)
    assert [json.loads(b) for b in payloads.bodies] == [
        {"model": "minilm", "input": [q]} for q in QUERIES]


def test_duplicates_bodies_are_pairs_from_tab_separated_lines() -> None:
    payloads = build_payloads("duplicates", ["sony w120\tsony dsc-w120", "a b\tc\td"],
                              model="duplicates", items_per_request=1)
    assert [json.loads(b) for b in payloads.bodies] == [
        {"model": "duplicates", "pairs": [["sony w120", "sony dsc-w120"]]},
        {"model": "duplicates", "pairs": [["a b", "c\td"]]}]
    with pytest.raises(BenchError, match="TEXT<TAB>TEXT"):
        build_payloads("duplicates", ["no tab here"], model="duplicates")


def test_bad_payload_options_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="protocol"):
        build_payloads("thrift", QUERIES, model="m")
    with pytest.raises(BenchError, match="does not exist"):
        read_queries(tmp_path / "nope.jsonl")
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"text": "ok"}\n{"title": "no text field"}\n')
    with pytest.raises(BenchError, match=r"q.jsonl:2 has no string field 'text'"):
        read_queries(bad)


def test_queries_from_jsonl_field_and_plain_lines(tmp_path: Path) -> None:
    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text('{"title": "usb cable"}\n\n{"title": "hdmi  "}\n')
    assert read_queries(jsonl, field="title") == ["usb cable", "hdmi"]
    text = tmp_path / "q.txt"
    text.write_text("one\n\n two \nthree\n")
    assert read_queries(text, limit=2) == ["one", "two"]
    empty = tmp_path / "e.txt"
    empty.write_text("\n\n")
    with pytest.raises(BenchError, match="holds no queries"):
        read_queries(empty)


def _stats(success: int, inferences: int, executions: int, queue_ns: int, compute_ns: int,
           batches: dict[int, int], items: int | None = None) -> dict[str, object]:
    pair = {"count": success, "ns": 0}
    items = success if items is None else items  # the server times queue and compute per item
    return {
        "inference_count": inferences, "execution_count": executions,
        "inference_stats": {"success": pair, "queue": {"count": items, "ns": queue_ns},
                            "compute_input": {"count": items, "ns": 0},
                            "compute_infer": {"count": items, "ns": compute_ns},
                            "compute_output": {"count": items, "ns": 0}},
        "batch_stats": [{"batch_size": b, "compute_infer": {"count": n, "ns": 0}}
                        for b, n in batches.items()],
    }


def test_stats_delta_is_what_the_step_cost_the_server() -> None:
    before = _stats(10, 10, 10, 1_000_000, 10_000_000, {1: 10})
    after = _stats(110, 110, 60, 51_000_000, 210_000_000, {1: 30, 2: 20, 4: 10})
    delta = stats_delta(before, after)
    assert delta == {
        "requests": 100, "inferences": 100, "executions": 50, "mean_batch": 2.0,
        "queue_ms_per_request": 0.5, "compute_ms_per_request": 2.0,
        "batch_sizes": {"1": 20, "2": 20, "4": 10},
    }
    assert stats_delta(None, after) is None
    # 4 items a request, each timed with its batch: a request's time, not 4 times it (a
    # request of 4 items showed 10 ms of compute against a client p99 of 9.4 ms).
    before = _stats(10, 40, 10, 4_000_000, 40_000_000, {4: 10}, items=40)
    after = _stats(20, 80, 20, 8_000_000, 80_000_000, {4: 20}, items=80)
    delta = stats_delta(before, after)
    assert delta is not None
    assert (delta["queue_ms_per_request"], delta["compute_ms_per_request"]) == (0.1, 1.0)


def test_cost_per_million_inferences() -> None:
    # $3.60 an hour at 1,000 inferences/s: 3.6 million an hour, so $1 per million
    assert cost_per_million(3.6, 1000.0) == pytest.approx(1.0)
    assert cost_per_million(None, 1000.0) is None
    assert cost_per_million(3.6, 0.0) is None


def test_endpoint_url_defaults_to_the_protocol_route() -> None:
    assert endpoint_url("http://127.0.0.1:8000", "kserve", "embed", None) == (
        "http://127.0.0.1:8000/v2/models/embed/infer")
    assert endpoint_url("http://127.0.0.1:8000/", "openai", "embed", None) == (
        "http://127.0.0.1:8000/v1/embeddings")
    assert endpoint_url("http://127.0.0.1:7997/embeddings", "openai", "m", None) == (
        "http://127.0.0.1:7997/embeddings")
    with pytest.raises(BenchError):
        endpoint_url("127.0.0.1:8000", "kserve", "embed", None)


def test_named_query_sets_are_the_shipped_real_data() -> None:
    from queryserve.bench.command import QUERY_SETS, _queries

    catalog = read_queries(_queries("catalog"))
    assert len(catalog) == 8788 and catalog[0] == "Sony Turntable - PSLX350H"
    massive = read_queries(_queries("massive"))
    assert len(massive) == 2974
    assert _queries("my/file.txt") == Path("my/file.txt")
    assert set(QUERY_SETS) == {"massive", "catalog"}
