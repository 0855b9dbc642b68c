"""A representative set of every frame kind, as the wire of commit 157528f wrote them.

`RECORDED` names each frame; tests/workers/switch/fixtures/wire-157528f.json holds the bytes that commit's
encoder wrote for it (hex), recorded before the protocol module was split, so that the
byte-identical wire is checked against what was, not against what the code says now.
Regenerate only for a deliberate change of the wire (and bump VERSION):
`PYTHONPATH=. python tests/workers/switch/recorded_wire.py > tests/workers/switch/fixtures/...`.
"""

from __future__ import annotations

import json
import sys

from workers.switch import protocol as p

RECORDED: dict[str, p.Frame] = {
    "hello-send": p.Hello(
        token="eyJhbGciOiJFZERTQSJ9.eyJqb2IiOiJqLTEifQ.c2ln",
        job_id="job-1",
        role="generator",
        peer_role="discriminator",
        direction=p.Direction.SEND,
    ),
    "hello-recv-unicode": p.Hello(
        token="",
        job_id="jöb-ü",
        role="r\u00e9le",
        peer_role="\u65e5\u672c",
        direction=p.Direction.RECV,
    ),
    "peer-hello-default": p.PeerHello(cluster="alpha"),
    "peer-hello-resume": p.PeerHello(cluster="beta", session="0123abcd4567ef89", resume_from=2**40),
    "welcome": p.Welcome(),
    "data-raw-empty": p.Data("job-1", "main", 0, "a", "b", b""),
    "data-raw": p.Data("job-1", "grad", 7, "decoder", "encoder", bytes(range(256)) * 3),
    "data-small": p.Data("j", "sync", 2**63 - 1, "s", "d", b"0123456789abcdef"),
    "data-tensor": p.Data(
        "job-2",
        "acts",
        41,
        "encoder",
        "decoder",
        bytes(range(24)),
        p.TensorSpec(dtype="float32", shape=(2, 3)),
    ),
    "data-tensor-scalar": p.Data(
        "job-2", "loss", 1, "d", "e", b"\x00" * 8, p.TensorSpec(dtype="float64", shape=())
    ),
    "data-tensor-codec": p.Data(
        "job-3",
        "acts",
        3,
        "encoder",
        "decoder",
        b"\x01\x02\x03\x04\x05",
        p.TensorSpec(
            dtype="bfloat16",
            shape=(4, 1024),
            codec="topk",
            codec_params={"k": 64, "scale": 0.5, "name": "x", "nested": {"a": [1, 2]}},
        ),
    ),
    "ack": p.Ack(count=12),
    "ack-zero": p.Ack(count=0),
    "ack-ping": p.Ack(count=2**40, ping=9),
    "error": p.Error(reason="job token: expired"),
    "error-unicode": p.Error(reason='r\u00e9fus\u00e9 \u2014 "quoted" \\ back'),
    "receipt": p.Receipt("job-1", "b", "a", 17),
    "receipt-resend": p.Receipt("job-1", "b", "a", 0, resend=True),
    "ping": p.Ping(id=1),
    "ping-large": p.Ping(id=2**62),
    "link": p.LinkReport(bandwidth_bytes_per_s=123456789.5, rtt_s=0.00042, samples=17),
    "link-int": p.LinkReport(bandwidth_bytes_per_s=0.0, rtt_s=1.0, samples=0),
}


def record() -> dict[str, str]:
    """Each recorded frame's bytes from this checkout's encoder, as hex."""
    return {name: b"".join(p.encode(frame)).hex() for name, frame in RECORDED.items()}


if __name__ == "__main__":
    json.dump(record(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
