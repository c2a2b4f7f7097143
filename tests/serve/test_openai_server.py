"""vLLM's OpenAI-compatible server, started as the docs tell a user to start it, on a quantized gac output with
factor pairs: completions, streaming, chat, concurrent requests and a bad request's 4xx, over loopback only."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.vllm

START_S = 600  # an engine start on 2 busy cores, bounded
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(vllm, serve_dirs, tmp_path_factory):
    """`python -m vllm.entrypoints.openai.api_server --model DIR` (docs/SERVING.md) on 127.0.0.1; its base URL."""
    model = tmp_path_factory.mktemp("openai") / "structures-w8a8"
    shutil.copytree(serve_dirs["structures-w8a8"], model)
    (model / "chat_template.jinja").write_text(CHAT_TEMPLATE)  # the tiny tokenizer has none of its own
    port = _port()
    log = open(model.parent / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                             "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len",
                             "256", "--enforce-eager"], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if urllib.request.urlopen(f"{url}/health", timeout=5).status == 200:
                    break
            except OSError:
                time.sleep(2)
        else:
            raise AssertionError(f"the server did not come up: {(model.parent / 'server.log').read_text()[-3000:]}")
        yield url, str(model)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_the_openai_server_serves_completions_streams_chat_and_concurrent_requests(server):
    import openai

    url, model = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120)
    done = client.completions.create(model=model, prompt="The list type", max_tokens=8, temperature=0)
    text = done.choices[0].text
    assert done.usage.completion_tokens == 8 and text
    streamed = client.completions.create(model=model, prompt="The list type", max_tokens=8, temperature=0,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == text  # greedy: the same tokens, in pieces
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name a type."}],
                                          max_tokens=8, temperature=0)
    assert chat.choices[0].message.content is not None and chat.usage.completion_tokens == 8
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: client.completions.create(model=model, prompt=f"Topic {i}:", max_tokens=6,
                                                                 temperature=0), range(8)))
    assert [o.usage.completion_tokens for o in outs] == [6] * 8
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="x", max_tokens=-1)
