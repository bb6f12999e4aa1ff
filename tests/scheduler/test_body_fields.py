"""What plugins may read of a request's body (scheduler/body_fields.py): the fields each declares
(with its bases' and those of the plugins it looks up), the union a config sends to profile
actors, and the check that holds a plugin to its declaration (tests/conftest.py turns it on)."""

from __future__ import annotations

import pytest

from scheduler import LLMRequest, Scheduler, build_plugins, load_config, load_config_file
from scheduler.body_fields import (
    CACHE_SALT_FIELDS,
    CHECK_ENV,
    OUTPUT_LIMIT_FIELDS,
    PROMPT_FIELDS,
    CheckedBody,
    UndeclaredBodyField,
    declared_body_fields,
    readable_body_fields,
)
from scheduler.plugins.producers.approx_prefix import ApproxPrefixCacheProducer
from scheduler.plugins.producers.inflight_load_producer import InFlightLoadProducer
from scheduler.plugins.scorers.no_hit_lru import NoHitLRUScorer
from scheduler.plugins.scorers.queue import QueueScorer
from scheduler.plugins.scorers.token_load import TokenLoadScorer
from tests.scheduler.helpers import endpoint

NO_HIT_LRU = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
- type: no-hit-lru-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: no-hit-lru-scorer
  - pluginRef: max-score-picker
"""


def test_a_plugin_declares_its_own_fields_and_its_bases_add_theirs():
    assert declared_body_fields(QueueScorer) == frozenset()
    assert declared_body_fields(ApproxPrefixCacheProducer) == PROMPT_FIELDS | CACHE_SALT_FIELDS
    # the in-flight counts read the prompt and output limits: the mixin that keeps them declares for its
    # producer; token-load-scorer reads what the producer wrote, and no field
    assert declared_body_fields(InFlightLoadProducer) == PROMPT_FIELDS | set(OUTPUT_LIMIT_FIELDS)
    assert declared_body_fields(TokenLoadScorer) == frozenset()


def test_a_plugin_may_read_what_the_plugins_it_looked_up_declare():
    built = build_plugins(load_config(NO_HIT_LRU))
    assert declared_body_fields(NoHitLRUScorer) == frozenset()  # it reads through the producer
    assert built.body_fields == PROMPT_FIELDS | CACHE_SALT_FIELDS
    scheduler = Scheduler(built.handler, built.profiles, built.plugins)
    body = {"model": "m", "prompt": "a prompt " * 40, "cache_salt": "s", "temperature": 0.1}
    scheduler.schedule(LLMRequest("r", "m", body), [endpoint("a"), endpoint("b")])  # no UndeclaredBodyField

    plugins = {"a": QueueScorer(), "b": QueueScorer(), "producer": ApproxPrefixCacheProducer(), "alone": QueueScorer()}
    readable = readable_body_fields(plugins, {"a": ["b"], "b": ["a", "producer"]})  # through any depth, a circle too
    prefix = PROMPT_FIELDS | CACHE_SALT_FIELDS
    assert readable == {"a": prefix, "b": prefix, "producer": prefix, "alone": set()}


def test_a_configs_union_is_what_crosses_to_a_profile_actor():
    req = LLMRequest("r", "m", {"model": "m", "messages": [], "max_tokens": 4, "tools": []}, {"h": "v"}, priority=-1)
    req.excluded_endpoints = frozenset({"a"})
    sent = req.with_body_fields(build_plugins(load_config_file("slo")).body_fields)
    assert sent.body == {"messages": [], "max_tokens": 4}  # the SLO plugins estimate output by max_tokens
    assert (sent.request_id, sent.target_model, sent.headers, sent.priority) == ("r", "m", {"h": "v"}, -1)
    assert (sent.received_at, sent.excluded_endpoints) == (req.received_at, frozenset({"a"}))
    assert req.without_body().body == {} and req.without_body().headers == {"h": "v"}


def test_a_checked_body_refuses_every_undeclared_field_whether_or_not_it_is_there():
    body = CheckedBody({"prompt": "p", "user": "u"}, frozenset({"prompt", "max_tokens"}), "plugin 'x'")
    assert body["prompt"] == "p" and body.get("max_tokens") is None and "max_tokens" not in body
    assert dict(body) == {"prompt": "p"} and list(body) == ["prompt"]
    for read in (lambda: body["user"], lambda: body.get("seed"), lambda: "user" in body):
        with pytest.raises(UndeclaredBodyField, match="plugin 'x' reads the body field"):
            read()
    try:  # a plugin's own `except KeyError` does not hide it
        body["user"]
    except KeyError:
        pytest.fail("an undeclared read must not be a KeyError")
    except UndeclaredBodyField:
        pass


def test_unchecked_plugins_get_the_request_itself(monkeypatch):
    monkeypatch.setenv(CHECK_ENV, "0")
    built = build_plugins(load_config(NO_HIT_LRU))
    assert "score" not in vars(built.plugins["no-hit-lru-scorer"])  # no wrapper: the class's method
    monkeypatch.setenv(CHECK_ENV, "1")
    assert "score" in vars(build_plugins(load_config(NO_HIT_LRU)).plugins["no-hit-lru-scorer"])
