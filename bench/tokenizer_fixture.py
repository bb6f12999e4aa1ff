"""A real byte-level BPE tokenizer, trained in a moment on a few lines (no download), saved as a
tokenizer.json with a tokenizer_config.json carrying a chat template; and a real HTTP server on
127.0.0.1 answering vLLM's /tokenize with it."""

from __future__ import annotations

import json
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CORPUS = [
    "You are a helpful assistant. Answer the question about the document below.",
    "The quick brown fox jumps over the lazy dog, again and again, in the long system prompt.",
    "Ray EPP routes each request to the pod that holds the most of its prompt in its KV cache.",
] * 20
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def make_tokenizer(directory: Path) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    path = directory / "tokenizer.json"
    tok.save(str(path))
    config = {"chat_template": CHAT_TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return path


_FIXTURE: list[Path] = []


def fixture_tokenizer() -> Path:
    """The bench tokenizer's tokenizer.json, made once per process in a temporary directory (the
    training is deterministic: every process gets the same file)."""
    if not _FIXTURE:
        _FIXTURE.append(make_tokenizer(Path(tempfile.mkdtemp(prefix="epp-bench-tokenizer-"))))
    return _FIXTURE[0]


class TokenizeServer:
    """vLLM's /tokenize with a given tokenizer.json (chat requests rendered with the template, as
    vLLM renders them with the model's). `garbage` makes it answer non-JSON."""

    def __init__(self, tokenizer_json: Path) -> None:
        from scheduler.plugins.support.tokenizer_backends import LocalTokenizer

        local = LocalTokenizer(tokenizer_json)
        server = self
        self.requests: list[dict] = []
        self.garbage = False

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                if self.path != "/tokenize":
                    self.send_response(404)
                    self.end_headers()
                    return
                if "messages" in body:
                    ids = local.encode(local.render_chat(body["messages"]), False)
                else:
                    ids = local.encode(body["prompt"], body.get("add_special_tokens", True))
                out = b"not json" if server.garbage else json.dumps({"tokens": ids, "count": len(ids)}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> TokenizeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
