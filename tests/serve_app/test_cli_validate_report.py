"""`epp validate` shows, for each plugin and section, whether it runs here or is refused and why
(scheduler/config/report.py), on a config that loads and on an llm-d sample that can not."""

from __future__ import annotations

from pathlib import Path

from serve_app.cli.commands import main

REFUSED_DIR = Path(__file__).parents[1] / "fixtures" / "llm-d" / "refused"


def test_epp_validate_shows_the_report(tmp_path, capsys):
    ok = tmp_path / "ok.yaml"
    ok.write_text("featureGates: [haPopulateNonLeaderDatastore]\nplugins:\n- type: queue-scorer\n")
    assert main(["validate", str(ok)]) == 0
    out = capsys.readouterr().out
    assert "# runs      plugin 'queue-scorer' (type queue-scorer): Scorer" in out
    assert "# accepted  featureGates[0] 'haPopulateNonLeaderDatastore': every gateway replica" in out
    assert "kind: EndpointPickerConfig" in out
    routes = [line for line in out.splitlines() if line.startswith("#   POST") or line.startswith("#   any")]
    assert any("/v1/responses:" in r and "previous_response_id" in r for r in routes)
    assert any("/v1/audio/transcriptions" in r and "by load" in r for r in routes)
    assert any(r.startswith("#   any other path") and "404" in r for r in routes)
    assert main(["validate", str(REFUSED_DIR / "sim-epp-gpu-config.yaml")]) == 1
    err = capsys.readouterr().err
    assert "refused  plugin 'dcgm-source' (type dcgm-data-source): it reads GPU metrics" in err
    assert "runs     plugin 'decode-filter' (type decode-filter): Filter" in err
    assert "invalid EndpointPickerConfig" in err
