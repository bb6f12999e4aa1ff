"""Which producers a profile runs, and in what order: the keys its plugins consume, each matched to
the plugin that produces it (llm-d's config loader checks consumers against producers alike).

A profile runs the producers it lists and every producer of the config whose keys its plugins
(and those producers, in turn) consume; a producer runs after the producers of the keys it reads,
and after those of the profile that write data it reads when present (`Producer.runs_after`).
A producer that is also a data preparer (the burst producer) reads its keys in `prepare`, before the
rounds, where the request arrives: their producers run there (`preparing_producers`), not in the
profile.
A consumed key that no plugin of the config produces is a config error naming the profile, the
plugin and the key: caught when the config loads, not as a scorer that silently scores zero, unless
the key's producer is a type made when needed (`made_when_needed` on its class: the config then
gets one with its defaults, `made_producers`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from scheduler.data_keys import DataKey
from scheduler.interfaces import DataPreparer, Plugin, Producer
from scheduler.registry import plugin_class


def made_producer_class(name: str) -> type[Producer] | None:
    """The producer type a plugin called `name` that the config does not declare is made of (with
    its defaults): a registered Producer type of that name whose class sets `made_when_needed =
    True` (llm-d creates such a producer when a consumer needs it); else None."""
    cls = plugin_class(name)
    if cls is None or not issubclass(cls, Producer) or getattr(cls, "made_when_needed", False) is not True:
        return None
    return cls


def made_producers(plugins: Iterable[Plugin], declared: Iterable[str]) -> list[str]:
    """The names of the producers to make with their defaults: a key some plugin consumes, that no
    plugin produces, whose producer is not `declared` and is made when needed."""
    plugins, declared = list(plugins), set(declared)
    produced = {key for p in plugins if isinstance(p, Producer) for key in p.produces}
    names: list[str] = []
    for plugin in plugins:
        for key in plugin.consumes:
            name = key.producer
            if key not in produced and name not in declared and name not in names and made_producer_class(name):
                names.append(name)
    return names


def preparing_producers(preparers: Iterable[Plugin], available: Iterable[Plugin]) -> list[Producer]:
    """The producers whose keys the data preparers read (the burst producer: the prompt's tokens),
    dependencies first: they run before the preparers, where the request arrives. The build checked
    that each such key has a producer (`DATA_PREPARATION`)."""
    return profile_producers(DATA_PREPARATION, preparers, [], available, [])


DATA_PREPARATION = ""  # the "profile" of the data preparers, in errors: "data preparers: ..."


def profile_producers(
    profile_name: str, plugins: Iterable[Plugin], listed: list[Producer], available: Iterable[Plugin], errors: list[str]
) -> list[Producer]:
    """The producers profile `profile_name` runs (DATA_PREPARATION: before the data preparers),
    dependencies first; a line in `errors` per consumed key without a producer, or per producer
    that reads its own output through others (a cycle)."""
    where = f"schedulingProfiles {profile_name!r}" if profile_name != DATA_PREPARATION else "data preparers"
    by_key: dict[DataKey[Any], Producer] = {}
    for plugin in [*listed, *available]:
        if isinstance(plugin, Producer):
            for key in plugin.produces:
                by_key.setdefault(key, plugin)
    chosen: list[Producer] = []

    def choose(producer: Producer) -> None:
        if not any(p is producer for p in chosen):
            chosen.append(producer)
            if not reads_in_prepare(producer):
                need(producer)

    def need(consumer: Plugin) -> None:
        for key in consumer.consumes:
            producer = by_key.get(key)
            if producer is None:
                errors.append(
                    f"{where}: plugin {consumer.name!r} (type {consumer.type_name}) "
                    f"reads the data key {str(key)!r}, which no plugin in 'plugins' produces"
                )
            else:
                choose(producer)

    for producer in listed:
        choose(producer)
    for plugin in plugins:
        need(plugin)
    return _in_order(where, chosen, by_key, errors)


def reads_in_prepare(producer: Producer) -> bool:
    """A data preparer reads its keys in `prepare`, before the rounds, not when the profile runs it."""
    return isinstance(producer, DataPreparer)


def _in_order(
    where: str, chosen: list[Producer], by_key: dict[DataKey[Any], Producer], errors: list[str]
) -> list[Producer]:
    """`chosen`, each producer after those it reads (the producers of its `consumes`, then those of
    `chosen` that write what it `runs_after`), otherwise in the order given."""
    ordered: list[Producer] = []
    placing: list[Producer] = []

    def place(producer: Producer) -> None:
        if any(p is producer for p in ordered):
            return
        if any(p is producer for p in placing):
            chain = " -> ".join(p.name for p in [*placing, producer])
            errors.append(f"{where}: producers read each other's keys in a cycle: {chain}")
            return
        placing.append(producer)
        for key in () if reads_in_prepare(producer) else producer.consumes:
            if key in by_key:
                place(by_key[key])
        if producer.runs_after:
            for other in chosen:
                if other is not producer and any(key.name in producer.runs_after for key in other.produces):
                    place(other)
        placing.pop()
        ordered.append(producer)

    for producer in chosen:
        place(producer)
    return ordered
