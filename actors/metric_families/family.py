"""What a metric family is, the label sets families share, and the registry each catalogue module
adds its families to (a name defined twice is an error; a view reads its source's kind and buckets)."""

from __future__ import annotations

from dataclasses import dataclass

GIE = "GIE"
LLMD = "llm-d"
GIE_LLMD = "GIE, llm-d"
OURS = "Ray EPP"

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"


# ---- label sets ---------------------------------------------------------------------------------
MODEL = ("model_name", "target_model_name")
MODEL_FLOW = (*MODEL, "fairness_id", "priority")
POOL = ("name",)
FLOW_KEY = ("fairness_id", "priority", "inference_pool", *MODEL)
PLUGIN = ("plugin_name", "plugin_type")
DECISION = ("plugin_name", "plugin_type", "model_name", "decision_type")


@dataclass(frozen=True, slots=True)
class Family:
    name: str  # as exposed; a counter's ends in _total
    kind: str  # COUNTER, GAUGE or HISTOGRAM
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    origin: str = OURS  # whose name it is: GIE, llm-d, both, or Ray EPP
    view_of: str | None = None  # rendered from this family's samples
    view_labels: tuple[str, ...] | None = None  # the source label each of ours is read from (default: same name)
    where: tuple[tuple[str, str], ...] = ()  # only the source's samples with these label values
    exposed: bool = True


def view(name: str, source: str, help_text: str, labels: tuple[str, ...], origin: str = GIE_LLMD, **kw) -> Family:
    """A family rendered from the registered family `source`: its kind, and its buckets unless given."""
    src = REGISTERED[source]
    fam = Family(name, src.kind, help_text, labels, kw.pop("buckets", src.buckets), origin, source, **kw)
    return fam


REGISTERED: dict[str, Family] = {}


def add_families(*families: Family) -> None:
    """Register families (a catalogue module calls it when imported); a name twice is an error."""
    for fam in families:
        if fam.name in REGISTERED:
            raise ValueError(f"metric family {fam.name} defined twice")
        REGISTERED[fam.name] = fam
