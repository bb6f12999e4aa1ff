"""The simulator's speech-to-text APIs with the official `openai` SDK: a multipart form in, a text
that is a function of the audio alone (the same on every pod), in each response format, streamed
and not; a form without its file is a 400 naming it."""

from __future__ import annotations

import httpx
import openai
import pytest

from ray_epp.simulator import DEFAULT_MODEL, PodConfig, SimCluster
from ray_epp.simulator.audio_api import transcript

AUDIO = bytes(range(256)) * 8


async def test_transcriptions_and_translations_are_deterministic_per_audio() -> None:
    async with SimCluster([PodConfig(name="a"), PodConfig(name="b")], time_scale=0) as c:
        a, b = (openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="x") for p in c.pods)
        heard = await a.audio.transcriptions.create(model=DEFAULT_MODEL, file=("clip.wav", AUDIO))
        assert heard.text == transcript(AUDIO, "transcribe") == (
            await b.audio.transcriptions.create(model=DEFAULT_MODEL, file=("clip.wav", AUDIO))
        ).text
        other = await a.audio.transcriptions.create(model=DEFAULT_MODEL, file=("clip.wav", AUDIO[:-1]))
        assert other.text != heard.text
        text = await a.audio.transcriptions.create(model=DEFAULT_MODEL, file=("c.wav", AUDIO), response_format="text")
        assert text.strip() == heard.text
        verbose = await a.audio.transcriptions.create(model=DEFAULT_MODEL, file=("c.wav", AUDIO),
                                                      response_format="verbose_json", language="de")  # fmt: skip
        assert verbose.language == "de" and verbose.duration > 0
        translated = await a.audio.translations.create(model=DEFAULT_MODEL, file=("c.wav", AUDIO))
        assert translated.text == transcript(AUDIO, "translate") != heard.text
        stream = await a.audio.transcriptions.create(model=DEFAULT_MODEL, file=("c.wav", AUDIO), stream=True)
        deltas = [e async for e in stream]
        assert deltas  # the SDK's stream events


async def test_a_form_without_its_file_or_a_bad_format_is_a_400_naming_it() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c:
        url = c.pods[0].url + "/v1/audio/transcriptions"
        async with httpx.AsyncClient() as http:
            resp = await http.post(url, files={"model": (None, DEFAULT_MODEL)})  # a form without a file
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "file"
            resp = await http.post(url, data={"model": DEFAULT_MODEL, "response_format": "srt"},
                                   files={"file": ("c.wav", AUDIO)})  # fmt: skip
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "response_format"
            resp = await http.post(url, json={"model": DEFAULT_MODEL})
            assert resp.status_code == 400 and "multipart" in resp.json()["error"]["message"]


@pytest.mark.parametrize("model", ["unknown-model"])
async def test_an_unknown_model_is_a_404(model: str) -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c:
        client = openai.AsyncOpenAI(base_url=c.pods[0].url + "/v1", api_key="x")
        with pytest.raises(openai.NotFoundError):
            await client.audio.transcriptions.create(model=model, file=("c.wav", AUDIO))
