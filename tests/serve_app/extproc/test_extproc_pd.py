"""P/D through the ext_proc door, as llm-d's EPP does it: the pick is the decode pod, and the
prefill pod goes to the decode pod's routing sidecar in `x-prefiller-host-port`; the HTTP door
makes the same decisions on the same deployment (ray_epp/configs/pd.yaml, simulated prefill and
decode pods)."""

from __future__ import annotations

import json
import time

import pytest

from tests.serve_app.deployments import PD_DEBUG
from tests.serve_app.extproc.envoy import stub_for, through_envoy

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LONG = "The quick brown fox studies distributed systems and writes long essays about them. " * 40
PREFILLER = "x-prefiller-host-port"


# The setup of test_pd_e2e.py, which runs after this module (tests/conftest.py: it stops pods).
E2E_SETUP = PD_DEBUG


@pytest.fixture(scope="module")
def stub(gateway):
    channel, stub = stub_for(gateway.ext_proc_address)
    yield stub
    channel.close()


def body(prompt: str) -> bytes:
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 4}).encode()


def name_of(host_port: str, sim) -> str:
    return next(p.name for p in sim.pods if host_port == f"127.0.0.1:{p.port}")


def test_a_long_uncached_prompt_names_its_prefill_pod_for_the_sidecar(stub, sim):
    out = through_envoy(stub, "/v1/completions", body("[ext-proc first] " + LONG))
    assert name_of(out.endpoint, sim).startswith("decode-")
    assert name_of(out.request_set[PREFILLER], sim).startswith("prefill-")
    assert out.status == 200


def test_short_or_cached_prompts_are_decode_only(stub, sim):
    short = through_envoy(stub, "/v1/completions", body("hi"))
    assert name_of(short.endpoint, sim).startswith("decode-") and PREFILLER not in short.request_set
    prompt = "[asked twice] " + LONG
    first = through_envoy(stub, "/v1/completions", body(prompt))
    assert PREFILLER in first.request_set
    time.sleep(0.1)
    again = through_envoy(stub, "/v1/completions", body(prompt))  # the decode pod holds this prefix now
    assert PREFILLER not in again.request_set, (first.endpoint, again.endpoint)


def test_the_http_door_decides_alike(client, stub, sim):
    """The same decision at the HTTP door (sidecar mode there too would name the same prefill pod:
    the decision is the profiles', not the door's)."""
    resp = client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "[http first] " + LONG, "max_tokens": 2},
        headers={"x-epp-debug": "1"},
    )
    assert resp.status_code == 200, resp.text
    trace = json.loads(resp.headers["x-epp-trace"])
    out = through_envoy(stub, "/v1/completions", body("[ext_proc second] " + LONG))
    assert trace["trace"]["pd"]["decision"] == "pd" and PREFILLER in out.request_set
    assert name_of(resp.headers["x-gateway-destination-endpoint"], sim).startswith("decode-")
    assert name_of(out.endpoint, sim).startswith("decode-")


def http_decision(client, sim, prompt: str) -> tuple[str, str]:
    """The HTTP door's P/D decision ("pd" or "decode-only") and decode pod for a prompt."""
    resp = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2}, headers={"x-epp-debug": "1"}
    )
    assert resp.status_code == 200, resp.text
    trace = json.loads(resp.headers["x-epp-trace"])["trace"]
    decode = name_of(resp.headers["x-gateway-destination-endpoint"], sim)
    return trace.get("pd", {}).get("decision", "decode-only"), decode


def ext_proc_decision(stub, sim, prompt: str) -> tuple[str, str]:
    out = through_envoy(stub, "/v1/completions", body(prompt))
    assert out.status == 200
    return ("pd" if PREFILLER in out.request_set else "decode-only"), name_of(out.endpoint, sim)


def test_the_same_request_sequence_gets_the_same_pd_decisions_at_both_doors(client, stub, sim):
    """A long new prompt, a short one, the long one again (its decode pod holds it now), another
    long new one: the same decisions, the repeat on its first decode pod, at either door."""
    doors = {"http": lambda p: http_decision(client, sim, p), "ext_proc": lambda p: ext_proc_decision(stub, sim, p)}
    runs = {}
    for door, decide_at in doors.items():
        first = decide_at(f"[{door} A] " + LONG)
        short = decide_at("hi there")
        time.sleep(0.1)
        again = decide_at(f"[{door} A] " + LONG)
        other = decide_at(f"[{door} B] " + LONG)
        assert again[1] == first[1], (door, first, again)  # prefix affinity of the decode pod
        runs[door] = [first[0], short[0], again[0], other[0]]
    assert runs["http"] == runs["ext_proc"] == ["pd", "decode-only", "decode-only", "pd"], runs
