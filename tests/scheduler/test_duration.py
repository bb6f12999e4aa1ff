"""Go duration strings (metav1.Duration in GIE configs) to seconds."""

import pytest

from scheduler.duration import duration_seconds, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("200ms", 0.2),
        ("0", 0.0),
        ("1s", 1.0),
        ("1.5s", 1.5),
        (".5s", 0.5),
        ("1m30s", 90.0),
        ("2h", 7200.0),
        ("1h2m3s4ms", 3723.004),
        ("100us", 1e-4),
        ("100\u00b5s", 1e-4),
        ("250ns", 2.5e-7),
        ("-1s", -1.0),
        ("+3ms", 0.003),
    ],
)
def test_parse(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "200", "ms", "1d", "1 s", "s1", "1.2.3s", "-"])
def test_rejects(text):
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize(("value", "fragment"), [(0.2, "unit"), (5, "unit"), (True, "string"), (None, "string")])
def test_validator_refuses_non_strings(value, fragment):
    with pytest.raises(ValueError, match=fragment):
        duration_seconds(value)
